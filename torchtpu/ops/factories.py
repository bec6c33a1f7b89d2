"""Tensor factories: arange, linspace, full, eye, scalar_tensor.

The functional factories (with a `dtype=` argument) are lowerings; their
`out=` overloads (the only overload `arange` has) are small kernels that call
the functional one with the out tensor's dtype and copy the result in, so the
result is computed in PyTorch's dtype rather than cast afterwards.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
import torch

from ..runtime.jaxenv import to_jax_dtype
from . import casts, promotion
from .registry import kernel, lower



def _default():
    return torch.get_default_dtype()


def _into(out, r, by_numel=False):
    """Copy r into out. by_numel (arange, linspace, logspace): as CPU, an out with r's number of
    elements keeps its shape and strides and is filled in its own element order (linspace into a
    narrowed 2-d view); only one of another size is resized to r's."""
    if by_numel and out.numel() == r.numel():
        out.copy_(r.reshape(out.shape))
        return out
    if out.shape != r.shape:
        out.resize_(r.shape)
    out.copy_(r)
    return out


def _is_int_dtype(dt) -> bool:
    return not (dt.is_floating_point or dt.is_complex)


# --- arange ----------------------------------------------------------------


def _num(v):
    if isinstance(v, torch.Tensor):
        return v.item()
    return v


def _arange_size(start, end, step, dtype):
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(float(start)) and math.isfinite(float(end))):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    if dtype == torch.int64:
        s, e, st = int(start), int(end), int(step)
        sgn = (st > 0) - (st < 0)
        num = e - s + st - sgn
        q = abs(num) // abs(st)
        return q if (num >= 0) == (st > 0) else -q
    return int(math.ceil((float(end) - float(start)) / float(step)))


def _arange_impl(start, end, step, dtype):
    start, end, step = _num(start), _num(end), _num(step)
    if dtype is None:
        dtype = _default() if any(isinstance(v, float) for v in (start, end, step)) else torch.int64
    n = max(_arange_size(start, end, step, dtype), 0)
    jdt = to_jax_dtype(dtype)
    if _is_int_dtype(dtype) and dtype != torch.bool:
        acc = jnp.int64
        s, st = int(start), int(step)
        if dtype == torch.int64 or (isinstance(start, int) and isinstance(step, int)):
            return (jnp.asarray(s, acc) + jnp.arange(n, dtype=acc) * jnp.asarray(st, acc)).astype(jdt)
    v = jnp.asarray(float(start), jnp.float64) + jnp.arange(n, dtype=jnp.float64) * jnp.asarray(
        float(step), jnp.float64
    )
    return v.astype(jdt)


@lower("arange.start_step", static=("start", "end", "step"))
def arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_impl(start, end, step, dtype)


@lower("arange.start", static=("start", "end"))
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_impl(start, end, 1, dtype)


@lower("arange", static=("end",))
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_impl(0, end, 1, dtype)


@kernel("arange.start")
def arange_shifted(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    """An integer range as arange(n) + start: its executable is keyed by the length alone
    and start rides as a runtime scalar, so the positions arange(t, t + 1) of a decoding
    loop compile once, not once per token."""
    kw = dict(dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
    if type(start) is not int or type(end) is not int or not (dtype is None or _is_int_dtype(dtype)) \
            or dtype == torch.bool:
        return torch.ops.aten.arange.start_step(start, end, 1, **kw)
    r = torch.ops.aten.arange.default(_arange_size(start, end, 1, torch.int64), **kw)
    return r + start if start else r


@kernel("arange.start_out")
def arange_start_out(start, end, step=1, *, out):
    r = torch.ops.aten.arange.start_step(start, end, step, dtype=out.dtype, device=out.device)
    return _into(out, r, by_numel=True)


@kernel("arange.out")
def arange_out(end, *, out):
    return arange_start_out(0, end, 1, out=out)


# --- linspace / logspace ---------------------------------------------------


def _steps_check(steps):
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")


def _is_complex_value(v) -> bool:
    return isinstance(v, complex) or (hasattr(v, "dtype") and jnp.iscomplexobj(v))


def _space(start, end, steps, dtype, base=None):
    if dtype is None:  # as CPU infers it: a complex start or end gives the default complex dtype
        dtype = _default()
        if _is_complex_value(start) or _is_complex_value(end):
            dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    jdt = to_jax_dtype(dtype)
    if steps == 0:
        return jnp.zeros((0,), jdt)
    integral = _is_int_dtype(dtype)
    if base is None:
        # integral: start/end cast to the dtype first, the step in double
        if integral:
            s = jnp.asarray(start).astype(jdt).astype(jnp.float64)
            e = jnp.asarray(end).astype(jdt).astype(jnp.float64)
            cdt = jnp.float64
        else:
            cdt = jnp.float32 if dtype in (torch.float16, torch.bfloat16) else jdt
            s = jnp.asarray(start).astype(jdt).astype(cdt)
            e = jnp.asarray(end).astype(jdt).astype(cdt)
    else:
        cdt = jnp.float64 if integral else (jnp.float32 if dtype in (torch.float16, torch.bfloat16) else jdt)
        s = jnp.asarray(start).astype(cdt)
        e = jnp.asarray(end).astype(cdt)
    if dtype in (torch.float16, torch.bfloat16):
        def rnd(a):  # PyTorch does this arithmetic in the half type: round after each op
            return a.astype(jdt).astype(cdt)
    else:
        def rnd(a):
            return a
    if steps == 1:
        v = jnp.reshape(s, (1,))
    else:
        # the barrier keeps XLA from dividing by a constant as a multiply by its reciprocal, which
        # is inexact in float64 (an integral linspace(0, 999999, 1000000) came out 0, 0, 1, 2, ...)
        step = rnd((e - s) / lax.optimization_barrier(jnp.asarray(steps - 1, cdt)))
        idx = jnp.arange(steps, dtype=jnp.int64)
        half = steps // 2
        lo = rnd(s + rnd(step * idx.astype(cdt)))
        hi = rnd(e - rnd(step * (steps - idx - 1).astype(cdt)))
        v = jnp.where(idx < half, lo, hi)
    if base is not None:
        v = jnp.power(jnp.asarray(base, cdt), v)
    if integral and dtype != torch.bool:
        v = jnp.trunc(v) if jnp.issubdtype(v.dtype, jnp.floating) else v
    return v.astype(jdt)


@lower("linspace", "linspace.Tensor_Tensor", "linspace.Tensor_Scalar", "linspace.Scalar_Tensor")
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    _steps_check(steps)
    return _space(start, end, steps, dtype)


@kernel("linspace.out")
def linspace_out(start, end, steps, *, out):
    r = torch.ops.aten.linspace.default(start, end, steps, dtype=out.dtype, device=out.device)
    return _into(out, r, by_numel=True)


@lower("logspace", "logspace.Tensor_Tensor", "logspace.Tensor_Scalar", "logspace.Scalar_Tensor")
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    _steps_check(steps)
    return _space(start, end, steps, dtype, base)


@kernel("logspace.out")
def logspace_out(start, end, steps, base=10.0, *, out):
    r = torch.ops.aten.logspace.default(start, end, steps, base, dtype=out.dtype, device=out.device)
    return _into(out, r, by_numel=True)


# --- full / zeros / ones / scalar_tensor / eye -----------------------------


def _fill_dtype(value):
    kind = promotion.proxy(value)
    if isinstance(kind, bool):
        return torch.bool
    if isinstance(kind, int):
        return torch.int64
    if isinstance(kind, complex):
        return torch.complex128 if _default() == torch.float64 else torch.complex64
    if isinstance(kind, torch.Tensor):
        return kind.dtype
    return _default()


def _fill(shape, value, dtype):
    jdt = to_jax_dtype(dtype)
    v = jnp.asarray(value)
    if jdt == jnp.bool_:
        v = v != 0
        return jnp.full(tuple(shape), v, jdt)
    return casts.full(shape, v, jdt)  # complex -> real, float8 as CPU rounds


@lower("full")
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, fill_value, dtype or _fill_dtype(fill_value))


@lower("zeros")
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or _default()
    return casts.zeros(size, to_jax_dtype(dtype))


@lower("ones")
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or _default()
    return jnp.ones(tuple(size), to_jax_dtype(dtype))


@lower("scalar_tensor")
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill((), s, dtype or _default())


def _eye(n, m, dtype):
    if n < 0 or m < 0:
        raise RuntimeError(f"n must be greater or equal to 0, got {min(n, m)}")
    return jnp.eye(n, m, dtype=to_jax_dtype(dtype or _default()))


@lower("eye")
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye(n, n, dtype)


@lower("eye.m")
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye(n, m, dtype)


@kernel("eye.out")
def eye_out(n, *, out):
    return _into(out, torch.ops.aten.eye.m(n, n, dtype=out.dtype, device=out.device))


@kernel("eye.m_out")
def eye_m_out(n, m, *, out):
    return _into(out, torch.ops.aten.eye.m(n, m, dtype=out.dtype, device=out.device))


# --- tril_indices / triu_indices -------------------------------------------


def _tri_indices(row, col, offset, dtype, upper):
    if row < 0 or col < 0:
        raise RuntimeError("row and col must be non-negative")
    r, c = (np.triu_indices if upper else np.tril_indices)(row, offset, col)
    return jnp.asarray(np.stack([r, c]).astype(np.int64)).astype(to_jax_dtype(dtype or torch.int64))


@lower("tril_indices")
def tril_indices(row, col, offset=0, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, dtype, False)


@lower("triu_indices")
def triu_indices(row, col, offset=0, *, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, dtype, True)
