"""Indexing, gather/scatter, masking.

Index validity: PyTorch raises on an out-of-range index. Inside a compiled
program we cannot raise, so each lowering declares a device-side check
(ops/checks.py) with CPU's exception class and message, raised at the next host
read; the program itself keeps XLA's semantics: gathers (index, index_select,
gather, take) clamp an invalid index into range and scatters (index_put,
scatter*, index_add/copy/fill, put) drop the update (what runs with
TORCHTPU_CHECKS=0). Negative indices follow PyTorch where PyTorch accepts them
(index, index_put, take, put wrap them like Python indices); where PyTorch
rejects them (gather, scatter, index_select, ...) they fail the check.

Data-dependent output shapes (nonzero, masked_select, unique) are hand-written
kernels: they compute on the device and read back only the size they need.
Indexing with a boolean mask (index, index_put) is served by kernels in
eager/composites/indexing.py that run the private lowerings INDEX / INDEX_PUT.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import sync_debug
from ..runtime.jaxenv import to_jax_dtype, to_torch_dtype
from . import checks
from ._common import scalar_type_name, wrap_dim as _wrap
from .registry import kernel, lower, private


def _is_mask(a) -> bool:
    return a is not None and a.dtype in (jnp.bool_, jnp.uint8)


def _grid(index, dim):
    """An index tuple addressing self[..., index, ...] along `dim` for every position of `index`."""
    nd = index.ndim
    out = []
    for d in range(nd):
        if d == dim:
            out.append(index)
        else:
            shape = [1] * nd
            shape[d] = index.shape[d]
            out.append(jnp.arange(index.shape[d], dtype=jnp.int64).reshape(shape))
    return tuple(out)


def _along(self, dim, index):
    """An index tuple selecting `index` (1-D) along `dim` with full slices elsewhere."""
    return (slice(None),) * dim + (index,)


def _fit(src, shape):
    """src sliced down to `shape` (torch lets src/self be larger than index in gather/scatter)."""
    if tuple(src.shape) == tuple(shape):
        return src
    return src[tuple(slice(0, s) for s in shape)]


# --- index / index_put -----------------------------------------------------


def _index_tuple(self, indices):
    idx = []
    for a in indices:
        idx.append(slice(None) if a is None else a)
    return tuple(idx)


def _check_advanced(self, indices):
    """x[idx] / x[idx] = v: each index tensor addresses its own dimension, negatives
    from the end (masks were turned into positions or are checked by shape)."""
    d = 0
    k = 0  # CPU numbers the dimension among the indexed ones: x[:, i] reports "dimension 0"
    for a in indices:
        if a is None or isinstance(a, slice):
            d += 1
            continue
        if _is_mask(a):
            d += a.ndim
            k += a.ndim
            continue
        if d < self.ndim:
            checks.index_in_range(a, self.shape[d], k, negative=True, exc=IndexError)
        d += 1
        k += 1


@private("index.Tensor")
def INDEX(self, indices):
    """x[indices], every boolean mask already turned into positions (the kernel reads them)."""
    _check_advanced(self, indices)
    return self.at[_index_tuple(self, indices)].get(mode="clip")


def _single_mask(self, indices):
    """(position, mask) if the indices are one boolean mask surrounded by None entries."""
    masks = [i for i, a in enumerate(indices) if _is_mask(a)]
    if len(masks) != 1 or any(a is not None for i, a in enumerate(indices) if i != masks[0]):
        return None
    m = masks[0]
    if indices[m].ndim == 0:
        return None
    return m, indices[m]


def _index_put_fn(self, indices, values, accumulate=False, unsafe=False):
    _check_advanced(self, indices)
    values = values.astype(self.dtype)
    single = _single_mask(self, indices)
    if single is not None:
        p, mask = single
        mask = mask.astype(jnp.bool_)
        k = mask.ndim
        rest = self.shape[p + k:]
        # where the nnz dim of the indexed shape (self.shape[:p] + (nnz,) + rest) sits in `values`
        vpos = values.ndim - len(rest) - 1
        if vpos >= 0 and values.shape[vpos] != 1:
            n = values.shape[vpos]
            nz = jnp.nonzero(mask, size=n, fill_value=tuple(mask.shape))  # padding is dropped
            idx = (slice(None),) * p + tuple(nz)
            if accumulate:
                return _reduce_into(self, idx, values, "add")
            return self.at[idx].set(values, mode="drop")
        target = self.shape[:p] + (1,) + rest
        v = jnp.broadcast_to(values, target).reshape(self.shape[:p] + (1,) * k + rest)
        v = jnp.broadcast_to(v, self.shape)
        mb = mask.reshape((1,) * p + mask.shape + (1,) * len(rest))
        if accumulate:
            if self.dtype == jnp.bool_:
                return self | (mb & v)
            return self + jnp.where(mb, v, jnp.zeros((), self.dtype))
        return jnp.where(mb, v, self)
    idx = _index_tuple(self, indices)
    if accumulate and self.dtype == jnp.bool_:
        return self.at[idx].max(values, mode="drop")
    if accumulate:
        return self.at[idx].add(values, mode="drop")
    return self.at[idx].set(values, mode="drop")


INDEX_PUT = private("_index_put_impl_")(_index_put_fn)


# --- index_select / gather / scatter ---------------------------------------


def _out_of_range_in_self(v, _):
    return "index out of range in self"


@lower("index_select")
def index_select(self, dim, index):
    if self.ndim == 0:
        checks.index_in_range(index, 1, message=_out_of_range_in_self)
        return jnp.take(self.reshape(1), index.reshape(-1), axis=0, mode="clip").reshape(())
    dim = _wrap(dim, self.ndim)
    checks.index_in_range(index, self.shape[dim], dim, message=_out_of_range_in_self)
    return jnp.take(self, index.reshape(-1), axis=dim, mode="clip")


@lower("embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """weight[indices] (PyTorch's composite is index_select + view: one program here)."""
    if weight.ndim != 2:  # the composite's first check
        raise RuntimeError("'weight' must be 2-D")
    checks.index_in_range(indices, weight.shape[0], message=_out_of_range_in_self)
    return jnp.take(weight, indices, axis=0, mode="clip")


@lower("gather")
def gather(self, dim, index, sparse_grad=False):
    if index.ndim == 0 or self.ndim == 0:
        s = self.reshape(-1)
        checks.index_in_range(index, s.shape[0], 0, exc=RuntimeError)
        return jnp.take(s, index.reshape(-1), mode="clip").reshape(index.shape)
    dim = _wrap(dim, self.ndim)
    checks.index_in_range(index, self.shape[dim], dim, exc=RuntimeError)
    if index.size == 0:
        return jnp.zeros(index.shape, self.dtype)
    return self.at[_grid(index, dim)].get(mode="clip")


def _scatter_idx(self, dim, index):
    if self.ndim == 0:
        return None
    dim = _wrap(dim, self.ndim)
    checks.index_in_range(index, self.shape[dim], dim, exc=RuntimeError)
    return _grid(index, dim)


def _identity(dtype, reduce):
    dtype = jnp.dtype(dtype)
    if reduce in ("sum", "mean", "add"):
        return jnp.zeros((), dtype)
    if reduce in ("prod", "multiply"):
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.array(reduce == "amin", dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.array(info.min if reduce == "amax" else info.max, dtype)


def _reduce_into(self, idx, src, reduce, include_self=True):
    """self with src reduced into positions idx (a jnp index tuple)."""
    if reduce is None:
        return self.at[idx].set(src, mode="drop")
    if self.dtype == jnp.bool_:  # XLA has no boolean add/multiply: or / and
        reduce = {"sum": "amax", "add": "amax", "prod": "amin", "multiply": "amin"}.get(reduce, reduce)
    if not include_self:
        base = self.at[idx].set(_identity(self.dtype, reduce), mode="drop")
    else:
        base = self
    if reduce in ("sum", "add"):
        return base.at[idx].add(src, mode="drop")
    if reduce in ("prod", "multiply"):
        return base.at[idx].multiply(src, mode="drop")
    if reduce == "amax":
        return base.at[idx].max(src, mode="drop")
    if reduce == "amin":
        return base.at[idx].min(src, mode="drop")
    if reduce == "mean":
        acc = self.dtype  # PyTorch accumulates in the tensor's own dtype here (half too)
        sums = base.astype(acc).at[idx].add(src.astype(acc), mode="drop")
        cdt = jnp.int64 if not jnp.issubdtype(self.dtype, jnp.floating) else acc
        counts = jnp.full(self.shape, 1 if include_self else 0, cdt).at[idx].add(
            jnp.ones(src.shape, cdt), mode="drop"
        )
        counts = jnp.maximum(counts, 1)
        if jnp.issubdtype(self.dtype, jnp.floating) or jnp.issubdtype(self.dtype, jnp.complexfloating):
            return (sums / counts).astype(self.dtype)
        return jnp.floor_divide(sums, counts.astype(sums.dtype)).astype(self.dtype)
    raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")


def _scatter(self, dim, index, src, reduce):
    if index.size == 0:
        return self
    if self.ndim == 0:
        checks.index_in_range(index, 1, 0, exc=RuntimeError)
        s = self.reshape(1)
        i = index.reshape(1)
        src = jnp.asarray(src).reshape(1).astype(self.dtype)
        return _reduce_into(s, (i,), src, reduce).reshape(())
    idx = _scatter_idx(self, dim, index)
    if jnp.ndim(src) == 0:
        src = jnp.broadcast_to(jnp.asarray(src).astype(self.dtype), index.shape)
    else:
        src = _fit(src, index.shape).astype(self.dtype)
    if reduce is None:
        return self.at[idx].set(src, mode="drop")
    return _reduce_into(self, idx, src, reduce)


@lower("scatter.src", "scatter.value")
def scatter(self, dim, index, src=None, value=None):
    return _scatter(self, dim, index, src if src is not None else value, None)


@lower("scatter.reduce", "scatter.value_reduce")
def scatter_reduce_legacy(self, dim, index, src=None, value=None, *, reduce):
    if reduce not in ("add", "multiply"):
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
    return _scatter(self, dim, index, src if src is not None else value, reduce)


@lower("scatter_add")
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


@lower("scatter_reduce.two")
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if index.size == 0:
        return self
    if self.ndim == 0:
        checks.index_in_range(index, 1, 0, exc=RuntimeError)
        out = _reduce_into(self.reshape(1), (index.reshape(1),), src.reshape(1).astype(self.dtype), reduce,
                           include_self)
        return out.reshape(())
    idx = _scatter_idx(self, dim, index)
    return _reduce_into(self, idx, _fit(src, index.shape).astype(self.dtype), reduce, include_self)


def _dim_index(self, dim, index, exc=IndexError, prefix="", negative=False):
    dim = _wrap(dim, max(self.ndim, 1))
    index = index.reshape(-1)
    size = self.shape[dim] if self.ndim else 1

    def message(v, _):
        return f"{prefix}index {v} is out of bounds for dimension {dim} with size {size}"

    if exc is None:  # CPU's index_select-like path: 1-d index_add
        checks.index_in_range(index, size, dim, message=_out_of_range_in_self)
    else:
        checks.index_in_range(index, size, dim, exc=exc, message=message, negative=negative)
    return dim, index


@lower("index_add")
def index_add(self, dim, index, source, *, alpha=1):
    if self.dtype == jnp.bool_:
        src = source.astype(jnp.bool_) & (jnp.asarray(alpha) != 0)
    else:
        src = (source * alpha).astype(self.dtype)
    dim, index = _dim_index(self, dim, index, RuntimeError if self.ndim > 1 else None)
    if self.ndim == 0:
        return _reduce_into(self.reshape(1), (index.reshape(-1),), src.reshape(-1), "add").reshape(())
    src = src if src.ndim == self.ndim else src.reshape(src.shape + (1,) * (self.ndim - src.ndim))
    return _reduce_into(self, _along(self, dim, index), src, "add")


@lower("index_copy")
def index_copy(self, dim, index, source):
    dim, index = _dim_index(self, dim, index, IndexError, "index_copy_(): ")
    if self.ndim == 0:
        return self.reshape(1).at[index.reshape(-1)].set(source.reshape(-1).astype(self.dtype),
                                                         mode="drop").reshape(())
    return self.at[_along(self, dim, index)].set(source.reshape(
        self.shape[:dim] + (index.shape[0],) + self.shape[dim + 1:]).astype(self.dtype), mode="drop")


@lower("index_fill.int_Scalar", "index_fill.int_Tensor")
def index_fill(self, dim, index, value):
    v = jnp.asarray(value).astype(self.dtype)
    dim, index = _dim_index(self, dim, index, IndexError, negative=True)  # CPU wraps negatives here
    if self.ndim == 0:
        return self.reshape(1).at[index.reshape(-1)].set(v, mode="drop").reshape(())
    return self.at[_along(self, dim, index)].set(v, mode="drop")


@lower("index_reduce")
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    dim = _wrap(dim, max(self.ndim, 1))
    index = index.reshape(-1)
    checks.index_in_range(index, self.shape[dim] if self.ndim else 1, dim, message=_out_of_range_in_self)
    if self.ndim == 0:
        return _reduce_into(self.reshape(1), (index.reshape(-1),), source.reshape(-1).astype(self.dtype), reduce,
                            include_self).reshape(())
    src = source.reshape(self.shape[:dim] + (index.shape[0],) + self.shape[dim + 1:]).astype(self.dtype)
    return _reduce_into(self, _along(self, dim, index), src, reduce, include_self)


@lower("masked_scatter")
def masked_scatter(self, mask, source):
    if mask.dtype != jnp.bool_:
        name = torch.empty(0, dtype=to_torch_dtype(mask.dtype)).type().split(".")[-1].removesuffix("Tensor")
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {name}")
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    s = jnp.broadcast_to(self, shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    if m.size == 0:
        return s
    pos = jnp.cumsum(m.astype(jnp.int64)) - 1
    src = source.reshape(-1).astype(self.dtype)
    # CPU: "Number of elements of source < number of ones in mask" (XLA would repeat the last)
    checks.report(pos[-1] >= src.size, message="Number of elements of source < number of ones in mask")
    if src.size == 0:
        return s
    picked = src[jnp.clip(pos, 0, src.size - 1)]
    return jnp.where(m, picked, s.reshape(-1)).reshape(shape)


def _take_message(n):
    def message(v, _):
        return f"out of range: tried to access index {v} on a tensor of {n} elements."
    return message


@lower("take")
def take(self, index):
    flat = self.reshape(-1)
    checks.index_in_range(index, flat.size, negative=True, message=_take_message(flat.size))
    if flat.size == 0:
        return jnp.zeros(index.shape, self.dtype)
    return flat.at[jnp.where(index < 0, index + flat.size, index)].get(mode="clip")


@lower("put")
def put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    i = index.reshape(-1)
    checks.index_in_range(i, flat.size, negative=True, message=_take_message(flat.size))
    i = jnp.where(i < 0, i + flat.size, i)
    src = source.reshape(-1).astype(self.dtype)
    if accumulate:
        return _reduce_into(flat, (i,), src, "add").reshape(self.shape)
    return flat.at[i].set(src, mode="drop").reshape(self.shape)


# --- data-dependent shapes -------------------------------------------------


def _value(t):
    from ..runtime import transfer

    return transfer.value(t)


def _new(shape, dtype, arr):
    from ..runtime import tensors

    return tensors.empty(tuple(shape), dtype, jnp.asarray(arr).reshape(-1))


@jax.jit
def _count_nonzero(v):
    return jnp.count_nonzero(v)


@functools.partial(jax.jit, static_argnums=(1,))
def _nonzero_at(v, n):
    if v.ndim == 0:
        return jnp.zeros((n, 0), jnp.int64)
    return jnp.stack(jnp.nonzero(v, size=n, fill_value=0), axis=1).astype(jnp.int64)


@kernel("nonzero")
def nonzero(self):
    v = _value(self)
    sync_debug.host_sync()  # (the result's size is read on the host)
    n = int(_count_nonzero(v))
    return _new((n, self.dim()), torch.int64, _nonzero_at(v, n))


@kernel("nonzero.out")
def nonzero_out(self, *, out):
    r = nonzero(self)
    out.resize_(r.shape)
    out.copy_(r)
    return out


@lower("nonzero_static")
def nonzero_static(self, *, size, fill_value=-1):
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    cnt = jnp.count_nonzero(self)
    nz = jnp.stack(jnp.nonzero(self, size=size, fill_value=0), axis=1).astype(jnp.int64)
    keep = (jnp.arange(size) < cnt)[:, None]
    return jnp.where(keep, nz, jnp.asarray(fill_value, jnp.int64))


@functools.partial(jax.jit, static_argnums=(2,))
def _masked_select_at(v, m, n):
    return v.reshape(-1)[jnp.nonzero(m.reshape(-1), size=n, fill_value=0)[0]]


@kernel("masked_select")
def masked_select(self, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    v = jnp.broadcast_to(_value(self), shape)
    m = jnp.broadcast_to(_value(mask), shape)
    sync_debug.host_sync()  # (the result's size is read on the host)
    n = int(_count_nonzero(m))
    return _new((n,), self.dtype, _masked_select_at(v, m, n))


@kernel("masked_select.out")
def masked_select_out(self, mask, *, out):
    r = masked_select(self, mask)
    out.resize_(r.shape)
    out.copy_(r)
    return out


def _empty_long():
    return _new((0,), torch.int64, jnp.zeros((0,), jnp.int64))


def _rows(v, axis):
    """v with `axis` moved first and the rest flattened: (n, k)."""
    n = v.shape[axis]
    return jnp.moveaxis(v, axis, 0).reshape(n, -1)


@functools.partial(jax.jit, static_argnums=(1,))
def _count_unique(v, axis):
    if axis is None:
        s = jnp.sort(v.reshape(-1))
        return 1 + jnp.count_nonzero(s[1:] != s[:-1])
    r = _rows(v, axis)
    order = jnp.lexsort(r.T[::-1]) if r.shape[1] else jnp.arange(r.shape[0])
    s = r[order]
    return 1 + jnp.count_nonzero(jnp.any(s[1:] != s[:-1], axis=1))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unique_at(v, axis, n):
    # equal_nan=False: CPU's sorted unique keeps every NaN apart (NaN != NaN), as counted above
    vals, inv, cnt = jnp.unique(v.reshape(-1) if axis is None else v, axis=axis, size=n,
                                return_inverse=True, return_counts=True, equal_nan=False)
    return vals, inv.reshape(-1).astype(jnp.int64), cnt.astype(jnp.int64)


def _unique(v, axis):
    n_along = v.size if axis is None else v.shape[axis]
    if n_along == 0:
        shape = (0,) if axis is None else v.shape
        return jnp.zeros(shape, v.dtype), jnp.zeros((0,), jnp.int64), jnp.zeros((0,), jnp.int64)
    sync_debug.host_sync()  # (the result's size is read on the host)
    n = int(_count_unique(v, axis))
    return _unique_at(v, axis, n)


@kernel("_unique2")
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    vals, inv, cnt = _unique(_value(self), None)
    out = _new(vals.shape, self.dtype, vals)
    inv_t = _new(self.shape, torch.int64, inv) if return_inverse else _empty_long()
    cnt_t = _new(cnt.shape, torch.int64, cnt) if return_counts else _empty_long()
    return out, inv_t, cnt_t


@kernel("_unique")
def _unique_k(self, sorted=True, return_inverse=False):
    out, inv, _ = _unique2(self, sorted, return_inverse, False)
    return out, inv


@kernel("unique_dim")
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    dim = _wrap(dim, self.dim())
    vals, inv, cnt = _unique(_value(self), dim)
    return (
        _new(vals.shape, self.dtype, vals),
        _new((self.shape[dim],), torch.int64, inv),
        _new(cnt.shape, torch.int64, cnt),
    )


@functools.partial(jax.jit, static_argnums=(1,))
def _runs(v, axis):
    r = _rows(v, axis)
    return jnp.concatenate([jnp.ones((1,), bool), jnp.any(r[1:] != r[:-1], axis=1)])


@functools.partial(jax.jit, static_argnums=(1, 2))
def _consecutive_at(v, axis, n):
    change = _runs(v, axis)
    starts = jnp.nonzero(change, size=n, fill_value=0)[0]
    inv = jnp.cumsum(change.astype(jnp.int64)) - 1
    cnt = jnp.diff(jnp.append(starts, change.shape[0])).astype(jnp.int64)
    return jnp.take(v, starts, axis=axis), inv, cnt


def _consecutive(v, axis):
    """(values, inverse, counts) of runs along `axis` of v."""
    if v.shape[axis] == 0:
        return v, jnp.zeros((0,), jnp.int64), jnp.zeros((0,), jnp.int64)
    sync_debug.host_sync()  # (the result's size is read on the host)
    n = int(jnp.count_nonzero(_runs(v, axis)))
    return _consecutive_at(v, axis, n)


@kernel("unique_consecutive")
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    v = _value(self)
    if dim is None:
        vals, inv, cnt = _consecutive(v.reshape(-1), 0)
        inv_shape = self.shape
    else:
        dim = _wrap(dim, self.dim())
        vals, inv, cnt = _consecutive(v, dim)
        inv_shape = (self.shape[dim],)
    out = _new(vals.shape, self.dtype, vals)
    inv_t = _new(inv_shape, torch.int64, inv) if return_inverse else _empty_long()
    cnt_t = _new(cnt.shape, torch.int64, cnt) if return_counts else _empty_long()
    return out, inv_t, cnt_t


@kernel("unique_dim_consecutive")
def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    dim = _wrap(dim, self.dim())
    vals, inv, cnt = _consecutive(_value(self), dim)
    return (
        _new(vals.shape, self.dtype, vals),
        _new((self.shape[dim],), torch.int64, inv),
        _new(cnt.shape, torch.int64, cnt),
    )


def _check_repeats(repeats) -> None:
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        name = scalar_type_name(to_jax_dtype(repeats.dtype))
        raise NotImplementedError(f'"repeat_interleave_cpu" not implemented for \'{name}\'')


def repeat_interleave_sized(repeats, output_size):
    """repeat_interleave(repeats, output_size=n) from lowered ops, with no host read: output
    position i belongs to the first j whose running total exceeds i. A size or a repeat that
    does not add up raises CPU's error from the device (torch.compile decomposes to this too)."""
    _check_repeats(repeats)
    if repeats.numel() == 0:  # CPU: empty, whatever output_size says
        return torch.empty(0, dtype=repeats.dtype, device=repeats.device)
    ends = torch.cumsum(repeats, 0)
    torch._assert_async((repeats >= 0).all(), "repeats can not be negative")
    torch._assert_async(ends[-1] == output_size, "allocated size does not match required size")
    pos = torch.arange(output_size, dtype=ends.dtype, device=repeats.device)
    return torch.searchsorted(ends, pos, right=True).to(repeats.dtype)


@kernel("repeat_interleave.Tensor")
def repeat_interleave_tensor(repeats, *, output_size=None):
    if output_size is not None:
        return repeat_interleave_sized(repeats, output_size)
    _check_repeats(repeats)
    r = _value(repeats).reshape(-1)
    sync_debug.host_sync()  # (the result's size is read on the host)
    counts = np.asarray(r)  # the size is data-dependent: one read to the host serves both checks
    if (counts < 0).any():
        raise RuntimeError("repeats can not be negative")
    output_size = int(counts.sum())
    out = jnp.repeat(jnp.arange(r.shape[0], dtype=jnp.int64), r, total_repeat_length=output_size)
    return _new((output_size,), repeats.dtype, out.astype(to_jax_dtype(repeats.dtype)))


@lower("embedding_renorm_")
def embedding_renorm_(self, indices, max_norm, norm_type):
    """In place (the only overload): rows of `self` named in `indices` rescaled to norm <= max_norm."""
    used = jnp.zeros((self.shape[0],), jnp.bool_).at[indices.reshape(-1)].set(True, mode="drop")
    acc = jnp.float32 if self.dtype in (jnp.float16, jnp.bfloat16) else self.dtype
    w = self.astype(acc)
    if norm_type == float("inf"):
        norm = jnp.max(jnp.abs(w), axis=1)
    elif norm_type == 0:
        norm = jnp.sum(w != 0, axis=1).astype(acc)
    else:
        norm = jnp.sum(jnp.abs(w) ** norm_type, axis=1) ** (1.0 / norm_type)
    scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (w * scale[:, None].astype(acc)).astype(self.dtype)
