"""ATen -> JAX lowerings, one module per op family. Importing this fills the table."""
from . import memory, pointwise  # noqa: F401
from .registry import LOWERINGS, lower  # noqa: F401
