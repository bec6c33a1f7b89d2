"""The scaled and integer matmuls: `_scaled_mm`, `_int_mm`, `_weight_int8pack_mm`.

`_scaled_mm` is one dot in the float8 inputs with float32 accumulation
(`preferred_element_type`), its scales applied to the float32 product (tensorwise: one
scalar each; rowwise: a column of M and a row of N), the result cast as CPU casts (ops/casts.py:
an e4m3fn output saturates); CPU scales the operands before its float32 matmul, which differs
only by float32 rounding. `_int_mm` is an int8 dot accumulated in int32, exact;
`_weight_int8pack_mm` an int8 weight converted exactly to the activation's dtype inside a dot
accumulated in float32, scaled per output channel.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .casts import E4M3FN, E5M2, _F32, cast, is_float8
from .registry import lower


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
        raise ValueError(
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
