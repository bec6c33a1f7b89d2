"""The storage table: one device buffer per torch StorageImpl.

A tpu tensor is a plain torch.Tensor whose StorageImpl holds zero bytes; its data
is a flat 1-D jax.Array kept here, keyed by the storage's address. Views share
the StorageImpl and so share the entry. A weakref on the storage's Python object
(which PyTorch keeps alive exactly as long as the StorageImpl) drops the entry, so
device memory returns when the last tensor or view dies; a tensor made in C++
(csrc/hit.cpp: new tensors on tpu:0, strict hits' results) has its storage's
DataPtr deleter drop it instead, without a Python storage object.
"""
from __future__ import annotations

import functools
import sys
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import geometry, inflight, jaxenv, pending, placement


class Entry:
    """One storage: its flat buffer (None until first written), length, dtype."""

    # (csrc/hit.cpp makes entries without calling __init__, writing these slots itself: keep
    # __init__ a plain store, and the slots in this order)
    __slots__ = ("buf", "numel", "dtype", "nbytes", "watch", "addr", "untyped", "index", "__weakref__")

    def __init__(self, numel: int, dtype: np.dtype, buf=None):
        self.numel = numel
        self.dtype = dtype
        self.nbytes = numel * dtype.itemsize
        self.buf = buf
        self.watch = None  # weakref to the storage object; its callback frees this entry
        self.addr = None  # its device address, reserved when first asked for (address())
        self.untyped = False  # made as raw bytes (UntypedStorage(n, device="tpu")): see adopt_dtype
        self.index = 0  # the tpu device its buffer lives on (runtime/placement.py)


table: dict[int, Entry] = {}
_SPREAD = placement.SPREAD
inflight.set_live_buffers(lambda: [e.buf for e in list(table.values())])


def _new_lock():
    """csrc/gil_lock.h's GilLock where the extension is built (csrc/hit.cpp takes it without a
    Python call, twice per strict op), else a threading.RLock."""
    try:
        from ._hit import GilLock
    except ImportError:
        return threading.RLock()
    return GilLock()


# Reentrant: _release runs from a weakref callback, which a garbage collection can start
# on this thread while it holds the lock (a plain Lock would deadlock there).
_lock = _new_lock()
_stats: dict[int, dict[str, int]] = {0: {"allocated": 0, "peak": 0}}   # per device index


def _of(index: int) -> dict:
    st = _stats.get(index)
    if st is None:
        st = _stats[index] = {"allocated": 0, "peak": 0}
    return st


def _release(key: int, entry: Entry, _finalizing=sys.is_finalizing) -> None:
    # A storage still alive at interpreter exit is collected after module globals were
    # cleared (to None): nothing here could run then, and the process frees it all anyway.
    if _finalizing():
        return
    with _lock:
        if table.get(key) is entry:
            del table[key]
        _of(entry.index)["allocated"] -= entry.nbytes
        if entry.addr is not None:
            _free_slots.append((entry.addr - _ADDR_BASE) // _ADDR_SLOT)
    entry.watch = None
    inflight.retire(entry.buf)  # synchronize still waits for its program if it runs


# Device addresses. A storage's data_ptr() must be nonzero, the same for every view,
# distinct between live storages and stable for the storage's life: code detects
# sharing from pointers (torch.save's dedupe, safetensors' shared-tensor check, FSDP2).
# Each storage that is asked for one gets a slot of 1 TiB of a virtual range above
# 2**48, past every user-space CPU address, so a tpu pointer never equals a CPU one
# and [ptr, ptr + nbytes) ranges never overlap. Nothing dereferences it: the C++
# StorageImpl keeps its null pointer (PyTorch's C++ code sees no data), and only the
# Python-level data_ptr() methods (device/storage_api.py) return it. A freed storage's
# slot is reused, as a real allocator reuses addresses.
_ADDR_BASE = 1 << 48
_ADDR_SLOT = 1 << 40
_free_slots: list[int] = []
_next_slot = [0]


def address(entry: Entry) -> int:
    """The storage's device address (0 for an empty storage, as CUDA's)."""
    a = entry.addr
    if a is None:
        if entry.nbytes == 0:
            return 0
        with _lock:
            if _free_slots:
                slot = _free_slots.pop()
            else:
                slot = _next_slot[0]
                _next_slot[0] += 1
        entry.addr = a = _ADDR_BASE + slot * _ADDR_SLOT
    return a


def adopt_dtype(entry: Entry, dtype: np.dtype) -> None:
    """Give a storage made as raw bytes (deserialization, `UntypedStorage(n, device=)`) the
    element type of the first typed tensor set over it, so later reads and writes take
    the same-dtype fast paths instead of reinterpreting bytes on every access. The bytes
    are unchanged, so views of either type see the same data."""
    if not entry.untyped:
        return
    entry.untyped = False
    if dtype == entry.dtype or entry.nbytes % dtype.itemsize:
        return
    if entry.buf is not None:
        entry.buf = _reinterpret(pending.concrete(entry, "host_read"), jnp.dtype(dtype))
    entry.numel = entry.nbytes // dtype.itemsize
    entry.dtype = dtype


@functools.partial(jax.jit, static_argnums=(1,))
def _reinterpret(buf, dtype):
    """A flat buffer's bytes seen as another element type (a bitcast, no value change)."""
    return geometry.bitcast(buf, dtype)


def _account(nbytes: int, index: int = 0) -> None:
    with _lock:
        st = _of(index)
        st["allocated"] += nbytes
        if st["allocated"] > st["peak"]:
            st["peak"] = st["allocated"]


def attach(t: torch.Tensor, numel: int, dtype: np.dtype, buf=None) -> Entry:
    """Give the (new) storage of `t` a buffer of `numel` elements of `dtype`."""
    if inflight.parked_buffers:  # let go of dropped buffers that have finished (never from a finalizer)
        inflight.tidy()
    storage = t.untyped_storage()
    key = storage._cdata
    entry = Entry(numel, dtype, buf)
    if _SPREAD[0]:
        entry.index = storage.device.index
    # A plain weakref callback (cheaper than weakref.finalize); the entry keeps the
    # weakref alive for as long as the table holds the entry. `_release` is bound as a
    # default: at interpreter exit the module global may already be None.
    entry.watch = weakref.ref(storage, lambda _, key=key, entry=entry, release=_release: release(key, entry))
    with _lock:
        table[key] = entry
        st = _stats[0] if not entry.index else _of(entry.index)
        a = st["allocated"] = st["allocated"] + entry.nbytes
        if a > st["peak"]:
            st["peak"] = a
    return entry


# a tpu tensor with no storage entry: made by PyTorch's C++ code, not by a torchtpu kernel
NO_BUFFER = ("torchtpu: this tpu tensor has no device buffer: it was made outside torchtpu (e.g. "
             "from a DLPack capsule of PyTorch's C++ exporter, torch._C._to_dlpack, which describes "
             "a tpu tensor by a null pointer; torch.utils.dlpack.to_dlpack and Tensor.__dlpack__ "
             "export its JAX buffer)")


def lookup(t: torch.Tensor) -> Entry:
    try:
        return table[t.untyped_storage()._cdata]
    except KeyError:
        raise RuntimeError(NO_BUFFER) from None


def lookup_storage(storage) -> Entry:
    return table[storage._cdata]


def resize(entry: Entry, numel: int) -> None:
    """Grow a storage in place (PyTorch's resize_ keeps the StorageImpl)."""
    if numel <= entry.numel:
        return
    extra = (numel - entry.numel) * entry.dtype.itemsize
    if entry.buf is not None:
        entry.buf = jnp.concatenate([pending.concrete(entry, "host_read"), jnp.zeros(numel - entry.numel, entry.dtype)])
    entry.numel = numel
    entry.nbytes += extra
    _account(extra, entry.index)


def memory_allocated(index: int = 0) -> int:
    return _of(index)["allocated"]


def max_memory_allocated(index: int = 0) -> int:
    return _of(index)["peak"]


def reset_peak_memory_stats(index: int = 0) -> None:
    st = _of(index)
    st["peak"] = st["allocated"]


def live_buffers(index: int | None = None) -> int:
    """Live storages (on tpu:`index`; None: on every device)."""
    if index is None or not placement.spread():
        return len(table)
    return sum(1 for e in list(table.values()) if e.index == index)


def _native():
    """csrc/hit.cpp (a strict op's cache hit and a new tensor's entry in C++), handed the state
    it acts on: this table, device 0's stats, the lock and release above, the metrics counters,
    the executables' clock, the parked buffers; None where the extension was not built."""
    try:
        from . import _hit
    except ImportError:  # (a checkout whose C++ extensions were not built: `make venv` builds them)
        return None
    from jax._src.array import ArrayImpl  # (its type only: no XLA backend starts here)

    from .. import metrics
    from .executables import clock
    _hit.configure(table, _of(0), metrics.live_counts(), clock, inflight.parked_buffers, inflight.tidy, Entry,
                   ArrayImpl, _lock, _release, inflight.MAX_PARKED, inflight.TIDY_STEP)
    metrics.add_flusher(_hit.flush_counts)
    return _hit


native = _native()
