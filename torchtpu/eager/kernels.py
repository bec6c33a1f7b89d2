"""Registers torchtpu's kernels for the PrivateUse1 ("tpu") dispatch key.

Every lowering in the table becomes a kernel, together with the in-place and
out= overloads generated from it; a handful of runtime kernels (allocation,
copies, views, scalars) are written here by hand; the few composites served
whole at the autograd key (ops/registry.autograd_kernel) go to
AutogradPrivateUse1; everything else reaches the boxed fallback.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..ops.registry import AUTOGRAD_KERNELS, KERNELS, LOWERINGS, Lowering, on_lowering, overload, variants_of
from ..runtime import geometry, inflight, pinned, placement, storage, tensors, transfer
from ..runtime.jaxenv import CARRIED, CARRIED_SEEN as _SEEN, to_jax_dtype
from . import carried
from . import argcheck, composites, dynamism, fallback  # noqa: F401  (composites fills KERNELS)
from .executor import execute
from .memory_format import dense_strides
from .op_args import check_device as _check_device

_lib = torch.library.Library("aten", "IMPL")
_fallback_lib = torch.library.Library("_", "IMPL")
_libs: dict[str, torch.library.Library] = {"aten": _lib}  # a custom op's namespace -> its IMPL library
_registered: set[str] = set()
SERVED: dict[str, Lowering] = {}


def _impl(name: str, fn) -> None:
    if name in _registered:
        return
    ns, _, op = name.rpartition("::")
    if ns:  # "mylib::swiglu": a custom op (torchtpu.jax_op) in its own namespace
        lib = _libs.get(ns)
        if lib is None:
            lib = _libs[ns] = torch.library.Library(ns, "IMPL")
        lib.impl(op, fn, "PrivateUse1")
    else:
        _lib.impl(name, fn, "PrivateUse1")
    _registered.add(name)


def _functional_kernel(low: Lowering):
    if low.output_mask is not None:
        return _masked_kernel(low)
    check = low.check
    op = low.overload
    if check is not None:  # what CPU rejects from the tensors' geometry (strides), unseen by JAX
        def checked(*args, **kwargs):
            if _SEEN[0] and carried.involved(args, kwargs):  # complex32, uint4, ...: eager/carried.py
                return carried.call(op, args, kwargs, lambda a, k: checked(*a, **k))
            check(*args, **kwargs)
            try:
                return execute(low, args, kwargs)
            except carried.FirstSeen:  # the process's first carried dtype: see executor.execute
                return carried.call(op, args, kwargs, lambda a, k: checked(*a, **k))

        return checked

    def kernel(*args, **kwargs):
        if _SEEN[0] and carried.involved(args, kwargs):
            return carried.call(op, args, kwargs, lambda a, k: execute(low, a, k))
        try:
            return execute(low, args, kwargs)
        except carried.FirstSeen:  # the process's first carried dtype: see executor.execute
            return carried.call(op, args, kwargs, lambda a, k: execute(low, a, k))

    if low.name == "complex":  # two float16 tensors make a complex32
        return lambda real, imag: carried.complex_of_halves(real, imag, kernel)
    return kernel


def _masked_kernel(low: Lowering):
    """None for each output the lowering's mask argument masks off: the lowering returns a
    zero-size placeholder there, PyTorch an undefined tensor (convolution_backward, ...)."""
    name = low.output_mask
    idx = low.arg_index[name]

    def kernel(*args, **kwargs):
        res = execute(low, args, kwargs)
        mask = args[idx] if idx < len(args) else kwargs[name]
        return tuple(r if m else None for r, m in zip(res, mask))

    return kernel


def _out_kernel(low: Lowering):
    functional = low.functional
    outs_names = low.mutated

    op = low.overload

    def kernel(*args, **kwargs):
        if _SEEN[0] and carried.involved(args, kwargs):  # complex32, uint4, ...: eager/carried.py
            return carried.call(op, args, kwargs, lambda a, k: kernel(*a, **k))
        key = argcheck.signature(op, args, kwargs)
        # an out= of a dtype no input has: CPU checks it before anything else, so CPU decides
        argcheck.check_once(op, args, kwargs, key, ask_cpu=argcheck.odd_out_dtype(args, kwargs, outs_names))
        full = dict(kwargs)
        outs = [kwargs.pop(n) for n in outs_names]
        try:
            result = execute(functional, args, kwargs)
        except carried.FirstSeen:  # the process's first carried dtype: see executor.execute
            return carried.call(op, args, full, lambda a, k: kernel(*a, **k))
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if any(o.dtype != r.dtype for o, r in zip(outs, results)):
            # CPU's out= dtype rules differ by op (an exact match for neg/floor, a safe cast for
            # add, the input's dtype for amax): CPU decides, once per signature
            argcheck.check_once(op, args, full, ("dtype", key), ask_cpu=True)
        for o, r, n in zip(outs, results, outs_names):
            if o.dtype != r.dtype and not torch.can_cast(r.dtype, o.dtype):
                raise RuntimeError(
                    f"{low.name}: result type {r.dtype} can't be cast to the desired output "
                    f"type {o.dtype} (argument '{n}')"
                )
            if o.shape != r.shape:
                if o.numel():
                    _warn_resized(o.shape, r.shape)
                resize_(o, r.shape)
                if not r.is_contiguous():  # a resized out= takes the result's layout, as on CPU
                    tensors.set_geometry(o, o.untyped_storage(), r.shape, r.stride(), o.storage_offset())
            copy_(o, r)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


def _warn_resized(had, need) -> None:
    """CPU's warning (at::native::resize_output) for an out= with elements and another shape."""
    warnings.warn(
        f"An output with one or more elements was resized since it had shape {list(had)}, which does "
        f"not match the required output shape {list(need)}. This behavior is deprecated, and in a "
        "future PyTorch release outputs will not be resized unless they have zero elements. You can "
        "explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
        UserWarning, stacklevel=3,  # the user's line: the dispatcher between is C++
    )


def _serve(low: Lowering) -> None:
    name = low.name
    if name in _registered:
        return
    _impl(name, _out_kernel(low) if low.mode == "out" else _functional_kernel(low))
    SERVED[name] = low
    if low.mode != "functional" or not low.variants:
        return
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


_subscribed = False


def register_lowerings() -> None:
    """Serve every lowering in the table, and from now on each one registered later (a
    `@lower` in a module imported after torchtpu, a torchtpu.jax_op) as it is registered."""
    global _subscribed
    for low in list(LOWERINGS.values()):
        _serve(low)
    if not _subscribed:
        _subscribed = True
        on_lowering(_serve)


def _checked_kernel(fn, op):
    outs = tuple(a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None
                 and a.alias_info.is_write)

    def kernel(*args, **kwargs):
        if _SEEN[0] and carried.involved(args, kwargs):  # complex32, uint4, ...: eager/carried.py
            return carried.call(op, args, kwargs, lambda a, k: kernel(*a, **k))
        # the out= of a hand-written kernel (nonzero(out=float)): CPU's checks decide, once per
        # signature (these are rare, data-dependent ops)
        argcheck.check_once(op, args, kwargs, argcheck.signature(op, args, kwargs), ask_cpu=bool(outs))
        try:
            return fn(*args, **kwargs)
        except carried.FirstSeen:  # the process's first carried dtype: see executor.execute
            return carried.call(op, args, kwargs, lambda a, k: kernel(*a, **k))

    return kernel


def register_kernels() -> None:
    for name, fn in KERNELS.items():
        # the fused optimizer steps are on the hot path and take only tensors they made
        _impl(name, fn if name.startswith("_fused") else _checked_kernel(fn, overload(name)))
        SERVED.setdefault(name, None)
    for name, fn in AUTOGRAD_KERNELS.items():
        # at PrivateUse1 too: under inference_mode the autograd keys are skipped
        _lib.impl(name, fn, "AutogradPrivateUse1")
        _impl(name, fn)
        SERVED.setdefault(name, None)


# --- runtime kernels -------------------------------------------------------


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


def _copy_lowering():
    return SERVED["copy_"]


_COPY = torch.ops.aten.copy_.default


def copy_(self, src, non_blocking=False):
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
_view = torch.ops.aten.view.default
_reshape_alias_op = torch.ops.aten._reshape_alias.default


def view(self, size):
    try:
        return _view.redispatch(tensors.META, self, size)
    except RuntimeError:
        # a growth's padded tensor has its bucket's strides where CPU's is contiguous
        if not dynamism.unpad_for_view(self):
            raise
        return _view.redispatch(tensors.META, self, size)


def _reshape_alias(self, size, stride):
    return _reshape_alias_op.redispatch(tensors.META, self, size, stride)


# --- view fast paths --------------------------------------------------------
# The common views, with their geometry computed by stride arithmetic instead of on
# meta stand-ins (which allocate meta tensors and walk pytrees: ~10x the cost). Any
# case off the beaten path (a bad dim, a negative size) returns None and takes the
# meta path, which raises PyTorch's own error.


def _alias(self, shape, stride, offset=None):
    return tensors.alias(self, shape, stride, self.storage_offset() if offset is None else offset)


def _wrap_dim(dim, ndim):
    n = max(ndim, 1)
    if not -n <= dim < n:
        return None
    return dim % n


def _v_alias(self):
    return _alias(self, self.shape, self.stride())


def _v_t(self):
    n = self.dim()
    if n < 2:
        return _alias(self, self.shape, self.stride())
    if n != 2:
        return None
    sh, st = self.shape, self.stride()
    return _alias(self, (sh[1], sh[0]), (st[1], st[0]))


def _v_transpose(self, dim0, dim1):
    n = self.dim()
    d0, d1 = _wrap_dim(dim0, n), _wrap_dim(dim1, n)
    if d0 is None or d1 is None:
        return None
    if n == 0:
        return _alias(self, (), ())
    sh, st = list(self.shape), list(self.stride())
    sh[d0], sh[d1] = sh[d1], sh[d0]
    st[d0], st[d1] = st[d1], st[d0]
    return _alias(self, sh, st)


def _v_expand(self, size, implicit=False):
    # PyTorch's inferExpandGeometry: a new leading dim of size 1 gets the stride of the dims
    # inside it (size * stride), so expand(1, 1, 5) of a (5,) tensor has strides (5, 5, 1)
    n, k = self.dim(), len(size)
    if k < n:
        return None
    sh, st = self.shape, self.stride()
    out_sh, out_st = [0] * k, [0] * k
    inner_size, inner_stride = 1, 0  # what lies inside the innermost dim (nothing)
    for i in range(k - 1, -1, -1):
        s = int(size[i])
        j = i - (k - n)
        cur, stride = (sh[j], st[j]) if j >= 0 else (1, inner_size * inner_stride)
        if s == -1:
            if j < 0:
                return None
            s = cur
        if s < 0 or (s != cur and cur != 1):
            return None
        if s != cur:
            stride = 0
        out_sh[i], out_st[i] = s, stride
        inner_size, inner_stride = s, stride
    return _alias(self, out_sh, out_st)


def _v_split(self, split_size, dim=0):
    n = self.dim()
    split_size = int(split_size)
    d = _wrap_dim(dim, n) if n else None
    if d is None or split_size <= 0:
        return None
    sh, st, off = list(self.shape), self.stride(), self.storage_offset()
    length = sh[d]
    if length == 0:
        return None
    out = []
    for start in range(0, length, split_size):
        sh[d] = min(split_size, length - start)
        out.append(_alias(self, tuple(sh), st, off + start * st[d]))
    return out


def _v_unsqueeze(self, dim):
    n = self.dim()
    if not -n - 1 <= dim <= n:
        return None
    d = dim % (n + 1)
    sh, st = list(self.shape), list(self.stride())
    new_st = sh[d] * st[d] if d < n else 1
    sh.insert(d, 1)
    st.insert(d, new_st)
    return _alias(self, sh, st)


def _v_permute(self, dims):
    n = self.dim()
    if len(dims) != n:
        return None
    ds = [_wrap_dim(d, n) for d in dims]
    if None in ds or len(set(ds)) != n:
        return None
    sh, st = self.shape, self.stride()
    return _alias(self, [sh[d] for d in ds], [st[d] for d in ds])


def _v_select(self, dim, index):
    n = self.dim()
    d = _wrap_dim(dim, n) if n else None
    if d is None:
        return None
    size = self.shape[d]
    index = int(index)
    if not -size <= index < size:
        return None
    index %= size
    sh, st = list(self.shape), list(self.stride())
    off = self.storage_offset() + index * st[d]
    del sh[d], st[d]
    return _alias(self, sh, st, off)


def _v_slice(self, dim=0, start=None, end=None, step=1):
    n = self.dim()
    d = _wrap_dim(dim, n) if n else None
    step = int(step)
    if d is None or step <= 0:
        return None
    size = self.shape[d]
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    sh, st = list(self.shape), list(self.stride())
    sh[d] = (end - start + step - 1) // step
    off = self.storage_offset() + start * st[d]
    st[d] *= step
    return _alias(self, sh, st, off)


def _v_squeeze_dim(self, dim):
    n = self.dim()
    d = _wrap_dim(dim, n)
    if d is None:
        return None
    if n == 0 or self.shape[d] != 1:
        return _alias(self, self.shape, self.stride())
    sh, st = list(self.shape), list(self.stride())
    del sh[d], st[d]
    return _alias(self, sh, st)


_FAST_VIEWS = {
    "t": _v_t, "transpose.int": _v_transpose,
    "expand": _v_expand, "split.Tensor": _v_split, "unsqueeze": _v_unsqueeze,
    "permute": _v_permute, "select.int": _v_select, "slice.Tensor": _v_slice,
    "squeeze.dim": _v_squeeze_dim,
}


def _fast_view_op(name, fast):
    slow = view_kernel(overload(name))

    def kernel(*args, **kwargs):
        out = fast(*args, **kwargs)
        return slow(*args, **kwargs) if out is None else out

    return kernel


def view_kernel(op):
    def kernel(*args, **kwargs):
        out = fallback.meta_view(op, args, kwargs)
        if out.dtype in CARRIED:  # uint8.view(torch.uint4), view_as_complex(float16): eager/carried.py
            _SEEN[0] = True
        return out

    return kernel


def _inplace_view_kernel(op):
    def kernel(*args, **kwargs):
        return fallback.meta_inplace_view(op, args, kwargs)

    return kernel


# detach/alias stay on the boxed fallback (a kernel registered for detach breaks
# nn.Parameter's _make_subclass), with the same stride-arithmetic fast path.
_FAST_BOXED = {torch.ops.aten.detach.default: _v_alias, torch.ops.aten.alias.default: _v_alias}


def _boxed_fallback(op, *args, **kwargs):
    fast = _FAST_BOXED.get(op)
    if fast is not None and not kwargs and len(args) == 1:
        return fast(*args)
    if fallback.is_view_op(op):
        return fallback.meta_view(op, args, kwargs)
    if fallback.is_inplace_view_op(op):
        return fallback.meta_inplace_view(op, args, kwargs)
    if _SEEN[0] and carried.involved(args, kwargs):  # complex32, uint4, ...: eager/carried.py
        return carried.call(op, args, kwargs, lambda a, k: _boxed_fallback(op, *a, **k))
    return fallback.run_on_cpu(op, args, kwargs)


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


def register_runtime() -> None:
    _impl("_new_zeros_with_same_feature_meta", new_zeros_with_same_feature_meta)
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
    _impl("view", view)
    _impl("_reshape_alias", _reshape_alias)
    for name, fast in _FAST_VIEWS.items():
        _impl(name, _fast_view_op(name, fast))
    for name in ("view.dtype", "unfold", "view_as_real", "view_as_complex"):
        _impl(name, view_kernel(overload(name)))
    # In-place geometry ops have composite kernels that check bounds against the
    # zero-byte storage; ours computes the geometry on a meta stand-in instead.
    for name in ("transpose_", "t_", "unsqueeze_", "squeeze_", "squeeze_.dim", "squeeze_.dims",
                 "as_strided_", "swapaxes_", "swapdims_"):
        _impl(name, _inplace_view_kernel(overload(name)))
    _fallback_lib.fallback(_boxed_fallback, "PrivateUse1")
