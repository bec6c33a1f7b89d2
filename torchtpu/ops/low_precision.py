"""float8 casts as CPU PyTorch rounds them, and the scaled and integer matmuls.

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

`_scaled_mm` is one dot in the float8 inputs with float32 accumulation
(`preferred_element_type`), its scales applied to the float32 product (tensorwise: one
scalar each; rowwise: a column of M and a row of N); CPU scales the operands before its float32
matmul, which differs only by float32 rounding. `_int_mm` is an int8 dot accumulated in int32,
exact; `_weight_int8pack_mm` an int8 weight upcast in the dot, scaled per output channel.
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from jax import lax

from .registry import lower

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
    sources keep their real part, as torch's casts to a real type do."""
    x = jnp.asarray(x)
    dt = jnp.dtype(dtype)
    src = x.dtype
    if src == dt:
        return x
    if src == FLOAT4_STORAGE or dt == FLOAT4_STORAGE:  # its bytes, the only reading CPU has
        return lax.bitcast_convert_type(x, dt)
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


# ---- matmuls ---------------------------------------------------------------------------------

def _dot_f32(a, b):
    """a @ b for 2-d float8 operands, accumulated in float32. Two different float8 types (e5m2 x
    e4m3) meet in bfloat16, which holds every value of each exactly."""
    if a.dtype != b.dtype:
        a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _scaled_mm_check(self, mat2, scale_a, scale_b, bias, scale_result):
    """CPU's argument checks (ATen's _scaled_mm_out_cpu): raised at the issuing line, from
    shapes and dtypes only."""
    a, b, sa, sb = self, mat2, scale_a, scale_b
    if a.ndim != 2 or b.ndim != 2:
        raise RuntimeError(f"{'mat_a' if a.ndim != 2 else 'mat_b'} must be a matrix")

    def tensorwise(t, s):
        return is_float8(t) and s.dtype == _F32 and s.size == 1

    def rowwise(t, s, rows):
        return is_float8(t) and s.dtype == _F32 and s.ndim == 2 and s.shape == rows

    if tensorwise(a, sa) and tensorwise(b, sb):
        kind = "tensorwise"
    elif rowwise(a, sa, (a.shape[0], 1)) and rowwise(b, sb, (1, b.shape[1])):
        kind = "rowwise"
    else:
        raise RuntimeError(
            "Invalid scaling configuration.\n"
            "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
            f"- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be "
            f"({a.shape[0]}, 1) and scale_b should be (1, {b.shape[1]}), and both should be contiguous.")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"mat_a and mat_b shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
            f"{b.shape[0]}x{b.shape[1]})")
    if scale_result is not None and (scale_result.size != 1 or scale_result.dtype != _F32):
        raise RuntimeError("scale_result must be a float scalar")
    if bias is not None and bias.size != b.shape[1]:
        raise RuntimeError(f"Bias must be size {b.shape[1]} but got {bias.size}")
    return kind


@lower("_scaled_mm", static=("out_dtype", "use_fast_accum"))
def scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
              use_fast_accum=False):
    from ..runtime.jaxenv import to_jax_dtype

    kind = _scaled_mm_check(self, mat2, scale_a, scale_b, bias, scale_result)
    out = to_jax_dtype(out_dtype) if out_dtype is not None else self.dtype
    acc = _dot_f32(self, mat2)
    if kind == "tensorwise":
        acc = acc * (scale_a.reshape(()) * scale_b.reshape(()))
    else:
        acc = acc * scale_a * scale_b
    if bias is not None:
        acc = acc + bias.astype(_F32)
    if scale_result is not None and out in (E4M3FN, E5M2):
        acc = acc * (1.0 / scale_result.reshape(()))
    return cast(acc, out)


@lower("_int_mm")
def int_mm(self, mat2):
    if self.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"Expected 2D tensor for {'self' if self.ndim != 2 else 'mat2'}")
    if self.dtype != jnp.int8 or mat2.dtype != jnp.int8:
        raise RuntimeError(f"Expected self and mat2 to be int8, got {self.dtype} and {mat2.dtype}")
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(
            f"self.size(1) needs to match mat2.size(0) but got {self.shape[1]} and {mat2.shape[0]}")
    return lax.dot_general(self, mat2, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


@lower("_weight_int8pack_mm")
def weight_int8pack_mm(self, mat2, scales):
    """x (M, K) @ w.T (w int8, (N, K)) * scales (N,): the int8 weight converted exactly to x's
    dtype inside the dot, accumulated in float32, rounded once to x's dtype (CPU's kernel
    accumulates in float32 too)."""
    if self.ndim != 2 or mat2.ndim != 2 or mat2.dtype != jnp.int8:
        raise RuntimeError("_weight_int8pack_mm: expected 2D activations and a 2D int8 weight")
    if self.shape[1] != mat2.shape[1] or scales.shape != (mat2.shape[0],):
        raise RuntimeError("_weight_int8pack_mm: expected mat2 of shape (N, K) and scales of shape (N,)")
    if scales.dtype != self.dtype:
        raise RuntimeError(
            f"expected scalar type {torch_name(self.dtype)} but found {torch_name(scales.dtype)}")
    acc = lax.dot_general(self, mat2.astype(self.dtype), (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32)
    return (acc * scales.astype(_F32)).astype(self.dtype)


def torch_name(dt) -> str:
    from ._common import scalar_type_name

    return scalar_type_name(dt)
