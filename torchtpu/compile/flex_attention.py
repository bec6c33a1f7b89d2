"""FlexAttention (torch.nn.attention.flex_attention) on tpu.

Eager modes run PyTorch's own dense implementation of the flex_attention higher-order
op (the score matrix, score_mod and mask_mod vmapped over it) op by op, like its CPU
path. Compiled graphs hold the op itself, with score_mod and mask_mod as ATen
subgraphs: it is lowered here to the same dense computation in one piece of the
program (the mask and score modifications evaluated over the whole (b, h, q, kv) grid
with jax.vmap of the subgraphs), and its backward is the vector-Jacobian product of
that computation (jax.vjp), so no joint graph is needed. Like PyTorch's reference
the block mask's sparsity only saves work: the result is defined by mask_mod.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

from ..runtime.jaxenv import to_jax_dtype

_LN2 = math.log(2.0)


def allow_tpu() -> None:
    """Let flex_attention take tpu tensors. PyTorch's device check is a closed set of
    device names inside torch.nn.attention.flex_attention._validate_device; its copy with
    "tpu" added stays PyTorch code, so Dynamo still traces through it (a function of ours
    would be a graph break). Without the expected constant nothing is changed."""
    import torch.nn.attention.flex_attention as fa

    fn = fa._validate_device
    code = fn.__code__
    consts = code.co_consts
    pos = [i for i, c in enumerate(consts) if isinstance(c, frozenset) and "cuda" in c]
    if len(pos) != 1 or "tpu" in consts[pos[0]]:
        return
    new = list(consts)
    new[pos[0]] = consts[pos[0]] | {"tpu"}
    patched = type(fn)(code.replace(co_consts=tuple(new)), fn.__globals__, fn.__name__,
                       fn.__defaults__, fn.__closure__)
    patched.__doc__ = fn.__doc__
    patched.__wrapped__ = fn
    fa._validate_device = patched


def _grid_mod(sub, n_bufs, shape, index_dtypes):
    """sub(x, b, h, q_idx, kv_idx, *bufs) over the whole (B, H, M, N) grid, for x a
    (B, H, M, N) score (score_mod) or None (mask_mod): one jax.vmap per grid axis."""
    idx = [jnp.arange(n, dtype=dt) for n, dt in zip(shape, index_dtypes)]

    def one(*args):
        # outputs only: checks inside a score/mask mod would be flags batched over the
        # vmapped grid, so they keep XLA's semantics (as associative_scan's combine)
        return sub(list(args), None)[0][0]

    def over(score, bufs):
        lead = () if score is None else (score,)
        g = one
        for d in (3, 2, 1, 0):  # innermost first: the score loses one leading axis per level
            axes = ([0] if score is not None else []) + [0 if j == d else None for j in range(4)]
            g = jax.vmap(g, in_axes=tuple(axes + [None] * n_bufs))
        return g(*lead, *idx, *bufs)

    return over


def _index_dtypes(sub, offset):
    vals = sub.in_vals[offset:offset + 4]
    return [to_jax_dtype(v.dtype) if isinstance(v, torch.Tensor) else jnp.int32 for v in vals]


def _dense(hop, q, k, v, score_mod, block_mask, scale, score_bufs, mask_bufs):
    """(out, lse, max) of PyTorch's math_attention, in the working precision."""
    work = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    g = q.shape[1] // k.shape[1]
    if g > 1:  # grouped-query heads
        k = jnp.repeat(k, g, axis=1)
        v = jnp.repeat(v, g, axis=1)
    B = q.shape[0]
    k = jnp.broadcast_to(k, (B,) + k.shape[1:])
    v = jnp.broadcast_to(v, (B,) + v.shape[1:])
    scores = jnp.einsum("bhmd,bhnd->bhmn", q.astype(work), k.astype(work)) * scale
    shape = scores.shape
    smod, mmod = hop.sub(score_mod), hop.sub(block_mask[-1])
    sm = _grid_mod(smod, len(score_bufs), shape, _index_dtypes(smod, 1))
    mm = _grid_mod(mmod, len(mask_bufs), shape, _index_dtypes(mmod, 0))
    keep = mm(None, list(mask_bufs)).astype(jnp.bool_)
    post = jnp.where(keep, sm(scores.astype(work), list(score_bufs)).astype(work), -jnp.inf)
    dead = jnp.all(~keep, axis=-1)  # a fully masked row: output 0, lse -inf
    safe = jnp.where(dead[..., None], 0.0, post)
    lse = jnp.where(dead, -jnp.inf, jax.nn.logsumexp(safe, axis=-1))
    mx = jnp.where(dead, -jnp.inf, jnp.max(safe, axis=-1))
    p = jnp.where(dead[..., None], 0.0, jax.nn.softmax(safe, axis=-1))
    out = jnp.einsum("bhmn,bhnd->bhmd", p.astype(q.dtype), v.astype(q.dtype))
    return out, lse, mx


def _like(x, val):
    if not isinstance(val, torch.Tensor):
        return x
    dt = to_jax_dtype(val.dtype)
    if x is None or math.prod(val.shape) == 0 or x.shape != tuple(val.shape):
        return jnp.zeros(tuple(val.shape), dt)
    return x.astype(dt)


def _forward(hop, key, query, key_, value, score_mod, block_mask, scale, kernel_options,
             score_mod_other_buffers=(), mask_mod_other_buffers=()):
    out, lse, mx = _dense(hop, query, key_, value, score_mod, block_mask, scale,
                          score_mod_other_buffers, mask_mod_other_buffers)
    # the statistics leave in log2 units, as PyTorch's kernels return them
    vals = hop.node.meta.get("val")
    return [_like(x, v) for x, v in zip((out, lse / _LN2, mx / _LN2), vals)]


def _backward(hop, key, query, key_, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph,
              joint_graph, block_mask, scale, kernel_options, score_mod_other_buffers=(),
              mask_mod_other_buffers=()):
    vals = hop.node.meta.get("val")
    buf_vals = list(vals[3]) if len(vals) > 3 else []
    diff = [i for i, b in enumerate(score_mod_other_buffers)
            if i < len(buf_vals) and isinstance(buf_vals[i], torch.Tensor)]
    bufs = list(score_mod_other_buffers)

    def f(q, k, v, dbufs):
        sb = list(bufs)
        for i, b in zip(diff, dbufs):
            sb[i] = b
        o, lse, _ = _dense(hop, q, k, v, fw_graph, block_mask, scale, sb, mask_mod_other_buffers)
        return o, lse / _LN2

    primal_out, vjp = jax.vjp(f, query, key_, value, [bufs[i] for i in diff])
    go = jnp.zeros_like(primal_out[0]) if grad_out is None else grad_out.astype(primal_out[0].dtype)
    gl = jnp.zeros_like(primal_out[1]) if grad_logsumexp is None else grad_logsumexp.astype(primal_out[1].dtype)
    gl = jnp.where(jnp.isfinite(primal_out[1]), gl, 0.0)
    dq, dk, dv, dbufs = vjp((go, gl))
    grads = [None] * len(buf_vals)
    for i, g in zip(diff, dbufs):
        grads[i] = _like(g, buf_vals[i])
    return [_like(dq, vals[0]), _like(dk, vals[1]), _like(dv, vals[2]), tuple(grads)]


LOWERINGS = {
    flex_attention: _forward,
    flex_attention_backward: _backward,
}
