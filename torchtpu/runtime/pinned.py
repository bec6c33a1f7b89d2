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
import time
import weakref

import numpy as np
import torch

_starts: list[int] = []  # sorted block start addresses
_ends: dict[int, int] = {}
_lock = threading.Lock()


class _Stat:
    """One of torch.tpu.host_memory_stats' counters: current, peak, and the historical
    increase and decrease (CUDA's host allocator keeps the same four)."""
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, n: int) -> None:
        self.current += n
        self.allocated += n
        self.peak = max(self.peak, self.current)

    def sub(self, n: int) -> None:
        self.current -= n
        self.freed += n

    def as_dict(self) -> dict:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class _Timing:
    """Microseconds spent in the allocator's calls: total, max, min, count, avg."""
    __slots__ = ("total", "max", "min", "count")

    def __init__(self):
        self.total = self.max = self.min = self.count = 0

    def add(self, us: int) -> None:
        self.min = us if self.count == 0 else min(self.min, us)
        self.max = max(self.max, us)
        self.total += us
        self.count += 1

    def as_dict(self) -> dict:
        return {"total": self.total, "max": self.max, "min": self.min, "count": self.count,
                "avg": self.total // self.count if self.count else 0}


# No block is cached for reuse (a block lives as long as its storage), so the blocks the
# allocator owns are the blocks handed out: allocations and active_requests move together.
_blocks, _bytes = _Stat(), _Stat()
_alloc_time, _free_time = _Timing(), _Timing()


def _forget(start: int) -> None:
    t0 = time.perf_counter_ns()
    with _lock:
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            del _starts[i]
            n = _ends.pop(start) - start
            _blocks.sub(1)
            _bytes.sub(n)
            _free_time.add((time.perf_counter_ns() - t0) // 1000)


def empty_bytes(nbytes: int) -> torch.Tensor:
    """A new pinned CPU uint8 tensor of `nbytes` bytes (uninitialized, as torch.empty)."""
    t0 = time.perf_counter_ns()
    size = max(int(nbytes), 1)
    mm = mmap.mmap(-1, size)
    arr = np.frombuffer(mm, dtype=np.uint8)[:nbytes]
    t = torch.from_numpy(arr)  # the storage holds `arr`, `arr` holds the mapping
    start = arr.__array_interface__["data"][0]
    with _lock:
        bisect.insort(_starts, start)
        _ends[start] = start + size
        _blocks.add(1)
        _bytes.add(size)
        _alloc_time.add((time.perf_counter_ns() - t0) // 1000)
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
    return {"blocks": _blocks.current, "bytes": _bytes.current}


def host_stats() -> dict:
    """torch.tpu.host_memory_stats_as_nested_dict: the pinned allocator's counters in the
    layout of CUDA's host allocator (allocations, allocated_bytes, active_requests and
    active_bytes, each current/peak/allocated/freed; blocks made and released; the time of
    making one (the mapping and its registration) and of releasing one (its registration:
    the mapping goes with its storage right after), in microseconds)."""
    with _lock:
        return {"allocations": _blocks.as_dict(), "allocated_bytes": _bytes.as_dict(),
                "active_requests": _blocks.as_dict(), "active_bytes": _bytes.as_dict(),
                "num_host_alloc": _blocks.allocated, "num_host_free": _blocks.freed,
                "host_alloc_time": _alloc_time.as_dict(), "host_free_time": _free_time.as_dict()}


def reset_accumulated_host_stats() -> None:
    """The historical counters (allocated, freed) and the timings start again from zero."""
    global _alloc_time, _free_time
    with _lock:
        for s in (_blocks, _bytes):
            s.allocated = s.freed = 0
        _alloc_time, _free_time = _Timing(), _Timing()


def reset_peak_host_stats() -> None:
    """Peaks start again from the current values."""
    with _lock:
        for s in (_blocks, _bytes):
            s.peak = s.current
