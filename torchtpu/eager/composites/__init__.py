"""Kernels on torch tensors that orchestrate lowerings: they run a lowering of ops/ through
the executor after what no traced program can do (read a mask's true count or a rank on the
host, pick an operand by its strides, copy running statistics back, fall back to CPU where
XLA has no solver), one module per ops/ family. ops/ stays pure JAX; these register with
ops.registry.kernel like any hand-written kernel, and importing this package (eager/kernels
does, before it registers the table) fills KERNELS."""
from . import amp, batch_norm, foreach, indexing, linalg  # noqa: F401
