"""Registers torchtpu's kernels for the PrivateUse1 ("tpu") dispatch key.

Every lowering in the table becomes a kernel, together with the in-place and
out= overloads generated from it; a handful of runtime kernels (allocation,
copies, scalars: eager/runtime_kernels.py; views: eager/view_kernels.py) are written
by hand; the few composites served
whole at the autograd key (ops/registry.autograd_kernel) go to
AutogradPrivateUse1; everything else reaches the boxed fallback.
"""
from __future__ import annotations

import functools
import warnings

import torch

from ..ops.registry import AUTOGRAD_KERNELS, KERNELS, LOWERINGS, Lowering, on_lowering, overload, variants_of
from ..runtime import tensors
from ..runtime.jaxenv import CARRIED_SEEN as _SEEN
from . import argcheck, carried, composites, fallback, runtime_kernels, view_kernels  # noqa: F401  (composites fills KERNELS)
from .executor import execute, fast_path
from .runtime_kernels import copy_, resize_

_lib = torch.library.Library("aten", "IMPL")
_fallback_lib = torch.library.Library("_", "IMPL")
_libs: dict[str, torch.library.Library] = {"aten": _lib}  # a custom op's namespace -> its IMPL library
_registered: set[str] = set()
_native_kernel = None if tensors.native is None else tensors.native.Kernel
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
    elif _native_kernel is not None and type(fn) is _native_kernel:
        # a C++ boxed kernel: the dispatcher calls it without PythonKernelHolder (csrc/boxed.h)
        tensors.native.register_kernel(name, fn)
    elif _native_kernel is not None and name in view_kernels.NATIVE_KINDS:
        # a common view: C++ stride arithmetic, `fn` off its fast path (csrc/views.h); or
        # (None) PyTorch's composite kernel over those views
        kind = view_kernels.NATIVE_KINDS[name]
        if kind is not None:
            tensors.native.register_view(name, kind, fn)
    else:
        _lib.impl(name, fn, "PrivateUse1")
    _registered.add(name)


def _functional_kernel(low: Lowering):
    if low.output_mask is not None:
        return _masked_kernel(low)
    check = low.check
    op = low.overload
    fast = fast_path(low)
    if fast is not None:  # a cache hit served in one C++ call (csrc/hit.cpp)
        fast, state = fast
    if check is not None:  # what CPU rejects from the tensors' geometry (strides), unseen by JAX
        def checked(*args, **kwargs):
            if _SEEN[0] and carried.involved(args, kwargs):  # complex32, uint4, ...: eager/carried.py
                return carried.call(op, args, kwargs, lambda a, k: checked(*a, **k))
            check(*args, **kwargs)
            try:
                if fast is not None:
                    res = fast(state, args, kwargs)
                    if res is not NotImplemented:
                        return res
                return execute(low, args, kwargs)
            except carried.FirstSeen:  # the process's first carried dtype: see executor.execute
                return carried.call(op, args, kwargs, lambda a, k: checked(*a, **k))

    def kernel(*args, **kwargs):
        if _SEEN[0] and carried.involved(args, kwargs):
            return carried.call(op, args, kwargs, lambda a, k: execute(low, a, k))
        try:
            if fast is not None:
                res = fast(state, args, kwargs)
                if res is not NotImplemented:
                    return res
            return execute(low, args, kwargs)
        except carried.FirstSeen:  # the process's first carried dtype: see executor.execute
            return carried.call(op, args, kwargs, lambda a, k: execute(low, a, k))

    if low.name == "complex":  # two float16 tensors make a complex32 (an op without a check)
        return lambda real, imag: carried.complex_of_halves(real, imag, kernel)
    full = kernel if check is None else checked
    if fast is None or tensors.native is None:
        return full
    # fast() called from C++ without this module's Python frame (csrc/kernel.h), then the
    # executor's path where it declines; `full` serves every call once a carried dtype was seen
    # (a FirstSeen marks it seen, and `full` then serves that call again)
    return tensors.native.Kernel(state, check, functools.partial(execute, low), full, carried.FirstSeen)


def _masked_kernel(low: Lowering):
    """None for each output the lowering's mask argument masks off: the lowering returns a
    zero-size placeholder there, PyTorch an undefined tensor (convolution_backward, ...)."""
    name = low.output_mask
    idx = low.arg_index[name]
    fast = fast_path(low)
    if fast is not None:  # a cache hit served in one C++ call (csrc/hit.cpp)
        fast, state = fast

    def kernel(*args, **kwargs):
        res = NotImplemented if fast is None else fast(state, args, kwargs)
        if res is NotImplemented:
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


# (detach and alias have no kernel of ours: PyTorch's composite makes the alias, device-agnostic;
# a kernel registered for detach breaks nn.Parameter's _make_subclass)
def _boxed_fallback(op, *args, **kwargs):
    if fallback.is_view_op(op):
        return fallback.meta_view(op, args, kwargs)
    if fallback.is_inplace_view_op(op):
        return fallback.meta_inplace_view(op, args, kwargs)
    if _SEEN[0] and carried.involved(args, kwargs):  # complex32, uint4, ...: eager/carried.py
        return carried.call(op, args, kwargs, lambda a, k: _boxed_fallback(op, *a, **k))
    return fallback.run_on_cpu(op, args, kwargs)


def register_runtime() -> None:
    runtime_kernels.register(_impl, SERVED)
    view_kernels.register(_impl)
    _fallback_lib.fallback(_boxed_fallback, "PrivateUse1")
