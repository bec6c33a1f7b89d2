"""torchtpu: a native PyTorch backend for XLA devices.

    import torch, torchtpu
    model = model.to("tpu")

Device tensors are plain torch.Tensors; JAX (through PJRT) runs them on a TPU
where one exists, else a GPU, else the host CPU.
"""
from __future__ import annotations

from .runtime import jaxenv as _jaxenv  # configures JAX first (x64)
from .device import registration as _registration

_registration.register()

from . import ops as _ops  # noqa: E402
from .eager import fallback as _fallback  # noqa: E402
from .eager import kernels as _kernels  # noqa: E402
from . import metrics as _metrics  # noqa: E402

_kernels.register_runtime()
_kernels.register_kernels()
_kernels.register_lowerings()

__version__ = "0.1.0"


def metrics() -> dict:
    """Counters since start (or the last reset_metrics()).

    Keys: compiles, cache_hits, executions, transfers_to_device / bytes_to_device,
    transfers_to_host / bytes_to_host, cpu_fallbacks, and fallback_ops
    (a dict: ATen overload name -> number of CPU fallbacks).
    """
    return _metrics.snapshot()


def reset_metrics() -> None:
    """Zero every counter in metrics()."""
    _metrics.reset()


def set_fallback(enabled: bool) -> None:
    """Allow (True, the default) or forbid the CPU fallback for ops with no tpu lowering.

    Forbidden, such an op raises NotImplementedError naming the overload.
    The environment variable TORCHTPU_FALLBACK=0 sets the same at import.
    """
    _fallback.set_enabled(enabled)


def fallback_enabled() -> bool:
    return _fallback.enabled()


def platform() -> str:
    """The XLA platform behind "tpu": 'tpu', 'gpu' or 'cpu'."""
    return _jaxenv.platform()


def lowered_ops() -> list[str]:
    """ATen overloads with a native tpu kernel (lowerings and their generated variants)."""
    return sorted(_kernels.SERVED)


__all__ = [
    "metrics",
    "reset_metrics",
    "set_fallback",
    "fallback_enabled",
    "platform",
    "lowered_ops",
]
