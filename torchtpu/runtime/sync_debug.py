"""torch.tpu.set_sync_debug_mode: warn or raise where an op makes the host wait for the device.

As torch.cuda's: mode 0 ("default") says nothing, 1 ("warn") warns and 2 ("error") raises
at each operation that hands a device value to the host and so waits for the work before
it: a copy to a CPU tensor, `.item()`, and the ops whose result size depends on the data
(nonzero, masked_select, unique, bincount, repeat_interleave without output_size,
torch.equal). An explicit `torch.tpu.synchronize()` is not flagged (nor is CUDA's), nor is
a non-blocking copy into pinned memory.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

_NAMES = {"default": 0, "warn": 1, "error": 2}
MODE = [0]
MESSAGE = "called a synchronizing tpu operation"


def set_mode(debug_mode: int | str) -> None:
    if isinstance(debug_mode, str):
        if debug_mode not in _NAMES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _NAMES[debug_mode]
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise TypeError(f"set_sync_debug_mode(): expected an int or str, got {type(debug_mode).__name__}")
    if not 0 <= debug_mode <= 2:
        raise RuntimeError("invalid value of debug_mode, expected one of 0,1,2")
    MODE[0] = debug_mode


def host_sync() -> None:
    """Called where the host is about to wait for a device value."""
    mode = MODE[0]
    if mode == 2:
        raise RuntimeError(MESSAGE)
    if mode == 1:
        # at the user's line, not at the kernel that reads (the dispatcher's frames between)
        f = sys._getframe(1)
        while f.f_back is not None and f.f_code.co_filename.startswith(_INSIDE):
            f = f.f_back
        warnings.warn_explicit(MESSAGE, UserWarning, f.f_code.co_filename, f.f_lineno,
                               module=f.f_globals.get("__name__"),
                               registry=f.f_globals.setdefault("__warningregistry__", {}))


_INSIDE = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(torch.__file__))
