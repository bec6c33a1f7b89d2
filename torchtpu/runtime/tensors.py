"""Making tpu tensors: fresh ones over new buffers, and aliases over old storage."""
from __future__ import annotations

import math

import torch

from . import placement, storage
from .jaxenv import CARRIED, TORCH_TO_JAX, to_jax_dtype

_create_on_0 = torch._C._acc.create_empty_tensor
_SPREAD = placement.SPREAD
# dtypes stored as themselves (not CARRIED on another type: to_jax_dtype notes those)
_PLAIN = {t: j for t, j in TORCH_TO_JAX.items() if t not in CARRIED}


def _create(shape, dtype):
    """A tensor over an empty storage, on the device the running op makes its results on."""
    if not placement.spread():
        return _create_on_0(shape, dtype)
    i = placement.active_index()
    return _create_on_0(shape, dtype) if i == 0 else placement.create_empty(shape, dtype, i)

# Geometry kernels run as Meta's: device-agnostic C++ that keeps the tensor's own keys and
# storage. Meta, not CPU: the CPU set_ would resize the zero-byte storage through a meta
# allocator and turn the storage into a meta one; the Meta kernel only grows nbytes.
META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset


def empty(shape, dtype: torch.dtype, buf=None, strides=None) -> torch.Tensor:
    """A new dense tpu tensor; `buf` is its flat jax buffer (None: not yet written), laid
    out contiguously or, given `strides` (a permutation of them: channels_last), in their order."""
    return empty_with_entry(shape, dtype, buf, strides)[0]


def empty_with_entry(shape, dtype: torch.dtype, buf=None, strides=None):
    """empty() and its storage entry (for the caller that writes the entry's buffer later)."""
    if _new is not None and strides is None and not _SPREAD[0]:
        jdt = _PLAIN.get(dtype)
        if jdt is not None:  # the common case in one C++ call: csrc/hit.cpp's new_tensor
            return _new(shape, dtype, jdt, buf)
    shape = tuple(shape)
    # (this runs for every result of every op: the plain case without a call of its own)
    t = _create_on_0(shape, dtype) if not _SPREAD[0] else _create(shape, dtype)
    jdt = _PLAIN.get(dtype)
    entry = storage.attach(t, math.prod(shape), jdt if jdt is not None else to_jax_dtype(dtype), buf)
    if strides is not None:
        _set_storage.redispatch(META, t, t.untyped_storage(), 0, list(shape), list(strides))
    return t, entry


native = storage.native  # csrc/hit.cpp's module, or None where it was not built
_new = storage.native.new_tensor if storage.native is not None else None
# hit(compiled, entries, packed) -> result | NotImplemented: a strict op's planned cache hit
hit = storage.native.hit if storage.native is not None else None
# record(compiled, entries, dyn, name) -> outputs | NotImplemented: a planned defer_and_fuse record
record = storage.native.record if storage.native is not None else None
PLAIN = _PLAIN
_alias = storage.native.alias if storage.native is not None else None
native_graph_fast = storage.native.graph_fast if storage.native is not None else None


def alias(base: torch.Tensor, shape, stride, offset: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor sharing `base`'s storage with new geometry: metadata only, no copy."""
    if _alias is not None and not (_SPREAD[0] and base.device.index):
        return _alias(base, shape, stride, offset, dtype)  # csrc/hit.cpp: the same, in one call
    if placement.spread() and base.device.index:  # on the base's device, whichever op runs
        out = placement.create_empty((0,), dtype or base.dtype, base.device.index)
    else:
        out = _create_on_0((0,), dtype or base.dtype)
    _set_storage.redispatch(META, out, base.untyped_storage(), offset, list(shape), list(stride))
    # lazy conjugate/negative bits live on the tensor, not the storage: a view keeps them
    # (a negative bit also on real views: x.conj().imag is the negated imaginary part)
    if base.is_neg() and (out.dtype == base.dtype or out.is_complex() == base.is_complex()):
        torch._C._set_neg(out, True)
    if base.is_conj() and out.is_complex():
        torch._C._set_conj(out, True)
    return out


def set_geometry(t: torch.Tensor, storage_obj, shape, stride, offset: int) -> None:
    _set_storage.redispatch(META, t, storage_obj, offset, list(shape), list(stride))
