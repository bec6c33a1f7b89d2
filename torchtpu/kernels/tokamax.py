"""Tokamax kernels (PyPI `tokamax`, the `kernels` extra) as torch ops through jax_op, with
PyTorch's argument conventions, so they drop in where the PyTorch functions were:

    from torchtpu.kernels import tokamax as tk
    out = tk.attention(q, k, v, is_causal=True)      # like F.scaled_dot_product_attention
    y = tk.rms_norm(x, weight, eps=1e-6)             # like F.rms_norm over the last dim
    y = tk.layer_norm(x, weight, bias, eps=1e-5)     # like F.layer_norm over the last dim
    y = tk.swiglu(x, w_gate, w_up)                   # F.silu(x @ w_gate) * (x @ w_up)

Gradients come from Tokamax's own vjps. On a TPU or GPU Tokamax picks its Pallas kernels;
on XLA:CPU (no Pallas backend compiles there) its "xla" implementations run.
Each op is registered on first use; importing this module needs tokamax installed.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

import tokamax  # noqa: F401 - fail at import when the extra is absent
from absl import flags as _absl_flags

from .jax_op import register

# Tokamax reads its options as absl flags and, on first use, parses sys.argv for them:
# the host program's own arguments (pytest -q, argparse options) then fail as unknown
# absl flags. Its flags keep their defaults (tokamax.config still overrides them).
if not _absl_flags.FLAGS.is_parsed():
    _absl_flags.FLAGS.mark_as_parsed()


def _implementation():
    from ..runtime.jaxenv import platform

    return "xla" if platform() == "cpu" else None


def _attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None = None,
               bias: jax.Array | None = None, scale: float | None = None, is_causal: bool = False) -> jax.Array:
    # PyTorch's (batch, heads, length, dim) is Tokamax's (batch, length, heads, dim)
    q, k, v = (jnp.swapaxes(t, -3, -2) for t in (query, key, value))
    out = tokamax.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                        implementation=_implementation())
    return jnp.swapaxes(out, -3, -2)


def _norm(x: jax.Array, weight: jax.Array | None = None, bias: jax.Array | None = None, eps: float = 1e-5,
          subtract_mean: bool = True) -> jax.Array:
    return tokamax.layer_norm(x, weight, bias, axis=-1, epsilon=eps, subtract_mean=subtract_mean,
                              implementation=_implementation())


def _swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array) -> jax.Array:
    return tokamax.gated_linear_unit(x, (w_gate, w_up), activation=jax.nn.swish,
                                     implementation=_implementation())


@functools.cache
def _op(name: str):
    fn = {"attention": _attention, "norm": _norm, "swiglu": _swiglu}[name]
    return register(f"tokamax::{name}", fn, probe=False)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
              *, is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Tokamax's dot-product attention with F.scaled_dot_product_attention's arguments:
    (batch, heads, length, dim) tensors, a bool mask (True: attend) or a float mask added to
    the scores, a causal mask aligned top-left."""
    mask = bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = attn_mask
        else:
            bias = attn_mask
    return _op("attention")(query, key, value, mask, bias, scale, is_causal)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Tokamax's layer norm over the last dim (F.layer_norm(x, x.shape[-1:], weight, bias, eps))."""
    return _op("norm")(x, weight, bias, eps, True)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Tokamax's RMS norm over the last dim (F.rms_norm(x, x.shape[-1:], weight, eps))."""
    return _op("norm")(x, weight, None, eps, False)


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """Tokamax's gated linear unit with SiLU: F.silu(x @ w_gate) * (x @ w_up); weights (in, out)."""
    return _op("swiglu")(x, w_gate, w_up)
