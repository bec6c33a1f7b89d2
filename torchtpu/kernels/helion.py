"""Helion kernels (PyPI `helion`, the `kernels` extra) as torch ops on "tpu".

A `@helion.kernel` built for Helion's Pallas backend exports itself as a pure JAX function
(`kernel.jax_fn`, its `helion/runtime/pallas/jax_export.py`); `helion_op` registers that
function through jax_op under the kernel's own torch signature, so the kernel runs inside
torchtpu's programs on tpu tensors (strict, defer_and_fuse, torch.compile). On XLA:CPU the
kernel must be built with `pallas_interpret=True` (Helion then emits an interpretable
pallas_call, which jax_op runs in Pallas's interpret mode).

    @helion.kernel(backend="pallas", pallas_interpret=True, config=helion.Config(block_sizes=[8, 8]))
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...
    add_tpu = helion_op("mylib::helion_add", add)
    z = add_tpu(x.to("tpu"), y.to("tpu"))

Helion kernels have no JAX derivative rule: gradients need a jax.custom_vjp around them.
"""
from __future__ import annotations

import functools

from .jax_op import register


def helion_op(name: str, kernel, *, num_outputs: int | None = None):
    """Register Helion kernel `kernel` (Pallas backend) as the torch op `name`."""
    settings = getattr(kernel, "settings", None)
    backend = getattr(settings, "backend", None)
    if backend is not None and backend != "pallas":
        raise ValueError(
            f"torchtpu.kernels.helion_op({name!r}): the kernel is built for Helion's {backend!r} backend; "
            "build it with backend='pallas' (HELION_BACKEND=pallas) to run it as a JAX function"
        )

    @functools.wraps(kernel.fn)
    def fn(*args, **kwargs):
        return kernel.jax_fn(*args, **kwargs)

    fn.__annotations__ = {k: v for k, v in getattr(kernel.fn, "__annotations__", {}).items() if k != "return"}
    return register(name, fn, num_outputs=num_outputs, probe=False)
