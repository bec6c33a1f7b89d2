"""Pinned host memory for the tpu device: the host allocator behind `pin_memory()`.

PyTorch asks an accelerator's C++ hooks for a pinned-memory allocator
(`getPinnedMemoryAllocator`, `isPinnedPtr`); the pure-Python PrivateUse1 hooks cannot
provide one, so the device layer serves `_pin_memory` / `is_pinned` for CPU tensors
from here (device/host_memory.py). A pinned block is an anonymous, page-aligned
memory mapping owned by the CPU tensor's storage; the ranges of live blocks are kept
so `is_pinned()` answers for any tensor or view inside one, and a block leaves the
table when its storage dies (before the mapping is unmapped).

What pinning buys here: PJRT stages every host-to-device copy through buffers of its
own (XLA:CPU copies, TPU/GPU DMA from the runtime's pinned staging memory), and no JAX
API takes a caller's host pointer as a transfer source, so these pages are not
page-locked (mlock would cost RLIMIT_MEMLOCK and speed nothing up). Copies from them
to the device are asynchronous as every host-to-device copy is (jax.device_put).
"""
from __future__ import annotations

import bisect
import mmap
import threading
import weakref

import numpy as np
import torch

_starts: list[int] = []  # sorted block start addresses
_ends: dict[int, int] = {}
_lock = threading.Lock()
_stats = {"blocks": 0, "bytes": 0}


def _forget(start: int) -> None:
    with _lock:
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            del _starts[i]
            _stats["blocks"] -= 1
            _stats["bytes"] -= _ends.pop(start) - start


def empty_bytes(nbytes: int) -> torch.Tensor:
    """A new pinned CPU uint8 tensor of `nbytes` bytes (uninitialized, as torch.empty)."""
    mm = mmap.mmap(-1, max(int(nbytes), 1))
    arr = np.frombuffer(mm, dtype=np.uint8)[:nbytes]
    t = torch.from_numpy(arr)  # the storage holds `arr`, `arr` holds the mapping
    start = arr.__array_interface__["data"][0]
    with _lock:
        bisect.insort(_starts, start)
        _ends[start] = start + max(int(nbytes), 1)
        _stats["blocks"] += 1
        _stats["bytes"] += max(int(nbytes), 1)
    weakref.finalize(arr, _forget, start)
    return t


def empty_strided(size, stride, dtype: torch.dtype) -> torch.Tensor:
    """A pinned CPU tensor with the given geometry."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else 0
    raw = empty_bytes(extent * itemsize)
    return torch.empty(0, dtype=dtype).set_(raw.untyped_storage(), 0, list(size), list(stride))


def is_pinned_ptr(ptr: int) -> bool:
    """Whether host address `ptr` lies inside a live pinned block."""
    if not ptr:
        return False
    with _lock:
        i = bisect.bisect_right(_starts, ptr) - 1
        return i >= 0 and ptr < _ends[_starts[i]]


def stats() -> dict:
    """Live pinned blocks and their bytes."""
    return dict(_stats)
