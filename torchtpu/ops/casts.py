"""Casts as CPU PyTorch rounds them: float8 (every kind), float4 storage, float -> narrow int.

Casts. XLA's convert into a float8 type is IEEE-like: out of range is inf where the type has
one, NaN where it has none, and NaN keeps XLA's own bits. c10's conversions (the ones CPU
PyTorch runs) differ in three places, each a value test on the float32 source here:

- float8_e4m3fn saturates: every finite value past 448, and +-inf, becomes +-448;
- float8_e4m3fn and float8_e5m2 write a NaN as 0x7f with the source's sign bit;
- float8_e8m0fnu (exponent only, no sign) drops the sign and rounds the float32 exponent by its
  mantissa (round to nearest, ties to even); a float32 NaN or inf becomes its NaN (0xff).

c10 converts every source to float32 first (a float64 is rounded twice, an integer goes through
float32), and every float8 to float32 before any other type; `cast` does the same, so casts
into and out of float8 are bit-equal to CPU's. The fnuz types agree with XLA already.
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax


E4M3FN = jnp.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = jnp.dtype(ml_dtypes.float8_e5m2)
E4M3FNUZ = jnp.dtype(ml_dtypes.float8_e4m3fnuz)
E5M2FNUZ = jnp.dtype(ml_dtypes.float8_e5m2fnuz)
E8M0 = jnp.dtype(ml_dtypes.float8_e8m0fnu)
FLOAT8 = frozenset((E4M3FN, E5M2, E4M3FNUZ, E5M2FNUZ, E8M0))
FLOAT4_STORAGE = jnp.dtype(ml_dtypes.float8_e4m3b11fnuz)  # torch.float4_e2m1fn_x2 (runtime/jaxenv.py)
_F32 = jnp.dtype(jnp.float32)


def is_float8(x) -> bool:
    return jnp.dtype(getattr(x, "dtype", x)) in FLOAT8


def _nan_bits(y, bits):
    """Where `y` (float32) is NaN, c10's NaN: 0x7f with y's sign."""
    sign = (lax.bitcast_convert_type(y, jnp.uint32) >> 24).astype(jnp.uint8) & np.uint8(0x80)
    return jnp.where(jnp.isnan(y), sign | np.uint8(0x7F), bits)


def _to_e8m0(y):
    """float32 -> float8_e8m0fnu as c10 rounds it (sign dropped, exponent rounded)."""
    u = lax.bitcast_convert_type(y, jnp.uint32)
    exp = (u >> 23) & np.uint32(0xFF)
    g = (u & np.uint32(0x400000)) != 0
    rs = (u & np.uint32(0x3FFFFF)) != 0
    up = g & (rs | (exp > 0))
    out = jnp.where(exp == 0xFF, exp, exp + up.astype(jnp.uint32))
    return lax.bitcast_convert_type(out.astype(jnp.uint8), E8M0)


def _to_float8(y, dt):
    """float32 `y` -> float8 `dt`, bit-equal to c10's conversion."""
    if dt == E8M0:
        return _to_e8m0(y)
    if dt == E4M3FN:
        r = jnp.where(jnp.isnan(y), y, jnp.clip(y, -448.0, 448.0)).astype(dt)
    else:
        r = y.astype(dt)
    if dt in (E4M3FN, E5M2):
        bits = _nan_bits(y, lax.bitcast_convert_type(r, jnp.uint8))
        r = lax.bitcast_convert_type(bits, dt)
    return r


def cast(x, dtype):
    """`x.astype(dtype)` with CPU PyTorch's float8 conversions (see the module doc). Complex
    sources keep their real part, as torch's casts to a real type do (to bool: either part
    nonzero)."""
    x = jnp.asarray(x)
    dt = jnp.dtype(dtype)
    src = x.dtype
    if src == dt:
        return x
    if src == FLOAT4_STORAGE or dt == FLOAT4_STORAGE:  # its bytes, the only reading CPU has
        return lax.bitcast_convert_type(x, dt)
    if src.kind == "c" and dt == jnp.bool_:  # nonzero if either part is (torch's, numpy's)
        return x != 0
    if src.kind == "c" and dt.kind != "c":
        x = jnp.real(x)
    if src in FLOAT8:
        x = x.astype(_F32)  # exact
    if dt in _NARROW_INTS and jnp.issubdtype(x.dtype, jnp.floating):
        return _float_to_narrow_int(x, dt)
    if dt not in FLOAT8:
        return x.astype(dt)
    if x.dtype == jnp.float64 and dt == E8M0:
        return _f64_to_e8m0(x)
    if x.dtype != _F32:
        x = x.astype(_F32)
    return _to_float8(x, dt)


_NARROW_INTS = frozenset(jnp.dtype(d) for d in (jnp.int8, jnp.uint8, jnp.int16, jnp.uint16))


def _float_to_narrow_int(x, dt):
    """float -> (u)int8/16 as CPU's conversion does it: through int32, truncated toward zero,
    then wrapped (-1.5 -> 255 in uint8); a value outside int32 (or inf, NaN) gives int32's
    "indefinite" value 0x80000000, whose low bits are 0. XLA's convert saturates instead."""
    ok = jnp.abs(x) < 2.0 ** 31  # False for NaN
    return jnp.where(ok, x, 0).astype(jnp.int32).astype(dt)


def _f64_to_e8m0(x):
    """float64 -> e8m0 through float32 as c10 does; XLA's float64 -> float32 flushes float32's
    subnormals to zero, so below float32's smallest normal the rounding is decided here: the
    e8m0 code is 1 (2**-126) above the midpoint 2**-127 (+ half a float32 subnormal step, a tie
    rounding down to even), else 0."""
    a = jnp.abs(x)
    small = jnp.where(a > 2.0 ** -127 + 2.0 ** -150, np.uint8(1), np.uint8(0))
    big = lax.bitcast_convert_type(_to_e8m0(x.astype(_F32)), jnp.uint8)
    bits = jnp.where(a < 2.0 ** -126, small, big)
    return lax.bitcast_convert_type(bits, E8M0)


def zeros(shape, dtype):
    """jnp.zeros, except float8_e8m0fnu (no zero: XLA's convert of 0 is its NaN), whose CPU
    zeros are the code 0 (2**-127), as c10 rounds 0.0."""
    dt = jnp.dtype(dtype)
    if dt == E8M0:
        return lax.bitcast_convert_type(jnp.zeros(tuple(shape), jnp.uint8), E8M0)
    return jnp.zeros(tuple(shape), dt)


def full(shape, value, dtype):
    """jnp.full with the fill value cast as CPU casts it (500.0 into e4m3fn is 448)."""
    dt = jnp.dtype(dtype)
    return jnp.full(tuple(shape), cast(jnp.asarray(value), dt), dt)


def as_bytes(x, dtype=None):
    """A one-byte float array's bits as uint8 (dtype None), or uint8 bits as `dtype`."""
    return lax.bitcast_convert_type(x, jnp.uint8 if dtype is None else jnp.dtype(dtype))
