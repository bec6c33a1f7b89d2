"""ATen -> JAX lowerings, one module per op family. Importing this fills the table."""
from . import (  # noqa: F401
    amp,
    asserts,
    attention,
    factories,
    fft,
    foreach,
    grouped_mm,
    growth,
    indexing,
    linalg,
    losses,
    low_precision,
    memory,
    nn,
    nn_extra,
    pointwise,
    random,
    reductions,
    shape,
    special,
)
from .registry import AUTOGRAD_KERNELS, KERNELS, LOWERINGS, autograd_kernel, kernel, lower  # noqa: F401
