"""A tensor as a program sees it: a view of one of the program's storage buffers.

Every executor (strict ops, defer_and_fuse regions, compiled graphs, fused collectives,
host reads) hands a program its tpu tensors the same way: each storage's flat buffer as
an input, and each tensor as a `Leaf` over it (which buffer, sizes, strides, offset,
element type, lazy conjugate/negative bits). The leaf is static, part of the program's
cache key; the buffer is the runtime value.

    host:   Leaves.add(t)  /  leaf_of(t, slot)   tensor -> storage entry + Leaf
    trace:  read(bufs, leaf)                     the tensor's value out of its buffer
            write(bufs, leaf, value)             a value into the tensor's view of its buffer
    host:   commit(entries, updated)             a program's new buffers -> the storages
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import torch

from . import geometry, inflight
from .jaxenv import TORCH_TO_JAX
from .storage import table


class Leaf(NamedTuple):
    slot: int                 # which of the program's storage buffers it views
    shape: tuple
    stride: tuple             # a size-1 dim's stride is 0: never used, kept out of keys
    offset: int | None        # None: a runtime value the executor passes separately
    dtype: np.dtype           # the tensor's element type (the buffer's may differ)
    flags: str = ""           # lazy bits of the tensor (not the storage): "conj", "neg", "conjneg"


# ranks in which a size-1 dim's stride tells channels_last from contiguous, and results differ
# by it (eager/memory_format.py): there it stays in the leaf, and so in a program's key
STRIDES_KEYED_RANKS = (4, 5)

_new = tuple.__new__  # a Leaf without NamedTuple's Python-level __new__: this runs per tensor per op


def flags_of(t: torch.Tensor) -> str:
    """The tensor's lazy conjugate/negative bits, as a Leaf's flags."""
    neg = t.is_neg()
    conj = t.is_conj() and t.dtype.is_complex
    if not (neg or conj):
        return ""
    return ("conj" if conj else "") + ("neg" if neg else "")


def leaf_of(t: torch.Tensor, slot: int, runtime_offsets: list | None = None) -> Leaf:
    """`t`'s view of the buffer at `slot`. With `runtime_offsets`, a nonzero offset is
    appended there and left out of the leaf (one program for every row of a storage)."""
    shape = tuple(t.shape)
    stride = t.stride()
    if 1 in shape and len(shape) not in STRIDES_KEYED_RANKS:
        stride = tuple([0 if n == 1 else s for n, s in zip(shape, stride)])
    offset = t.storage_offset()
    if offset and runtime_offsets is not None:
        runtime_offsets.append(offset)
        offset = None
    dt = t.dtype
    if t.is_neg() or (dt.is_complex and t.is_conj()):
        return _new(Leaf, (slot, shape, stride, offset, TORCH_TO_JAX[dt], flags_of(t)))
    return _new(Leaf, (slot, shape, stride, offset, TORCH_TO_JAX[dt], ""))


def host_leaf(slot: int, t: torch.Tensor) -> Leaf:
    """0-dim `t` passed as a one-element buffer of its own (a CPU scalar tensor operand)."""
    return _new(Leaf, (slot, (), (), 0, TORCH_TO_JAX[t.dtype], flags_of(t)))


def entry_of(t: torch.Tensor):
    """The storage entry of a tpu tensor; KeyError when it has none (the caller words the
    error: a tensor of another device, or one made outside torchtpu)."""
    return table[t.untyped_storage()._cdata]


class Leaves:
    """The tensors of one program: each distinct storage once (its slot in `entries`), each
    tensor a Leaf in `leaves`; nonzero offsets are runtime values in `offsets` when
    `runtime_offsets` is set."""

    __slots__ = ("entries", "index", "leaves", "offsets")

    def __init__(self, runtime_offsets: bool = False):
        self.entries: list = []
        self.index: dict[int, int] = {}
        self.leaves: list[Leaf] = []
        self.offsets: list[int] | None = [] if runtime_offsets else None

    def slot(self, entry) -> int:
        k = id(entry)
        si = self.index.get(k)
        if si is None:
            si = self.index[k] = len(self.entries)
            self.entries.append(entry)
        return si

    def add(self, t: torch.Tensor, entry=None) -> int:
        """Add tpu tensor `t` (its storage `entry` when the caller looked it up); returns
        its leaf's index. KeyError: no storage entry (see entry_of)."""
        if entry is None:
            entry = table[t.untyped_storage()._cdata]
        self.leaves.append(leaf_of(t, self.slot(entry), self.offsets))
        return len(self.leaves) - 1

    def add_leaf(self, entry, leaf_: Leaf) -> int:
        self.leaves.append(leaf_._replace(slot=self.slot(entry)))
        return len(self.leaves) - 1

    def specs(self) -> tuple:
        """(numel, buffer dtype) of each storage: part of the key (a buffer's aval)."""
        return tuple([(e.numel, e.dtype) for e in self.entries])


# ---- inside a trace ---------------------------------------------------------------------------


def read(bufs, lf: Leaf, offset=None, clamped: bool = False):
    """The tensor's value (its shape, dtype and lazy bits applied) out of `bufs`; `offset`
    replaces the leaf's when it is a runtime value. `clamped`: the leaf may reach past its
    buffer's end (a bucket's window, eager/extents.py), whose positions read its last element."""
    read_ = geometry.read_clamped if clamped else geometry.read
    x = read_(bufs[lf.slot], lf.shape, lf.stride, lf.offset if offset is None else offset, lf.dtype)
    flags = lf.flags
    if flags:
        if "conj" in flags:
            x = jnp.conj(x)
        if "neg" in flags:
            x = -x
    return x


def write(bufs: list, lf: Leaf, value, offset=None, spec=None) -> None:
    """Write `value` (the tensor's shape, cast to its dtype) into the leaf's view of
    bufs[slot], replacing it there; a never-written buffer (None) starts as zeros of
    `spec` (numel, dtype)."""
    base = bufs[lf.slot]
    if base is None:
        base = jnp.zeros((spec[0],), spec[1])
    value = jnp.asarray(value)
    if value.dtype != lf.dtype:
        value = value.astype(lf.dtype)
    if value.shape != lf.shape and value.size == math.prod(lf.shape):
        value = value.reshape(lf.shape)  # a flat result; anything else broadcasts in the write
    bufs[lf.slot] = geometry.write(base, value, lf.shape, lf.stride, lf.offset if offset is None else offset)


# ---- after a run ------------------------------------------------------------------------------


def commit(entries, updated: dict) -> None:
    """A program's new buffers (slot -> array) become its storages' buffers. A replaced
    buffer still being computed is handed to inflight: jax.jit drops arguments a program
    does not read (a whole overwrite: zero_, out=), so the new buffer need not wait for it,
    and synchronize() must."""
    for s, b in updated.items():
        e = entries[s]
        old = e.buf
        e.buf = b
        if old is not b:
            inflight.replaced(old)
