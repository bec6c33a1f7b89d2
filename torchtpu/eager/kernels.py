"""Registers torchtpu's kernels for the PrivateUse1 ("tpu") dispatch key.

Every lowering in the table becomes a kernel, together with the in-place and
out= overloads generated from it; a handful of runtime kernels (allocation,
copies, views, scalars) are written here by hand; everything else reaches the
boxed fallback.
"""
from __future__ import annotations

import math

import torch

from .. import metrics
from ..ops.registry import KERNELS, LOWERINGS, Lowering, overload, variants_of
from ..runtime import geometry, storage, tensors, transfer
from ..runtime.jaxenv import to_jax_dtype
from . import fallback
from .executor import execute

_lib = torch.library.Library("aten", "IMPL")
_fallback_lib = torch.library.Library("_", "IMPL")
_registered: set[str] = set()
SERVED: dict[str, Lowering] = {}


def _impl(name: str, fn) -> None:
    if name in _registered:
        return
    _lib.impl(name, fn, "PrivateUse1")
    _registered.add(name)


def _functional_kernel(low: Lowering):
    def kernel(*args, **kwargs):
        return execute(low, args, kwargs)

    return kernel


def _out_kernel(low: Lowering):
    functional = low.extra["functional"]
    outs_names = low.mutated

    def kernel(*args, **kwargs):
        outs = [kwargs.pop(n) for n in outs_names]
        result = execute(functional, args, kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for o, r, n in zip(outs, results, outs_names):
            if o.dtype != r.dtype and not torch.can_cast(r.dtype, o.dtype):
                raise RuntimeError(
                    f"{low.name}: result type {r.dtype} can't be cast to the desired output "
                    f"type {o.dtype} (argument '{n}')"
                )
            if o.shape != r.shape:
                resize_(o, r.shape)
            copy_(o, r)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


def register_lowerings() -> None:
    for name, low in list(LOWERINGS.items()):
        if name in _registered:
            continue
        _impl(name, _out_kernel(low) if low.mode == "out" else _functional_kernel(low))
        SERVED[name] = low
        if low.mode != "functional" or not low.extra.get("variants", True):
            continue
        for var in variants_of(low):
            if var.name in LOWERINGS or var.name in SERVED:
                continue
            SERVED[var.name] = var
            if var.name in _registered:  # a hand-written runtime kernel (copy_) serves it
                continue
            if var.mode == "inplace":
                _impl(var.name, _functional_kernel(var))
            else:
                _impl(var.name, _out_kernel(var))


def register_kernels() -> None:
    for name, fn in KERNELS.items():
        _impl(name, fn)
        SERVED.setdefault(name, None)


# --- runtime kernels -------------------------------------------------------


def _check_device(device, op: str) -> None:
    if device is not None and torch.device(device).index not in (None, 0):
        raise RuntimeError(
            f"{op}: invalid device {torch.device(device)}; this process drives one device, tpu:0 "
            "(use one process per device with torch.distributed)"
        )


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device, "empty")
    if pin_memory:
        raise RuntimeError("empty: pin_memory is not supported for tpu tensors")
    return tensors.empty(size, dtype or torch.get_default_dtype())


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device, "empty_strided")
    dtype = dtype or torch.get_default_dtype()
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else 0
    base = tensors.empty((extent,), dtype)
    tensors.set_geometry(base, base.untyped_storage(), size, stride, 0)
    return base


def resize_(self, size, memory_format=None):
    size = tuple(size)
    entry = storage.lookup(self)
    needed = self.storage_offset() + math.prod(size)
    storage.resize(entry, needed)
    tensors.set_geometry(self, self.untyped_storage(), size, geometry.contiguous_strides(size), self.storage_offset())
    return self


def as_strided(self, size, stride, storage_offset=None):
    off = self.storage_offset() if storage_offset is None else storage_offset
    return tensors.alias(self, size, stride, off)


def _copy_lowering():
    return SERVED["copy_"]


def copy_(self, src, non_blocking=False):
    sdev, ddev = src.device.type, self.device.type
    if ddev == "tpu" and sdev == "tpu":
        execute(_copy_lowering(), (self, src), {})
        return self
    if ddev == "tpu":
        arr = transfer.to_device_array(src)
        entry = storage.lookup(self)
        if (
            tuple(src.shape) == tuple(self.shape)
            and src.dtype == self.dtype
            and self.storage_offset() == 0
            and self.numel() == entry.numel
            and entry.dtype == to_jax_dtype(self.dtype)
            and geometry.is_contiguous(self.shape, self.stride())
        ):
            entry.buf = arr.reshape(-1)
            return self
        tmp = tensors.empty(src.shape, src.dtype, arr.reshape(-1))
        execute(_copy_lowering(), (self, tmp), {})
        return self
    # device -> host
    host = transfer.to_host(src)
    self.copy_(host)
    return self


def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


def _copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


def _local_scalar_dense(self):
    return transfer.to_host(self).item()


def set_source_tensor(self, source):
    tensors.set_geometry(self, source.untyped_storage(), source.shape, source.stride(), source.storage_offset())
    return self


def set_source_storage(self, source):
    entry = storage.lookup_storage(source)
    tensors.set_geometry(self, source, (entry.numel,), (1,), 0)
    return self


def set_source_storage_offset(self, source, storage_offset, size, stride=()):
    tensors.set_geometry(self, source, size, stride or geometry.contiguous_strides(size), storage_offset)
    return self


def _infer_size(size, numel: int, op: str):
    size = list(size)
    neg = [i for i, s in enumerate(size) if s == -1]
    if len(neg) > 1:
        raise RuntimeError(f"{op}: only one dimension can be inferred")
    known = math.prod(s for s in size if s != -1)
    if neg:
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{size}' is invalid for input of size {numel}")
        size[neg[0]] = numel // known
    elif known != numel:
        raise RuntimeError(f"shape '{size}' is invalid for input of size {numel}")
    return size


def _fast_view(op):
    """view/_unsafe_view of a contiguous tensor: new contiguous strides, no meta detour."""
    slow = view_kernel(op)

    def kernel(self, size):
        if self.is_contiguous():
            size = _infer_size(size, self.numel(), "view")
            return tensors.alias(self, size, geometry.contiguous_strides(size), self.storage_offset())
        return slow(self, size)

    return kernel


def _reshape_alias(self, size, stride):
    return tensors.alias(self, size, stride, self.storage_offset())


def view_kernel(op):
    def kernel(*args, **kwargs):
        return fallback.meta_view(op, args, kwargs)

    return kernel


def _inplace_view_kernel(op):
    def kernel(*args, **kwargs):
        return fallback.meta_inplace_view(op, args, kwargs)

    return kernel


def _boxed_fallback(op, *args, **kwargs):
    if fallback.is_view_op(op):
        return fallback.meta_view(op, args, kwargs)
    if fallback.is_inplace_view_op(op):
        return fallback.meta_inplace_view(op, args, kwargs)
    return fallback.run_on_cpu(op, args, kwargs)


def register_runtime() -> None:
    _impl("empty.memory_format", empty_memory_format)
    _impl("empty_strided", empty_strided)
    _impl("resize_", resize_)
    _impl("as_strided", as_strided)
    _impl("copy_", copy_)
    _impl("_copy_from", _copy_from)
    _impl("_copy_from_and_resize", _copy_from_and_resize)
    _impl("_local_scalar_dense", _local_scalar_dense)
    _impl("set_.source_Tensor", set_source_tensor)
    _impl("set_.source_Storage", set_source_storage)
    _impl("set_.source_Storage_storage_offset", set_source_storage_offset)
    _impl("view", _fast_view(overload("view")))
    _impl("_unsafe_view", _fast_view(overload("_unsafe_view")))
    _impl("_reshape_alias", _reshape_alias)
    for name in ("view.dtype", "unfold", "view_as_real", "view_as_complex"):
        _impl(name, view_kernel(overload(name)))
    # In-place geometry ops have composite kernels that check bounds against the
    # zero-byte storage; ours computes the geometry on a meta stand-in instead.
    for name in ("transpose_", "t_", "unsqueeze_", "squeeze_", "squeeze_.dim", "squeeze_.dims",
                 "as_strided_", "swapaxes_", "swapdims_"):
        _impl(name, _inplace_view_kernel(overload(name)))
    _fallback_lib.fallback(_boxed_fallback, "PrivateUse1")
