"""Custom kernels as PyTorch ops: JAX functions, Pallas, Tokamax and Helion kernels
(torchtpu.jax_op), and zero-copy interop with JAX (torchtpu.to_jax / from_jax)."""
from .jax_op import register as jax_op  # noqa: F401
from .interop import from_jax, to_jax  # noqa: F401
from . import interop as _interop

_interop.install()
