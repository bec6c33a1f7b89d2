"""Helpers the op families share: dtype predicates, PyTorch's opmath dtype, dim wrapping.

Each dtype helper takes a dtype or an array (its dtype is read), so the families that
test arrays (pointwise) and those that test dtypes (reductions) use the same ones.
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes

# float16/bfloat16: computed and accumulated in float32 (PyTorch's opmath type)
LOW_FLOATS = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
_F32 = jnp.dtype(jnp.float32)


def _dtype(x) -> jnp.dtype:
    return jnp.dtype(getattr(x, "dtype", x))


def is_bool(x) -> bool:
    return _dtype(x) == jnp.bool_


def is_int(x) -> bool:
    """Integer (signed or unsigned), not bool."""
    return bool(jnp.issubdtype(_dtype(x), jnp.integer))


def is_intlike(x) -> bool:
    """Integer or bool: exact types (rounding is the identity on them)."""
    return is_int(x) or is_bool(x)


_FLOAT4_STORAGE = jnp.dtype(ml_dtypes.float8_e4m3b11fnuz)  # torch.float4_e2m1fn_x2 (runtime/jaxenv.py)


def is_float(x) -> bool:
    """A real floating type (not complex); not float4_e2m1fn_x2, whose bytes are only stored."""
    dt = _dtype(x)
    return bool(jnp.issubdtype(dt, jnp.floating)) and dt != _FLOAT4_STORAGE


def is_complex(x) -> bool:
    return bool(jnp.issubdtype(_dtype(x), jnp.complexfloating))


def real_dtype(x) -> jnp.dtype:
    """complex64 -> float32, complex128 -> float64; any other dtype unchanged."""
    dt = _dtype(x)
    if dt == jnp.complex64:
        return _F32
    if dt == jnp.complex128:
        return jnp.dtype(jnp.float64)
    return dt


def opmath_dtype(x) -> jnp.dtype:
    """The computation/accumulation dtype: float32 for float16/bfloat16, else the dtype itself."""
    dt = _dtype(x)
    return _F32 if dt in LOW_FLOATS else dt


def wrap_dim(d: int, ndim: int) -> int:
    """A dim in [-ndim, ndim) as a non-negative one (a 0-d tensor takes -1 and 0), or
    PyTorch's IndexError."""
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return d % n


_SCALAR_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                      "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                      "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64", "bool": "Bool",
                      "complex32": "ComplexHalf",
                      "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
                      "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def scalar_type_name(dt) -> str:
    """c10's name of a dtype (a JAX/NumPy dtype or a torch.dtype), as PyTorch's kernel errors
    print it ("Long", "Float")."""
    name = str(dt).removeprefix("torch.") if type(dt).__module__ == "torch" else jnp.dtype(dt).name
    return _SCALAR_TYPE_NAMES.get(name, name)
