"""Fused scaled dot-product attention.

PyTorch picks a fused attention kernel per device through a C++ dispatch stub that a
Python backend cannot fill, so on "tpu" `F.scaled_dot_product_attention` used to take
its math path: scale, matmul, mask, softmax, matmul, each its own op (and its own
executable per KV-cache length while decoding), and about twice that in backward.
Here it is served at the autograd key by one forward and one backward op: the CPU
flash-attention pair `_scaled_dot_product_flash_attention_for_cpu(_backward)`, whose
derivative formula PyTorch already has, lowered below to one XLA program each.
torch.compile's traces (fake and functional tensors) get the same pair: a compiled graph
holds one attention op, whose lowering and dynamism rule are eager's. Grouped-query heads
(enable_gqa) are served by it too: a maskless call packs each key/value head's queries as
rows of one head, any other repeats each key/value head for its queries first, as
PyTorch's composite does. Calls this pair cannot express (dropout, a mask that needs a
gradient, tensor subclasses such as DTensor) take PyTorch's own composite, as before.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from ._common import opmath_dtype as _opmath
from .registry import autograd_kernel, lower


def _scores(q, k, is_causal, attn_mask, scale):
    """q k^T * scale with the masks applied (masked: -inf), in PyTorch's opmath dtype
    (float32 for half precision, as its math path), and the scale used."""
    acc = _opmath(q.dtype)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...le,...se->...ls", q.astype(acc), k.astype(acc)) * jnp.asarray(s, acc)
    L, S = scores.shape[-2], scores.shape[-1]
    neg = jnp.asarray(-jnp.inf, acc)
    if is_causal:
        keep = jnp.tril(jnp.ones((L, S), bool))  # top-left aligned, as PyTorch's
        scores = jnp.where(keep, scores, neg)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, neg)
        else:
            scores = scores + attn_mask.astype(acc)
    return scores, s


def _probs_from_lse(scores, lse):
    """exp(scores - logsumexp); rows every key is masked out of (lse -inf) give 0, as
    PyTorch's _safe_softmax."""
    finite = jnp.isfinite(lse)[..., None]
    return jnp.where(finite, jnp.exp(scores - jnp.where(finite, lse[..., None], 0)), 0).astype(scores.dtype)


def _check(q, k, v, dropout_p):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise RuntimeError(
            "_scaled_dot_product_flash_attention_for_cpu: expected 4-D query, key and value "
            f"(batch, heads, length, dim), got {q.ndim}-D, {k.ndim}-D and {v.ndim}-D"
        )
    if dropout_p:
        raise NotImplementedError(
            "_scaled_dot_product_flash_attention_for_cpu on tpu: dropout_p > 0 is not supported "
            "(F.scaled_dot_product_attention with dropout takes PyTorch's math path)"
        )


@lower("_scaled_dot_product_flash_attention_for_cpu")
def sdpa_forward(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _check(query, key, value, dropout_p)
    scores, _ = _scores(query, key, is_causal, attn_mask, scale)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(scores - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    seen = total > 0  # rows every key is masked out of: probabilities 0, log-sum-exp -inf
    safe = jnp.where(seen, total, 1)
    p = jnp.where(seen, e / safe, 0).astype(scores.dtype)
    lse = jnp.where(seen, jnp.log(safe) + m, -jnp.inf)[..., 0]
    out = jnp.einsum("...ls,...se->...le", p, value.astype(p.dtype))
    # log-sum-exp in the opmath dtype, as CPU's kernel returns it (float64 for double: the
    # backward rebuilds the probabilities from it)
    return out.astype(query.dtype), lse.astype(_opmath(query.dtype))


@lower("_scaled_dot_product_flash_attention_for_cpu_backward")
def sdpa_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                  scale=None):
    _check(query, key, value, dropout_p)
    scores, s = _scores(query, key, is_causal, attn_mask, scale)
    # the forward's probabilities again, from its log-sum-exp (no second max and sum)
    p = _probs_from_lse(scores, logsumexp.astype(scores.dtype))
    acc = p.dtype
    g = grad_out.astype(acc)
    dv = jnp.einsum("...ls,...le->...se", p, g)
    dp = jnp.einsum("...le,...se->...ls", g, value.astype(acc))
    # softmax backward: the row sums of p * dp equal those of grad_out * out
    rows = jnp.sum(g * out.astype(acc), axis=-1, keepdims=True)
    ds = p * (dp - rows) * jnp.asarray(s, acc)
    dq = jnp.einsum("...ls,...se->...le", ds, key.astype(acc))
    dk = jnp.einsum("...ls,...le->...se", ds, query.astype(acc))
    return dq.astype(query.dtype), dk.astype(key.dtype), dv.astype(value.dtype)


_sdpa = torch.ops.aten.scaled_dot_product_attention.default
_fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
# The tensors torch.compile traces with: the fused op has PyTorch's fake kernel and
# derivative, so a compiled graph gets one attention op (and one in backward), not the
# math path's expand, clone, bmm and softmax, whose copy of a growing KV cache would
# run on its true sizes (one program per length). Other subclasses take the composite.
_TRACING = ("FakeTensor", "FunctionalTensor")


def _plain(t) -> bool:
    return type(t) is torch.Tensor or type(t).__name__ in _TRACING


def _fusable(query, key, value, attn_mask, dropout_p, is_causal) -> bool:
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    if not all(_plain(t) for t in tensors):
        return False  # DTensor and other subclasses
    if dropout_p or query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if not (query.dtype == key.dtype == value.dtype) or not query.dtype.is_floating_point:
        return False  # the composite raises PyTorch's own error
    if query.shape[1] != key.shape[1] or key.shape[1] != value.shape[1] or query.shape[-1] != key.shape[-1]:
        return False  # grouped-query heads (enable_gqa) and bad shapes: the composite
    if value.shape[-1] != query.shape[-1] and type(query) is not torch.Tensor:
        return False  # PyTorch's fake kernel gives the output query's head dim (MLA's value is narrower)
    if attn_mask is not None and (is_causal or attn_mask.requires_grad or attn_mask.dim() > 4
                                  or attn_mask.dtype not in (torch.bool, query.dtype)):
        return False  # (a mask of another float dtype: the composite's rules, or its error)
    return True


def _packable_gqa(query, key, value, attn_mask, dropout_p, is_causal) -> bool:
    if attn_mask is not None or is_causal or dropout_p or not _plain(query):
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    hq, g = query.shape[1], key.shape[1]
    return g != hq and g > 0 and hq % g == 0 and value.shape[1] == g and query.shape[0] == key.shape[0]


def _repeatable_gqa(query, key, value) -> bool:
    if not (_plain(query) and _plain(key) and _plain(value)) or query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    hq, g = query.shape[1], key.shape[1]
    return g != hq and g > 0 and hq % g == 0 and value.shape[1] == g


@autograd_kernel("scaled_dot_product_attention")
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                                 scale=None, enable_gqa=False):
    if enable_gqa and _packable_gqa(query, key, value, attn_mask, dropout_p, is_causal):
        # grouped-query heads without a mask: each key/value head's queries as rows of one
        # head (rows are independent), so the fused op serves it (decoding with
        # Transformers' DynamicCache passes enable_gqa and no mask)
        b, hq, length, e = query.shape
        g = key.shape[1]
        out = scaled_dot_product_attention(query.reshape(b, g, hq // g * length, e), key, value, scale=scale)
        return out.reshape(b, hq, length, value.shape[-1])
    if enable_gqa and _repeatable_gqa(query, key, value):
        # the rest of grouped-query attention (a causal or masked prefill, training): each
        # key/value head repeated for its queries, as PyTorch's composite does, then the fused
        # op forward and backward instead of the math path (and its (L, S) causal mask)
        r = query.shape[1] // key.shape[1]
        key, value, enable_gqa = key.repeat_interleave(r, 1), value.repeat_interleave(r, 1), False
    if not _fusable(query, key, value, attn_mask, dropout_p, is_causal):
        return _sdpa.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                               enable_gqa=enable_gqa)
    return _fused(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
