"""torch.tpu.amp: torch.cuda.amp's deprecated names for the tpu device, so code written
against `torch.cuda.amp` runs with "cuda" changed to "tpu". Each is torch.amp's own with
device "tpu" and warns as torch.cuda.amp's does (FutureWarning, naming the torch.amp call
that replaces it)."""
from __future__ import annotations

import functools
import warnings

import torch

__all__ = ["autocast", "custom_fwd", "custom_bwd", "GradScaler"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`torch.tpu.amp.{old}` is deprecated. Please use `{new}` instead.", FutureWarning, stacklevel=3)


class autocast(torch.amp.autocast_mode.autocast):
    """torch.autocast("tpu", ...) under torch.cuda.amp.autocast's signature and defaults."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        _deprecated("autocast(args...)", "torch.amp.autocast('tpu', args...)")
        super().__init__("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """torch.amp.custom_fwd(device_type="tpu")."""
    _deprecated("custom_fwd(args...)", "torch.amp.custom_fwd(args..., device_type='tpu')")
    if fwd is None:
        return functools.partial(torch.amp.custom_fwd, device_type="tpu", cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """torch.amp.custom_bwd(device_type="tpu")."""
    _deprecated("custom_bwd(args...)", "torch.amp.custom_bwd(args..., device_type='tpu')")
    return torch.amp.custom_bwd(bwd, device_type="tpu")


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler("tpu", ...) under torch.cuda.amp.GradScaler's signature."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        _deprecated("GradScaler(args...)", "torch.amp.GradScaler('tpu', args...)")
        super().__init__("tpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
