"""Reductions, scans, sorting, softmax."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ..runtime.jaxenv import to_jax_dtype
from ._common import LOW_FLOATS as _LOW_FLOATS
from ._common import is_complex as _is_complex, is_float as _is_float, is_intlike as _is_intlike
from ._common import opmath_dtype as _acc, real_dtype as _real_dtype, scalar_type_name, wrap_dim as _wrap
from .registry import lower

_I64 = jnp.dtype(jnp.int64)
_F32 = jnp.dtype(jnp.float32)


# --- helpers ------------------------------------------------------------------


def _dims(ndim: int, dim) -> tuple:
    """Normalised reduction axes; None or [] mean every axis. A 0-d tensor has none."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim))
    axes = [_wrap(d, ndim) for d in dim]
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"dim {axes[0]} appears multiple times in the list of dims")
    if ndim == 0:
        return ()
    return tuple(sorted(axes))


def _one_dim(ndim: int, dim: int):
    """(axis or None for 0-d) for single-dim ops."""
    d = _wrap(dim, ndim)
    return None if ndim == 0 else d


def _check_nonempty(name, x, axes):
    if x.size == 0:
        if not axes and x.ndim > 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
        for a in axes:
            if x.shape[a] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {a} to have non-zero size.")


def _sum_dtype(x, dtype):
    if dtype is not None:
        return jnp.dtype(to_jax_dtype(dtype))
    if _is_intlike(x.dtype):
        return _I64
    return jnp.dtype(x.dtype)


def _cast_in(x, out_dt):
    """Cast an input to the dtype it is accumulated in, for an op whose result is out_dt."""
    if _is_float(out_dt):
        return x.astype(_acc(out_dt))
    return x.astype(out_dt)


# --- sum / mean / prod --------------------------------------------------------


@lower("sum")
def sum_(self, dtype=None):
    return sum_dim(self, None, False, dtype=dtype)


@lower("sum.dim_IntList")
def sum_dim(self, dim, keepdim=False, dtype=None):
    out = _sum_dtype(self, dtype)
    axes = _dims(self.ndim, dim)
    r = jnp.sum(_cast_in(self, out), axis=axes, keepdims=keepdim)
    return r.astype(out)


@lower("nansum")
def nansum(self, dim=None, keepdim=False, dtype=None):
    if _is_complex(self.dtype):
        raise RuntimeError("nansum does not support complex inputs")
    out = _sum_dtype(self, dtype)
    x = _cast_in(self, out)
    if _is_float(x.dtype):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    axes = _dims(self.ndim, dim)
    return jnp.sum(x, axis=axes, keepdims=keepdim).astype(out)


def _mean_dtype(x, dtype, name="mean"):
    out = jnp.dtype(to_jax_dtype(dtype)) if dtype is not None else jnp.dtype(x.dtype)
    if not (_is_float(out) or _is_complex(out)):
        raise RuntimeError(
            f"{name}(): could not infer output dtype. "
            f"{'Input' if dtype is None else 'Optional'} dtype must be either a floating point or complex dtype. "
            f"Got: {_tname(out)}"
        )
    return out


_tname = scalar_type_name  # PyTorch's name of a dtype in error messages ("Long", "Float")


@lower("mean")
def mean(self, dtype=None):
    return mean_dim(self, None, False, dtype=dtype)


@lower("mean.dim")
def mean_dim(self, dim, keepdim=False, dtype=None):
    out = _mean_dtype(self, dtype)
    axes = _dims(self.ndim, dim)
    n = math.prod(self.shape[a] for a in axes)
    x = self.astype(_acc(out))
    r = jnp.sum(x, axis=axes, keepdims=keepdim) / jnp.asarray(n, _real_dtype(x.dtype))
    return r.astype(out)


@lower("prod")
def prod(self, dtype=None):
    out = _sum_dtype(self, dtype)
    return jnp.prod(_cast_in(self, out)).astype(out)


@lower("prod.dim_int")
def prod_dim(self, dim, keepdim=False, dtype=None):
    out = _sum_dtype(self, dtype)
    ax = _one_dim(self.ndim, dim)
    axes = () if ax is None else (ax,)
    return jnp.prod(_cast_in(self, out), axis=axes, keepdims=keepdim).astype(out)


# --- max / min ----------------------------------------------------------------


def _minmax_reduce(name, fn, self, dim, keepdim):
    axes = _dims(self.ndim, dim)
    _check_nonempty(name, self, axes)
    return fn(self, axis=axes, keepdims=keepdim).astype(self.dtype)


@lower("amax")
def amax(self, dim=(), keepdim=False):
    return _minmax_reduce("amax", jnp.max, self, dim, keepdim)


@lower("amin")
def amin(self, dim=(), keepdim=False):
    return _minmax_reduce("amin", jnp.min, self, dim, keepdim)


@lower("max")
def max_(self):
    if self.size == 0:
        raise RuntimeError(
            "max(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )
    return jnp.max(self).astype(self.dtype)


@lower("min")
def min_(self):
    if self.size == 0:
        raise RuntimeError(
            "min(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )
    return jnp.min(self).astype(self.dtype)


def _arg_extreme(x, axis, largest):
    """First index of the max (largest) / min along axis; NaN counts as the extreme."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    n = x.shape[axis]
    if _is_float(x.dtype):
        nan = jnp.isnan(x)
        ext = jnp.max(x, axis=axis, keepdims=True) if largest else jnp.min(x, axis=axis, keepdims=True)
        hit = nan | (x == ext)
    else:
        ext = jnp.max(x, axis=axis, keepdims=True) if largest else jnp.min(x, axis=axis, keepdims=True)
        hit = x == ext
    pos = lax.broadcasted_iota(_I64, x.shape, axis)
    return jnp.min(jnp.where(hit, pos, jnp.asarray(n, _I64)), axis=axis)


def _minmax_dim(name, self, dim, keepdim, largest):
    ax = _one_dim(self.ndim, dim)
    if ax is None:
        return self, jnp.zeros((), _I64)
    _check_nonempty(name, self, (ax,))
    idx = _arg_extreme(self, ax, largest)
    vals = jnp.take_along_axis(self, jnp.expand_dims(idx, ax), axis=ax)
    if not keepdim:
        vals = jnp.squeeze(vals, ax)
    else:
        idx = jnp.expand_dims(idx, ax)
    return vals, idx


@lower("max.dim")
def max_dim(self, dim, keepdim=False):
    return _minmax_dim("max", self, dim, keepdim, True)


@lower("min.dim")
def min_dim(self, dim, keepdim=False):
    return _minmax_dim("min", self, dim, keepdim, False)


def _argminmax(name, self, dim, keepdim, largest):
    if self.dtype == jnp.bool_:
        raise RuntimeError(f"{name}(): does not support bool input")
    if dim is None:
        if self.size == 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0."
            )
        flat = self.reshape(-1)
        idx = _arg_extreme(flat, 0, largest)
        if keepdim:
            idx = idx.reshape((1,) * self.ndim)
        return idx
    ax = _one_dim(self.ndim, dim)
    if ax is None:
        return jnp.zeros((), _I64)
    _check_nonempty(name, self, (ax,))
    idx = _arg_extreme(self, ax, largest)
    return jnp.expand_dims(idx, ax) if keepdim else idx


@lower("argmax")
def argmax(self, dim=None, keepdim=False):
    return _argminmax("argmax", self, dim, keepdim, True)


@lower("argmin")
def argmin(self, dim=None, keepdim=False):
    return _argminmax("argmin", self, dim, keepdim, False)


@lower("aminmax")
def aminmax(self, dim=None, keepdim=False):
    if dim is None:
        axes = tuple(range(self.ndim))
        _check_nonempty("aminmax", self, axes)
        mn = jnp.min(self, axis=axes, keepdims=keepdim)
        mx = jnp.max(self, axis=axes, keepdims=keepdim)
    else:
        ax = _one_dim(self.ndim, dim)
        axes = () if ax is None else (ax,)
        _check_nonempty("aminmax", self, axes)
        mn = jnp.min(self, axis=axes, keepdims=keepdim)
        mx = jnp.max(self, axis=axes, keepdims=keepdim)
    return mn.astype(self.dtype), mx.astype(self.dtype)


# --- var / std ----------------------------------------------------------------


def _var(self, dim, correction, keepdim, name):
    if not (_is_float(self.dtype) or _is_complex(self.dtype)):
        raise RuntimeError(
            f"{name}(): input dtype should be either floating point or complex dtypes. Got {_tname(self.dtype)} instead."
        )
    axes = _dims(self.ndim, dim)
    n = math.prod(self.shape[a] for a in axes)
    x = self.astype(_acc(self.dtype))
    rdt = _real_dtype(x.dtype)
    m = jnp.sum(x, axis=axes, keepdims=True) / jnp.asarray(n, rdt)
    d = x - m
    sq = (d.real * d.real + d.imag * d.imag) if _is_complex(x.dtype) else d * d
    c = jnp.asarray(1 if correction is None else correction, rdt)
    denom = jnp.maximum(jnp.asarray(n, rdt) - c, jnp.zeros((), rdt))
    v = jnp.sum(sq, axis=axes, keepdims=keepdim) / denom
    mean = m if keepdim else jnp.squeeze(m, axes) if axes else m.reshape(())
    return v, mean


@lower("var.correction")
def var(self, dim=None, correction=None, keepdim=False):
    v, _ = _var(self, dim, correction, keepdim, "var")
    return v.astype(_real_dtype(self.dtype))


@lower("std.correction")
def std(self, dim=None, correction=None, keepdim=False):
    v, _ = _var(self, dim, correction, keepdim, "std")
    return jnp.sqrt(v).astype(_real_dtype(self.dtype))


@lower("var_mean.correction")
def var_mean(self, dim=None, correction=None, keepdim=False):
    v, m = _var(self, dim, correction, keepdim, "var_mean")
    return v.astype(_real_dtype(self.dtype)), m.astype(self.dtype)


@lower("std_mean.correction")
def std_mean(self, dim=None, correction=None, keepdim=False):
    v, m = _var(self, dim, correction, keepdim, "std_mean")
    return jnp.sqrt(v).astype(_real_dtype(self.dtype)), m.astype(self.dtype)


# --- norms, logsumexp ---------------------------------------------------------


def _vector_norm(x, ord, axes, keepdim, out_dt):
    """out_dt: the (real) result dtype."""
    a = jnp.abs(x.astype(_acc(x.dtype))).astype(_acc(out_dt))
    ord = float(ord)
    if ord in (math.inf, -math.inf):
        _check_nonempty("linalg.vector_norm", x, axes)
        r = (jnp.max if ord > 0 else jnp.min)(a, axis=axes, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    elif ord == 1:
        r = jnp.sum(a, axis=axes, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    else:
        p = jnp.asarray(ord, a.dtype)
        r = jnp.sum(a ** p, axis=axes, keepdims=keepdim) ** (1 / p)
    return r.astype(out_dt)


def _norm_dtype(self, dtype, name):
    dt = jnp.dtype(to_jax_dtype(dtype)) if dtype is not None else jnp.dtype(self.dtype)
    if not (_is_float(dt) or _is_complex(dt)):
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got {_tname(dt)}")
    return _real_dtype(dt)


@lower("linalg_vector_norm", static=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    out = _norm_dtype(self, dtype, "linalg.vector_norm")
    x = self.astype(to_jax_dtype(dtype)) if dtype is not None else self
    return _vector_norm(x, ord, _dims(self.ndim, dim), keepdim, out)


@lower("norm.Scalar", static=("p",))
def norm_scalar(self, p=2):
    out = _norm_dtype(self, None, "norm")
    return _vector_norm(self, 2 if p is None else p, _dims(self.ndim, None), False, out)


@lower("norm.ScalarOpt_dim", static=("p",))
def norm_dim(self, p, dim, keepdim=False):
    out = _norm_dtype(self, None, "norm")
    return _vector_norm(self, 2 if p is None else p, _dims(self.ndim, dim), keepdim, out)


@lower("norm.ScalarOpt_dtype", static=("p",))
def norm_dtype(self, p, dtype):
    out = _norm_dtype(self, dtype, "norm")
    return _vector_norm(self.astype(to_jax_dtype(dtype)), 2 if p is None else p, _dims(self.ndim, None), False, out)


@lower("norm.ScalarOpt_dim_dtype", static=("p",))
def norm_dim_dtype(self, p, dim, keepdim, dtype):
    out = _norm_dtype(self, dtype, "norm")
    return _vector_norm(self.astype(to_jax_dtype(dtype)), 2 if p is None else p, _dims(self.ndim, dim), keepdim, out)


def _float_of(dt):
    """The float dtype an op that needs floats computes in (ints -> float32 default)."""
    dt = jnp.dtype(dt)
    if _is_float(dt) or _is_complex(dt):
        return dt
    import torch

    return jnp.dtype(to_jax_dtype(torch.get_default_dtype()))


def _logsumexp(x, axes, keepdim):
    if x.size == 0:
        return jnp.log(jnp.sum(jnp.exp(x), axis=axes, keepdims=keepdim))
    m = jnp.max(x, axis=axes, keepdims=True)
    m = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m)
    s = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    if not keepdim:
        s = jnp.squeeze(s, axes) if axes else s.reshape(x.shape if x.ndim == 0 else ())
    return s


@lower("logsumexp")
def logsumexp(self, dim, keepdim=False):
    out = _float_of(self.dtype)
    x = self.astype(_acc(out))
    return _logsumexp(x, _dims(self.ndim, dim), keepdim).astype(out)


# --- all / any / count_nonzero ------------------------------------------------


def _truth(x):
    return x if x.dtype == jnp.bool_ else (x != 0)


def _logical(fn, self, dim, keepdim):
    r = fn(_truth(self), axis=_dims(self.ndim, dim), keepdims=keepdim)
    return r.astype(jnp.uint8) if self.dtype == jnp.uint8 else r


@lower("all")
def all_(self):
    return _logical(jnp.all, self, None, False)


@lower("all.dim")
def all_dim(self, dim, keepdim=False):
    return _logical(jnp.all, self, [dim], keepdim)


@lower("all.dims")
def all_dims(self, dim=None, keepdim=False):
    return _logical(jnp.all, self, dim, keepdim)


@lower("any")
def any_(self):
    return _logical(jnp.any, self, None, False)


@lower("any.dim")
def any_dim(self, dim, keepdim=False):
    return _logical(jnp.any, self, [dim], keepdim)


@lower("any.dims")
def any_dims(self, dim=None, keepdim=False):
    return _logical(jnp.any, self, dim, keepdim)


@lower("count_nonzero.dim_IntList")
def count_nonzero_dims(self, dim):
    return jnp.sum(_truth(self).astype(_I64), axis=_dims(self.ndim, dim))


@lower("count_nonzero")
def count_nonzero(self, dim=None):
    return jnp.sum(_truth(self).astype(_I64), axis=_dims(self.ndim, None if dim is None else [dim]))


@lower("hash_tensor")
def hash_tensor(self, dim=(), keepdim=False, mode=0):
    """mode 0: xor of every element's 64-bit pattern (floats widened to float64, integers
    sign-extended to int64, bools 0/1), as PyTorch's xor_sum."""
    if mode != 0:
        raise RuntimeError(f"hash_tensor: mode {mode} is not supported (only mode 0, xor_sum)")
    if _is_complex(self.dtype):
        raise RuntimeError("hash_tensor: complex inputs are not supported")
    axes = _dims(self.ndim, dim)
    if self.size == 0 and not axes and self.ndim > 0:
        _check_nonempty("hash_tensor", self, axes)
    u64 = jnp.dtype(jnp.uint64)
    if self.dtype == jnp.bool_:
        bits = self.astype(u64)
    elif _is_float(self.dtype):
        bits = lax.bitcast_convert_type(self.astype(jnp.float64), u64)
    else:
        bits = lax.bitcast_convert_type(self.astype(_I64), u64)
    r = lax.reduce(bits, jnp.zeros((), u64), lax.bitwise_xor, axes)
    if keepdim:
        r = jnp.expand_dims(r, axes)
    return r


# --- scans --------------------------------------------------------------------


@lower("cumsum")
def cumsum(self, dim, dtype=None):
    out = _sum_dtype(self, dtype)
    ax = _one_dim(self.ndim, dim)
    x = _cast_in(self, out)
    if ax is None or x.size == 0:
        return x.astype(out)
    return lax.cumsum(x, axis=ax).astype(out)


@lower("cumprod")
def cumprod(self, dim, dtype=None):
    out = _sum_dtype(self, dtype)
    ax = _one_dim(self.ndim, dim)
    x = _cast_in(self, out)
    if ax is None or x.size == 0:
        return x.astype(out)
    return lax.cumprod(x, axis=ax).astype(out)


@lower("logcumsumexp", "_logcumsumexp")
def logcumsumexp(self, dim):
    out = _float_of(self.dtype)
    ax = _one_dim(self.ndim, dim)
    x = self.astype(_acc(out))
    if ax is None or x.size == 0:
        return x.astype(out)
    if _is_complex(x.dtype):
        def comb(a, b):
            m = jnp.where(a.real > b.real, a, b)
            m = jnp.where(jnp.isinf(m.real), jnp.zeros((), m.dtype), m)
            return jnp.log(jnp.exp(a - m) + jnp.exp(b - m)) + m

        return lax.associative_scan(comb, x, axis=ax).astype(out)
    return lax.cumlogsumexp(x, axis=ax).astype(out)


def _cum_extreme(self, dim, largest):
    ax = _one_dim(self.ndim, dim)
    if ax is None:
        return self, jnp.zeros((), _I64)
    if self.size == 0:
        return self, jnp.zeros(self.shape, _I64)
    idx = lax.broadcasted_iota(_I64, self.shape, ax)
    x = self.astype(jnp.int8) if self.dtype == jnp.bool_ else self
    isf = _is_float(x.dtype)

    def comb(a, b):
        va, ia = a
        vb, ib = b
        better = (vb >= va) if largest else (vb <= va)
        if isf:
            take_b = jnp.isnan(vb) | (~jnp.isnan(va) & better)
        else:
            take_b = better
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    v, i = lax.associative_scan(comb, (x, idx), axis=ax)
    return v.astype(self.dtype), i


@lower("cummax")
def cummax(self, dim):
    return _cum_extreme(self, dim, True)


@lower("cummin")
def cummin(self, dim):
    return _cum_extreme(self, dim, False)


# --- sorting --------------------------------------------------------------------


def _sort_keys(x, descending):
    """Keys whose ascending lexicographic order is the wanted order; NaN is the largest."""
    dt = jnp.dtype(x.dtype)
    if dt == jnp.bool_:
        x = x.astype(jnp.uint8)
        return [1 - x] if descending else [x]
    if _is_float(dt):
        nan = jnp.isnan(x)
        v = jnp.where(nan | (x == 0), jnp.zeros((), dt), x)
        if descending:
            return [(~nan).astype(jnp.uint8), -v]
        return [nan.astype(jnp.uint8), v]
    if _is_complex(dt):
        raise RuntimeError("sort(): complex dtypes are not supported")
    return [~x] if descending else [x]


def _sort(x, ax, descending):
    """Stable sort along ax; returns (values, int64 indices)."""
    idx = lax.broadcasted_iota(_I64, x.shape, ax)
    if x.size == 0:
        return x, idx
    keys = _sort_keys(x, descending)
    out = lax.sort(tuple(keys) + (x, idx), dimension=ax, is_stable=True, num_keys=len(keys))
    return out[-2], out[-1]


@lower("sort")
def sort(self, dim=-1, descending=False):
    ax = _one_dim(self.ndim, dim)
    if ax is None:
        return self, jnp.zeros((), _I64)
    return _sort(self, ax, descending)


@lower("sort.stable")
def sort_stable(self, stable=None, dim=-1, descending=False):
    return sort(self, dim, descending)



# --- CPU-exact selection (ties) ----------------------------------------------------
# PyTorch CPU's topk (libstdc++ std::nth_element + std::sort of the first k-1) and
# kthvalue (Sedgewick quickselect) are not stable: among equal values the index they
# return depends on the algorithm's swaps. These emulate the algorithms one row at a time
# (vmapped while-loops); they only run when a row set has ties (or for unsorted topk).


def _swap(v, ix, a, b):
    va, vb = v[a], v[b]
    ia, ib = ix[a], ix[b]
    return v.at[a].set(vb).at[b].set(va), ix.at[a].set(ib).at[b].set(ia)

def _lt_fn(largest, isf):
    # comp(x, y): x goes before y
    def comp(x, y):
        if largest:
            r = x > y
            if isf:
                r = r | (jnp.isnan(x) & ~jnp.isnan(y))
        else:
            r = x < y
            if isf:
                r = r | (~jnp.isnan(x) & jnp.isnan(y))
        return r
    return comp

def quickselect_1d(v, k, isf):
    """PyTorch CPU kthvalue's quick_select (Sedgewick) on one row: returns (vals, idx)."""
    n = v.shape[0]
    gt = _lt_fn(True, isf)
    ix = jnp.arange(n, dtype=jnp.int64)
    I = lambda x: jnp.asarray(x, jnp.int64)

    def cond(s):
        return ~s[4]

    def body(s):
        v, ix, L, R, done = s
        two = R == L + 1
        def small(args):
            v, ix = args
            sw = gt(v[L], v[R])
            v2, ix2 = _swap(v, ix, L, R)
            return jnp.where(sw, v2, v), jnp.where(sw, ix2, ix), L, R, jnp.bool_(True)
        def big(args):
            v, ix = args
            P = (L + R) >> 1
            v, ix = _swap(v, ix, P, L + 1)
            def cswap(v, ix, a, b):
                sw = gt(v[a], v[b])
                v2, ix2 = _swap(v, ix, a, b)
                return jnp.where(sw, v2, v), jnp.where(sw, ix2, ix)
            v, ix = cswap(v, ix, L + 1, R)
            v, ix = cswap(v, ix, L, R)
            v, ix = cswap(v, ix, L + 1, L)
            piv = v[L]
            def pcond(p):
                return ~p[4]
            def pbody(p):
                v, ix, i, j, _ = p
                # bounds guards: never hit by a live row, but vmap keeps stepping finished rows
                i = lax.while_loop(lambda i: (i < R) & gt(piv, v[i]), lambda i: i + 1, i + 1)
                j = lax.while_loop(lambda j: (j > L) & gt(v[j], piv), lambda j: j - 1, j - 1)
                brk = j < i
                v2, ix2 = _swap(v, ix, i, j)
                return jnp.where(brk, v, v2), jnp.where(brk, ix, ix2), i, j, brk
            v, ix, i, j, _ = lax.while_loop(pcond, pbody, (v, ix, L + 1, R, jnp.bool_(False)))
            v, ix = _swap(v, ix, L, j)
            L2 = jnp.where(j <= k, i, L)
            R2 = jnp.where(j >= k, j - 1, R)
            return v, ix, L2, R2, jnp.bool_(False)
        v, ix, L, R, done = lax.cond(two, small, big, (v, ix))
        done = done | (R <= L)
        return v, ix, L, R, done

    s = (v, ix, I(0), I(n - 1), jnp.bool_(n <= 1))
    v, ix, *_ = lax.while_loop(cond, body, s)
    return v, ix


def _insertion_sort_range(v, ix, first, last, comp):
    """libstdc++ __insertion_sort on [first, last) (stable)."""
    def obody(i, s):
        v, ix = s
        val, vi = v[i], ix[i]
        def icond(c):
            v, ix, j = c
            return (j > first) & comp(val, v[j - 1])
        def ibody(c):
            v, ix, j = c
            return v.at[j].set(v[j - 1]), ix.at[j].set(ix[j - 1]), j - 1
        v, ix, j = lax.while_loop(icond, ibody, (v, ix, i))
        return v.at[j].set(val), ix.at[j].set(vi)
    return lax.fori_loop(first + 1, jnp.maximum(last, first + 1), obody, (v, ix))


def nth_element_1d(v, nth, comp):
    """libstdc++ std::nth_element (introselect; the rare depth-limit heap path is not emulated)."""
    n = v.shape[0]
    ix = jnp.arange(n, dtype=jnp.int64)
    I = lambda x: jnp.asarray(x, jnp.int64)

    def cond(s):
        return s[3] - s[2] > 3

    def body(s):
        v, ix, first, last = s
        mid = first + (last - first) // 2
        a, b, c = first + 1, mid, last - 1
        ab, bc, ac = comp(v[a], v[b]), comp(v[b], v[c]), comp(v[a], v[c])
        pick = jnp.where(ab, jnp.where(bc, b, jnp.where(ac, c, a)),
                         jnp.where(ac, a, jnp.where(bc, c, b)))
        v, ix = _swap(v, ix, first, pick)
        piv = v[first]

        def pcond(p):
            return ~p[4]

        def pbody(p):
            v, ix, lo, hi, _ = p
            # bounds guards: never hit by a live row, but vmap keeps stepping finished rows
            lo = lax.while_loop(lambda l: (l < last - 1) & comp(v[l], piv), lambda l: l + 1, lo)
            hi = lax.while_loop(lambda h: (h > first) & comp(piv, v[h]), lambda h: h - 1, hi - 1)
            stop = ~(lo < hi)
            v2, ix2 = _swap(v, ix, lo, hi)
            return (jnp.where(stop, v, v2), jnp.where(stop, ix, ix2),
                    jnp.where(stop, lo, lo + 1), hi, stop)

        v, ix, cut, _, _ = lax.while_loop(pcond, pbody, (v, ix, first + 1, last, jnp.bool_(False)))
        first2 = jnp.where(cut <= nth, cut, first)
        last2 = jnp.where(cut <= nth, last, cut)
        return v, ix, first2, last2

    v, ix, first, last = lax.while_loop(cond, body, (v, ix, I(0), I(n)))
    return _insertion_sort_range(v, ix, first, last, comp)


def _has_ties(x, ax):
    """Whether some row along ax holds two equal values (NaNs count as equal)."""
    if x.shape[ax] < 2:
        return jnp.bool_(False)
    v, _ = _sort(x, ax, False)
    a = lax.slice_in_dim(v, 0, x.shape[ax] - 1, axis=ax)
    b = lax.slice_in_dim(v, 1, x.shape[ax], axis=ax)
    eq = a == b
    if _is_float(x.dtype):
        eq = eq | (jnp.isnan(a) & jnp.isnan(b))
    return jnp.any(eq)


def _rowwise(fn, x, ax):
    """Apply fn(row) -> (values, indices) to every 1-D row along ax."""
    xm = jnp.moveaxis(x, ax, -1)
    rows = xm.reshape(-1, xm.shape[-1])
    v, i = jax.vmap(fn)(rows)
    v = jnp.moveaxis(v.reshape(xm.shape[:-1] + v.shape[-1:]), -1, ax)
    i = jnp.moveaxis(i.reshape(xm.shape[:-1] + i.shape[-1:]), -1, ax)
    return v, i


@lower("topk")
def topk(self, k, dim=-1, largest=True, sorted=True):
    ax = _one_dim(self.ndim, dim)
    n = 1 if ax is None else self.shape[ax]
    if not 0 <= k <= n:
        raise RuntimeError("selected index k out of range")
    if ax is None:
        return self, jnp.zeros((), _I64)
    def fast(x):
        v, i = _sort(x, ax, largest)
        return lax.slice_in_dim(v, 0, k, axis=ax), lax.slice_in_dim(i, 0, k, axis=ax)

    if k == 0 or self.size == 0 or k * 64 <= n:
        # (CPU's partial_sort path for small k is not emulated: ties keep the stable order)
        return fast(self)
    x = self.astype(jnp.uint8) if self.dtype == jnp.bool_ else self
    comp = _lt_fn(largest, _is_float(x.dtype))

    def row(r):
        v, ix = nth_element_1d(r, k - 1, comp)
        if sorted:  # std::sort of k-1 <= 16 elements is an insertion sort
            v, ix = _insertion_sort_range(v, ix, 0, k - 1, comp)
        return v[:k], ix[:k]

    def exact(x):
        return _rowwise(row, x, ax)

    if not sorted:
        v, i = exact(x)
    else:
        v, i = lax.cond(_has_ties(x, ax), exact, fast, x)
    return v.astype(self.dtype), i


@lower("kthvalue")
def kthvalue(self, k, dim=-1, keepdim=False):
    ax = _one_dim(self.ndim, dim)
    n = 1 if ax is None else self.shape[ax]
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    if ax is None:
        return self, jnp.zeros((), _I64)
    def fast(x):
        v, i = _sort(x, ax, False)
        return lax.slice_in_dim(v, k - 1, k, axis=ax), lax.slice_in_dim(i, k - 1, k, axis=ax)

    x = self.astype(jnp.uint8) if self.dtype == jnp.bool_ else self
    isf = _is_float(x.dtype)

    def row(r):
        v, ix = quickselect_1d(r, k - 1, isf)
        return v[k - 1:k], ix[k - 1:k]

    v, i = lax.cond(_has_ties(x, ax), lambda x: _rowwise(row, x, ax), fast, x)
    if not keepdim:
        v, i = jnp.squeeze(v, ax), jnp.squeeze(i, ax)
    return v.astype(self.dtype), i


def _median_along(x, ax, ignore_nan):
    """(value, index) of the lower median along ax, keepdims=True."""
    v, i = _sort(x, ax, False)
    n = x.shape[ax]
    if _is_float(x.dtype):
        nnan = jnp.sum(jnp.isnan(x), axis=ax, keepdims=True).astype(_I64)
        valid = n - nnan
        if ignore_nan:
            k = jnp.maximum((valid - 1) // 2, 0)
        else:
            k = jnp.where(nnan > 0, valid, jnp.asarray((n - 1) // 2, _I64))
    else:
        shape = list(x.shape)
        shape[ax] = 1
        k = jnp.full(shape, (n - 1) // 2, _I64)
    return jnp.take_along_axis(v, k, axis=ax), jnp.take_along_axis(i, k, axis=ax)


def _median_all(self, ignore_nan):
    if self.size == 0:
        return jnp.full((), jnp.nan, self.dtype) if _is_float(self.dtype) else jnp.zeros((), self.dtype)
    v, _ = _median_along(self.reshape(-1), 0, ignore_nan)
    return v.reshape(())


def _median_dim(name, self, dim, keepdim, ignore_nan):
    ax = _one_dim(self.ndim, dim)
    if ax is None:
        return self, jnp.zeros((), _I64)
    _check_nonempty(name, self, (ax,))
    v, i = _median_along(self, ax, ignore_nan)
    if not keepdim:
        v, i = jnp.squeeze(v, ax), jnp.squeeze(i, ax)
    return v, i


@lower("median")
def median(self):
    return _median_all(self, False)


@lower("nanmedian")
def nanmedian(self):
    return _median_all(self, True)


@lower("median.dim")
def median_dim(self, dim, keepdim=False):
    return _median_dim("median", self, dim, keepdim, False)


@lower("nanmedian.dim")
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim("nanmedian", self, dim, keepdim, True)


@lower("mode")
def mode(self, dim=-1, keepdim=False):
    ax = _one_dim(self.ndim, dim)
    if ax is None:
        return self, jnp.zeros((), _I64)
    _check_nonempty("mode", self, (ax,))
    x = jnp.moveaxis(self, ax, -1)
    v, i = _sort(x, x.ndim - 1, False)
    n = x.shape[-1]
    pos = lax.broadcasted_iota(_I64, v.shape, v.ndim - 1)
    if n > 1:
        same = v[..., 1:] == v[..., :-1]
        start = jnp.concatenate([jnp.ones(v.shape[:-1] + (1,), bool), ~same], axis=-1)
    else:
        start = jnp.ones(v.shape, bool)
    run_start = lax.cummax(jnp.where(start, pos, 0), axis=v.ndim - 1)
    count = pos - run_start + 1
    best = jnp.argmax(count, axis=-1, keepdims=True)  # first position with the largest count
    val = jnp.take_along_axis(v, best, axis=-1)[..., 0]
    idx = jnp.take_along_axis(i, best, axis=-1)[..., 0]  # the run's last original index
    if keepdim:
        val, idx = jnp.expand_dims(val, ax), jnp.expand_dims(idx, ax)
    return val, idx


# --- softmax ----------------------------------------------------------------------


def _softmax_common(self, dim, half_to_float, log):
    ax = _one_dim(self.ndim, dim)
    out = jnp.dtype(self.dtype)
    if half_to_float:
        if out not in _LOW_FLOATS:
            raise RuntimeError("conversion is supported for Half type only")
        out = _F32
    x = self.astype(_acc(self.dtype))
    if ax is None:
        r = jnp.zeros_like(x) if log else jnp.ones_like(x)
        return r.astype(out)
    if x.size == 0:
        return x.astype(out)
    m = lax.stop_gradient(jnp.max(x, axis=ax, keepdims=True))
    m = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m)
    s = x - m
    e = jnp.exp(s)
    tot = jnp.sum(e, axis=ax, keepdims=True)
    r = s - jnp.log(tot) if log else e / tot
    return r.astype(out)


@lower("_softmax")
def _softmax(self, dim, half_to_float):
    return _softmax_common(self, dim, half_to_float, False)


@lower("_log_softmax")
def _log_softmax(self, dim, half_to_float):
    return _softmax_common(self, dim, half_to_float, True)


@lower("_softmax_backward_data")
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    out = jnp.dtype(to_jax_dtype(input_dtype))
    ax = _one_dim(output.ndim, dim)
    g = grad_output.astype(_acc(grad_output.dtype))
    y = output.astype(_acc(output.dtype))
    if ax is None:
        return (g - g * y).astype(out)  # y == 1: the gradient is zero
    r = y * (g - jnp.sum(g * y, axis=ax, keepdims=True))
    return r.astype(out)


@lower("_log_softmax_backward_data")
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    out = jnp.dtype(to_jax_dtype(input_dtype))
    ax = _one_dim(output.ndim, dim)
    g = grad_output.astype(_acc(grad_output.dtype))
    y = output.astype(_acc(output.dtype))
    if ax is None:
        return (g - jnp.exp(y) * g).astype(out)
    r = g - jnp.exp(y) * jnp.sum(g, axis=ax, keepdims=True)
    return r.astype(out)
