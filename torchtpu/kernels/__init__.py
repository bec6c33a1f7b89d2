"""Custom kernels as PyTorch ops: JAX functions, Pallas, Tokamax and Helion kernels
(torchtpu.jax_op), and zero-copy interop with JAX (torchtpu.to_jax / from_jax)."""
from .jax_op import register as jax_op  # noqa: F401
