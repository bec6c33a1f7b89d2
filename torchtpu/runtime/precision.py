"""How float32 matmuls and convolutions are computed: torch's setting, mapped to XLA's.

`torch.set_float32_matmul_precision` (and `torch.backends.cuda.matmul.allow_tf32`,
which sets the same value) chooses the precision of float32 dot products; on tpu it
becomes XLA's precision config of every dot_general and convolution:

    "highest" (PyTorch's default) -> HIGHEST: full float32 (6 bf16 passes on a TPU)
    "high"                        -> HIGH:    3 bf16 passes (bf16_3x), about TF32's accuracy
    "medium"                      -> DEFAULT: one bf16 pass, the TPU's fastest

The lowerings pass no `precision=` of their own, so JAX's `jax_default_matmul_precision`
decides; it is process-wide (backward runs on another thread) and part of every
jax.jit's cache key, so a changed setting traces and compiles anew instead of
reusing an executable built for the old one. The executors call `sync` before they
trace or run anything. On XLA:CPU the setting has no numeric effect.
"""
from __future__ import annotations

import jax
import torch

TO_JAX = {"highest": "highest", "high": "high", "medium": "default"}

_applied: list = [None]


def current() -> str:
    """torch's float32 matmul precision now: "highest", "high" or "medium"."""
    return torch.get_float32_matmul_precision()


def sync(on_change=None) -> None:
    """Make JAX's default matmul precision follow torch's; `on_change()` runs first when
    it changed (the deferred executor flushes work recorded under the old setting)."""
    p = torch.get_float32_matmul_precision()
    if p == _applied[0]:
        return
    # marked first: work run by on_change() (a flush) sees no change and keeps the old config
    old, _applied[0] = _applied[0], p
    if on_change is not None and old is not None:
        on_change()
    jax.config.update("jax_default_matmul_precision", TO_JAX.get(p, "highest"))
