"""The runtime kernels written by hand for the tpu dispatch key: allocation (empty,
empty_strided, resize_), geometry over a storage (as_strided, set_), copies between
devices and the host, a tensor's scalar, forward AD's tangent layout. eager/kernels.py
registers them."""
from __future__ import annotations

import math

import torch

from ..runtime import geometry, inflight, pinned, placement, storage, tensors, transfer
from ..runtime.jaxenv import CARRIED, CARRIED_SEEN as _SEEN, to_jax_dtype
from . import carried
from .executor import execute
from .memory_format import dense_strides
from .op_args import check_device as _check_device


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device, "empty")
    if pin_memory:
        raise RuntimeError("empty: pin_memory is not supported for tpu tensors")
    with placement.at(device, "empty"):
        t = tensors.empty(size, dtype or torch.get_default_dtype())
    if memory_format in (torch.channels_last, torch.channels_last_3d):  # a fresh buffer: strides only
        tensors.set_geometry(t, t.untyped_storage(), t.shape, _strides_for(tuple(t.shape), memory_format), 0)
    return t


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device, "empty_strided")
    dtype = dtype or torch.get_default_dtype()
    extent = 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(s > 0 for s in size) else 0
    with placement.at(device, "empty_strided"):
        base = tensors.empty((extent,), dtype)
    tensors.set_geometry(base, base.untyped_storage(), size, stride, 0)
    return base


def resize_(self, size, memory_format=None):
    size = tuple(size)
    if memory_format is None and tuple(self.shape) == size:
        return self  # as on CPU: the same sizes keep the tensor's strides (an out= view stays one)
    entry = storage.lookup(self)
    needed = self.storage_offset() + math.prod(size)
    storage.resize(entry, needed)
    tensors.set_geometry(self, self.untyped_storage(), size, _strides_for(size, memory_format), self.storage_offset())
    return self


def _strides_for(size, memory_format) -> tuple:
    """Dense strides of `size` in `memory_format` (contiguous, channels_last(_3d)), as resize_ lays
    them out on CPU; preserve_format is not accepted by resize_ (meta checks reject it first)."""
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        want = 4 if memory_format is torch.channels_last else 5
        if len(size) != want:
            name = "channels_last" if want == 4 else "channels_last_3d"
            raise RuntimeError(f"required rank {want} tensor to use {name} format")
    return dense_strides(size, memory_format)


def as_strided(self, size, stride, storage_offset=None):
    if len(size) != len(stride):  # CPU's setStrided check
        raise RuntimeError("mismatch in length of strides and shape")
    off = self.storage_offset() if storage_offset is None else storage_offset
    # CPU's setStrided and setStorage checks, in its words (an alias with any of these would
    # address outside the buffer)
    if any(st < 0 for st in stride):
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got strides: {list(stride)}")
    if any(s < 0 for s in size):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}")
    if off < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {off}")
    _check_in_bounds(self, size, stride, off)
    return tensors.alias(self, size, stride, off)


def _check_in_bounds(self, size, stride, off) -> None:
    """PyTorch's setStorage check: programs read a view at a runtime offset, which XLA
    clamps into the buffer, so a view past the end must never exist."""
    if any(s == 0 for s in size):
        return
    item = self.element_size()
    need = (1 + sum((s - 1) * st for s, st in zip(size, stride)) + off) * item
    have = storage.lookup(self).nbytes
    if need > have:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {off}, and itemsize "
            f"{item} requiring a storage size of {need} are out of bounds for storage of size {have}"
        )


_served: dict = {}  # eager/kernels.SERVED, given at register(): op name -> the Lowering serving it


def _copy_lowering():
    return _served["copy_"]


_COPY = torch.ops.aten.copy_.default


def _plain(t):
    """t itself, or, for a subclass whose __torch_function__ or properties guard its data
    (nn.UninitializedParameter's `shape` raises until a lazy module's first forward), a plain
    alias of its storage: a copy reads the bytes, as CPU's and CUDA's C++ copy does, without
    asking the subclass."""
    cls = type(t)
    if cls is torch.Tensor or cls.__torch_function__ is _NO_TORCH_FUNCTION:
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


_NO_TORCH_FUNCTION = torch._C._disabled_torch_function_impl


def copy_(self, src, non_blocking=False):
    src = _plain(src)
    sdev, ddev = src.device.type, self.device.type
    if ddev == "tpu" and placement.spread():
        with placement.on(self.device.index):
            return _copy_to_tpu(self, src, sdev)
    if ddev == "tpu":
        return _copy_to_tpu(self, src, sdev)
    # device -> host
    if non_blocking and _lands_async(self, src):
        try:
            transfer.to_host_async(src, self.detach())
            return self
        except TypeError:  # no numpy view of this dtype (float8): the blocking copy
            pass
    host = transfer.to_host(src)
    if self.dtype == torch.float4_e2m1fn_x2 and host.dtype == self.dtype:  # CPU's copy_ has no float4 kernel
        self.view(torch.uint8).copy_(host.view(torch.uint8))
    elif src.dtype in CARRIED:  # the host holds the carrier's bits (runtime/jaxenv.py CARRIED)
        if self.dtype != src.dtype:  # a cast on the way: on the device, as CPU casts it
            return copy_(self, src.to(self.dtype))
        self.view(CARRIED[src.dtype]).copy_(host)
    else:
        self.copy_(host)
    return self


def _copy_to_tpu(self, src, sdev):
    """copy_ into a tpu tensor from tpu (this device or another) or from the host."""
    if sdev == "tpu":
        if src.device.index != self.device.index:  # another tpu device: a device-to-device copy
            arr = transfer.to_other_device(src, self.device.index)
            return _copy_to_tpu(self, tensors.empty(src.shape, src.dtype, arr.reshape(-1)), "tpu")
        if _SEEN[0] and (self.dtype in CARRIED or src.dtype in CARRIED):  # eager/carried.py
            carried.call(_COPY, (self, src), {}, lambda a, k: _copy_to_tpu(*a, "tpu"))
            return self
        execute(_copy_lowering(), (self, src), {})
        return self
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
        inflight.replaced(entry.buf)  # the transfer does not wait for the old buffer's program
        entry.buf = arr.reshape(-1)
        return self
    tmp = tensors.empty(src.shape, src.dtype, arr.reshape(-1))
    return _copy_to_tpu(self, tmp, "tpu")


def _lands_async(dst, src) -> bool:
    """Whether `dst.copy_(src, non_blocking=True)` (tpu -> host) returns before the value
    lands, as CUDA's does into pinned memory: the destination is pinned, contiguous and of
    the source's dtype and shape, so the copy thread writes its bytes in place. Anything
    else (pageable memory, a cast, a broadcast, a strided destination) copies blocking,
    as CUDA does from pageable memory."""
    return (dst.device.type == "cpu" and dst.dtype == src.dtype and dst.shape == src.shape
            and dst.numel() > 0 and dst.layout == torch.strided and src.layout == torch.strided
            and not (dst.is_conj() or dst.is_neg() or src.is_conj() or src.is_neg())
            and dst.is_contiguous() and pinned.is_pinned_ptr(dst.data_ptr()))


def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


def _copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


def _local_scalar_dense(self):
    host = transfer.to_host(self)
    if self.dtype in CARRIED:  # the carrier's bits on the host: CPU reads (or refuses) the dtype
        host = host.view(self.dtype)
    return host.item()


def set_source_tensor(self, source):
    tensors.set_geometry(self, source.untyped_storage(), source.shape, source.stride(), source.storage_offset())
    return self


def set_source_storage(self, source):
    entry = storage.lookup_storage(source)
    storage.adopt_dtype(entry, to_jax_dtype(self.dtype))
    tensors.set_geometry(self, source, (entry.nbytes // self.element_size(),), (1,), 0)
    return self


def set_source_storage_offset(self, source, storage_offset, size, stride=()):
    storage.adopt_dtype(storage.lookup_storage(source), to_jax_dtype(self.dtype))
    tensors.set_geometry(self, source, size, stride or geometry.contiguous_strides(size), storage_offset)
    return self


# view and _reshape_alias run Meta's C++ kernels: they build the view's
# TensorImpl over this tensor's own storage and dispatch keys (device-agnostic code), with
# PyTorch's own stride computation and errors: 4 us a view where geometry computed here
# in Python cost 14 us, and 100 us for a view of a non-contiguous tensor on meta stand-ins.


def new_zeros_with_same_feature_meta(self, other, self_num_batch_dims=0):
    """Forward AD's tangent of a primal's layout (make_dual, copy_): zeros with `other`'s
    options, sizes, strides and storage size. The composite reads `other.storage().nbytes()`,
    which is 0 for a tpu storage (its bytes live in the storage table), and then fails
    as_strided's bounds check: the table's size is used instead. `other` may be a CPU primal
    (copy_ of a tpu dual into a CPU tensor): its tangent is made on CPU."""
    on_tpu = other.device.type == self.device.type
    numel = (storage.lookup(other).nbytes if on_tpu else other.untyped_storage().nbytes()) // other.element_size()
    off = other.storage_offset()
    batch = tuple(self.shape[:self_num_batch_dims])
    strides, prod = [], numel
    for n in reversed(batch):  # the batch slices laid out one after another
        strides.insert(0, prod)
        prod *= n
    base = torch.zeros(prod, dtype=other.dtype, device=other.device)
    size, stride = batch + tuple(other.shape), tuple(strides) + tuple(other.stride())
    return as_strided(base, size, stride, off) if on_tpu else base.as_strided(size, stride, off)


def register(impl, served: dict) -> None:
    """Register these kernels through `impl(name, fn)`; `served` is eager/kernels.SERVED, where
    copy_ finds the table's lowering it runs a device-to-device copy with."""
    global _served
    _served = served
    impl("_new_zeros_with_same_feature_meta", new_zeros_with_same_feature_meta)
    impl("empty.memory_format", empty_memory_format)
    impl("empty_strided", empty_strided)
    impl("resize_", resize_)
    impl("as_strided", as_strided)
    impl("copy_", copy_)
    impl("_copy_from", _copy_from)
    impl("_copy_from_and_resize", _copy_from_and_resize)
    impl("_local_scalar_dense", _local_scalar_dense)
    impl("set_.source_Tensor", set_source_tensor)
    impl("set_.source_Storage", set_source_storage)
    impl("set_.source_Storage_storage_offset", set_source_storage_offset)
