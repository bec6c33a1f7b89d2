"""ATen -> JAX lowerings, one module per op family. Importing this fills the table."""
from . import (  # noqa: F401
    factories,
    foreach,
    indexing,
    linalg,
    losses,
    memory,
    nn,
    pointwise,
    random,
    reductions,
    shape,
)
from .registry import KERNELS, LOWERINGS, kernel, lower  # noqa: F401
