"""View kernels for the tpu dispatch key: a view is an alias of its base's storage with new
geometry (runtime/tensors.alias), computed on meta stand-ins (eager/fallback.meta_view) or,
for the common views, by stride arithmetic (the fast paths below). eager/kernels.py
registers them; where the C++ extension is built, the common views (NATIVE_KINDS) are C++
kernels (csrc/views.h) and these Python ones serve only the calls those hand back."""
from __future__ import annotations

import torch

from ..ops._common import wrap_dim
from ..ops.registry import overload
from ..runtime import tensors
from ..runtime.jaxenv import CARRIED, CARRIED_SEEN as _SEEN
from . import dynamism, fallback


_view = torch.ops.aten.view.default
_reshape_alias_op = torch.ops.aten._reshape_alias.default


def view(self, size):
    try:
        return _view.redispatch(tensors.META, self, size)
    except RuntimeError:
        # a growth's padded tensor has its bucket's strides where CPU's is contiguous
        if dynamism.unpad_for_view(self):
            return _view.redispatch(tensors.META, self, size)
        if dynamism.state.graph_views:
            # a compiled graph run eagerly over dynamic tensors (compile/runtime._deferred):
            # traced with CPU's strides, its view of an intermediate may meet a bucket's. The
            # graph is functional (nothing writes an intermediate), so a contiguous copy
            # serves as the view would
            return _view.redispatch(tensors.META, self.clone(memory_format=torch.contiguous_format), size)
        raise


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
    """ops/_common.wrap_dim, or None off the fast path (the meta path raises PyTorch's error)."""
    try:
        return wrap_dim(dim, ndim)
    except (IndexError, TypeError):
        return None


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


# The views served in C++ (csrc/views.h: the same arithmetic, without PythonKernelHolder and a
# Python frame per view), each with its kind there; eager/kernels._impl registers them so, with
# the Python kernel serving what the C++ one leaves (errors, symbolic sizes, a growth's padded
# tensor). as_strided's Python kernel is eager/runtime_kernels.py's. None: no kernel of ours
# once the C++ views exist, PyTorch's composite serves the op over them (split.Tensor's
# narrows: 4.0 us for four chunks against 7.8 through the Python kernel).
NATIVE_KINDS = {"select.int": 0, "slice.Tensor": 1, "t": 2, "transpose.int": 3, "permute": 4,
                "unsqueeze": 5, "squeeze.dim": 6, "expand": 7, "view": 8, "_reshape_alias": 9,
                "as_strided": 10, "split.Tensor": None}


def register(impl) -> None:
    """Register these kernels through `impl(name, fn)` (eager/kernels.py)."""
    impl("view", view)
    impl("_reshape_alias", _reshape_alias)
    for name, fast in _FAST_VIEWS.items():
        impl(name, _fast_view_op(name, fast))
    for name in ("view.dtype", "unfold", "view_as_real", "view_as_complex"):
        impl(name, view_kernel(overload(name)))
    # In-place geometry ops have composite kernels that check bounds against the
    # zero-byte storage; ours computes the geometry on a meta stand-in instead.
    for name in ("transpose_", "t_", "unsqueeze_", "squeeze_", "squeeze_.dim", "squeeze_.dims",
                 "as_strided_", "swapaxes_", "swapdims_"):
        impl(name, _inplace_view_kernel(overload(name)))
