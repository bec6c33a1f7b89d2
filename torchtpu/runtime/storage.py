"""The storage table: one device buffer per torch StorageImpl.

A tpu tensor is a plain torch.Tensor whose StorageImpl holds zero bytes; its data
is a flat 1-D jax.Array kept here, keyed by the storage's address. Views share
the StorageImpl and so share the entry. A weakref.finalize on the storage's
Python object (which PyTorch keeps alive exactly as long as the StorageImpl)
drops the entry, so device memory returns when the last tensor or view dies.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from . import inflight, jaxenv


class Entry:
    """One storage: its flat buffer (None until first written), length, dtype."""

    __slots__ = ("buf", "numel", "dtype", "nbytes", "watch", "__weakref__")

    def __init__(self, numel: int, dtype: np.dtype, buf=None):
        self.numel = numel
        self.dtype = dtype
        self.nbytes = numel * dtype.itemsize
        self.buf = buf
        self.watch = None  # weakref to the storage object; its callback frees this entry


_table: dict[int, Entry] = {}
_lock = threading.Lock()
_stats = {"allocated": 0, "peak": 0}


def _release(key: int, entry: Entry) -> None:
    with _lock:
        if _table.get(key) is entry:
            del _table[key]
        _stats["allocated"] -= entry.nbytes
    entry.watch = None
    inflight.retire(entry.buf)  # synchronize still waits for its program if it runs


def _account(nbytes: int) -> None:
    with _lock:
        _stats["allocated"] += nbytes
        if _stats["allocated"] > _stats["peak"]:
            _stats["peak"] = _stats["allocated"]


def attach(t: torch.Tensor, numel: int, dtype: np.dtype, buf=None) -> Entry:
    """Give the (new) storage of `t` a buffer of `numel` elements of `dtype`."""
    storage = t.untyped_storage()
    key = storage._cdata
    entry = Entry(numel, dtype, buf)
    # A plain weakref callback (cheaper than weakref.finalize); the entry keeps the
    # weakref alive for as long as the table holds the entry.
    entry.watch = weakref.ref(storage, lambda _, key=key, entry=entry: _release(key, entry))
    with _lock:
        _table[key] = entry
        _stats["allocated"] += entry.nbytes
        if _stats["allocated"] > _stats["peak"]:
            _stats["peak"] = _stats["allocated"]
    return entry


def lookup(t: torch.Tensor) -> Entry:
    try:
        return _table[t.untyped_storage()._cdata]
    except KeyError:
        raise RuntimeError(
            "torchtpu: this tpu tensor has no device buffer (was it created outside torchtpu?)"
        ) from None


def lookup_storage(storage) -> Entry:
    return _table[storage._cdata]


def resize(entry: Entry, numel: int) -> None:
    """Grow a storage in place (PyTorch's resize_ keeps the StorageImpl)."""
    if numel <= entry.numel:
        return
    extra = (numel - entry.numel) * entry.dtype.itemsize
    if entry.buf is not None:
        import jax.numpy as jnp

        from .transfer import buffer

        entry.buf = jnp.concatenate([buffer(entry), jnp.zeros(numel - entry.numel, entry.dtype)])
    entry.numel = numel
    entry.nbytes += extra
    _account(extra)


def memory_allocated() -> int:
    return _stats["allocated"]


def max_memory_allocated() -> int:
    return _stats["peak"]


def reset_peak_memory_stats() -> None:
    _stats["peak"] = _stats["allocated"]


def live_buffers() -> int:
    return len(_table)


