"""Elementwise ops: arithmetic, math functions, comparisons, logic, activations.

Conventions:
- `promote=KIND` lowerings receive their promoted arguments already cast to PyTorch's
  computation dtype (float16/bfloat16 -> float32) and have their single result cast to
  PyTorch's result dtype by the executor.
- Multi-output lowerings (tuples) and ops whose dtype rule depends on a plain argument
  (div's rounding_mode) promote by hand with `promotion.promote`.
- Formulas follow PyTorch's CPU kernels (aten/src/ATen/native/cpu) so edge cases agree:
  NaN propagation, signed zeros, integer wraparound and integer division rounding.
"""
from __future__ import annotations

import math

import jax
import torch
import jax.numpy as jnp
from jax import lax

from . import casts
from . import checks as _checks
from ._common import LOW_FLOATS
from ._common import is_bool as _is_bool, is_complex as _is_complex, is_float as _is_float
from ._common import is_int as _is_int, is_intlike as _is_exact
from .promotion import promote as _promote
from .promotion import result_dtypes as _result_dtypes
from .registry import (
    ALWAYS_BOOL,
    COMPLEX_TO_FLOAT,
    DEFAULT,
    LOWERINGS,
    INT_TO_FLOAT,
    NO_OPMATH,
    lower,
)

# --- dtype helpers ------------------------------------------------------------


def _is_signed_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.signedinteger)


def _opmath(*xs):
    """Upcast float16/bfloat16 arrays to float32 (PyTorch's opmath) for hand-promoted ops."""
    return [x.astype(jnp.float32) if x is not None and jnp.dtype(x.dtype) in LOW_FLOATS else x for x in xs]


def _bcast(*xs):
    return jnp.broadcast_arrays(*[jnp.asarray(x) for x in xs])


def _zeros_like(x):
    return jnp.zeros(jnp.shape(x), x.dtype)


def _ones_like(x):
    return jnp.ones(jnp.shape(x), x.dtype)


def _unary(names, fn, promote=INT_TO_FLOAT):
    if isinstance(names, str):
        names = (names,)

    def lowering(self):
        return fn(self)

    lowering.__name__ = names[0].replace(".", "_")
    lower(*names, promote=promote)(lowering)
    return lowering


# --- arithmetic ---------------------------------------------------------------


def _is_one(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


@lower("add.Tensor", "add.Scalar", promote=DEFAULT)
def add(self, other, alpha=1):
    if _is_one(alpha):
        return self + other
    return self + other * alpha


@lower("sub.Tensor", "sub.Scalar", promote=DEFAULT)
def sub(self, other, alpha=1):
    if _is_one(alpha):
        return self - other
    return self - other * alpha


def _alpha_check(self, other, alpha=1):
    # CPU's alpha_check on the result dtype; the meta kernel misses the bool-input case
    # (PyTorch's test_alpha_mismatch: torch.add(bool, bool, alpha=1.1) computed on tpu)
    if type(alpha) is int or alpha is None:
        return
    dt = torch.result_type(self, other)
    if isinstance(alpha, bool) and dt != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if not (dt.is_floating_point or dt.is_complex or isinstance(alpha, (bool, int))):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if isinstance(alpha, complex) and not dt.is_complex:
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex number.")


for _name in ("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar"):
    LOWERINGS[_name].check = _alpha_check


@lower("rsub.Tensor", "rsub.Scalar", promote=DEFAULT)
def rsub(self, other, alpha=1):
    if _is_one(alpha):
        return other - self
    return other - self * alpha


@lower("mul.Tensor", "mul.Scalar", promote=DEFAULT)
def mul(self, other):
    if _is_bool(self) and _is_bool(other):
        return self & other
    return self * other


@lower("div.Tensor", "div.Scalar", promote=INT_TO_FLOAT)
def div(self, other):
    return self / other


def _check_int_divisor(b) -> None:
    """CPU raises on an integer division or remainder by zero; XLA returns a value."""
    _checks.report(jnp.asarray(b) == 0, exc=RuntimeError, message="ZeroDivisionError")


def _trunc_div_int(a, b):
    a, b = _bcast(a, b)
    if _is_int(a):
        _check_int_divisor(b)
    return lax.div(a, b)


def _floor_div_int(a, b):
    a, b = _bcast(a, b)
    if _is_int(a):
        _check_int_divisor(b)
    q = lax.div(a, b)
    r = lax.rem(a, b)
    if _is_signed_int(a):
        q = jnp.where((r != 0) & ((a < 0) != (b < 0)), q - 1, q)
    return q


def _floor_div_float(a, b):
    # c10's div_floor_floating: exact for every representable quotient, keeps -0.0.
    a, b = _bcast(a, b)
    mod = lax.rem(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    fl = jnp.floor(div)
    fl = jnp.where(div - fl > 0.5, fl + 1, fl)
    q = a / b
    fl = jnp.where(div == 0, jnp.copysign(_zeros_like(div), q), fl)
    return jnp.where(b == 0, q, fl)


def _floor_div(a, b):
    if _is_bool(a):
        a, b = a.astype(jnp.int64), b.astype(jnp.int64)
        return _floor_div_int(a, b).astype(jnp.bool_)
    if _is_int(a):
        return _floor_div_int(a, b)
    return _floor_div_float(a, b)


@lower("div.Tensor_mode", "div.Scalar_mode")
def div_mode(self, other, rounding_mode=None):
    if rounding_mode is None:
        (a, b), res = _promote(INT_TO_FLOAT, self, other)
        return (a / b).astype(res)
    # PyTorch's reduced-float (float16/bfloat16) kernels round every step of trunc/floor
    # division to the reduced type: compute in it too (NO_OPMATH), not in float32.
    (a, b), res = _promote(NO_OPMATH, self, other)
    if rounding_mode == "trunc":
        if _is_exact(a):
            out = _trunc_div_int(a.astype(jnp.int64) if _is_bool(a) else a,
                                 b.astype(jnp.int64) if _is_bool(b) else b)
        else:
            out = jnp.trunc(a / b)
    elif rounding_mode == "floor":
        out = _floor_div(a, b)
    else:
        raise RuntimeError(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"'{rounding_mode}'"
        )
    return out.astype(res)


@lower("floor_divide", "floor_divide.Scalar", promote=NO_OPMATH)
def floor_divide(self, other):
    return _floor_div(self, other)


def _remainder(a, b):
    a, b = _bcast(a, b)
    if _is_bool(a):
        return a & ~b  # x % True == 0, x % False is undefined (PyTorch raises)
    if _is_int(a):
        _check_int_divisor(b)
    m = lax.rem(a, b)
    if _is_int(a) and not _is_signed_int(a):
        return m
    return jnp.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@lower("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor", promote=DEFAULT)
def remainder(self, other):
    return _remainder(self, other)


@lower("fmod.Tensor", "fmod.Scalar", promote=DEFAULT)
def fmod(self, other):
    a, b = _bcast(self, other)
    if _is_bool(a):
        return a & ~b
    if _is_int(a):
        _check_int_divisor(b)
    return lax.rem(a, b)


def _int_pow(base, exp):
    base, exp = _bcast(base, exp)
    nbits = jnp.iinfo(exp.dtype).bits
    if _is_signed_int(exp):
        neg = exp < 0
        e = jnp.where(neg, 0, exp)
    else:
        neg = None
        e = exp
    one = jnp.ones((), e.dtype)

    def body(_, carry):
        acc, b, e = carry
        acc = jnp.where((e & one) != 0, acc * b, acc)
        return acc, b * b, lax.shift_right_logical(e, one)

    acc, _, _ = lax.fori_loop(0, nbits, body, (_ones_like(base), base, e))
    if neg is not None:
        odd = (exp & one) != 0
        special = jnp.where(
            base == 1, _ones_like(base),
            jnp.where(base == -1, jnp.where(odd, -_ones_like(base), _ones_like(base)), _zeros_like(base)),
        )
        acc = jnp.where(neg, special, acc)
    return acc


def _pow(a, b):
    if _is_bool(a):
        return a | ~b  # a ** b for booleans
    if _is_int(a):
        return _int_pow(a, b)
    if jnp.dtype(a.dtype) == jnp.complex64:
        # computed in complex128: closest to PyTorch's CPU result (still a few ulps apart
        # for large |b * log(a)|, where every float32 evaluation loses accuracy)
        return jnp.power(a.astype(jnp.complex128), jnp.asarray(b).astype(jnp.complex128)).astype(a.dtype)
    return jnp.power(a, b)


@lower("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar", promote=DEFAULT)
def pow(self, exponent):
    return _pow(self, exponent)


@lower("neg", promote=DEFAULT)
def neg(self):
    return -self


@lower("abs", promote=COMPLEX_TO_FLOAT)
def abs(self):
    if _is_bool(self):
        return self
    return jnp.abs(self)


def _sign_real(x):
    if _is_bool(x):
        return x
    if _is_int(x) and not _is_signed_int(x):
        return (x > 0).astype(x.dtype)
    # (0 < x) - (x < 0): NaN -> 0 as in PyTorch, and -0.0 -> 0.0
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lower("sign", promote=DEFAULT)
def sign(self):
    return _sign_real(self)


@lower("sgn", promote=DEFAULT)
def sgn(self):
    if _is_complex(self):
        a = jnp.abs(self)
        return jnp.where(a == 0, jnp.zeros((), self.dtype), self / a.astype(self.dtype))
    return _sign_real(self)


_unary("reciprocal", lambda x: 1 / x)
_unary("sqrt", jnp.sqrt)
_unary("rsqrt", lambda x: lax.rsqrt(x) if not _is_complex(x) else 1 / jnp.sqrt(x))


@lower("exp", promote=INT_TO_FLOAT)
def exp(self):
    return jnp.exp(self)


_unary("exp2", jnp.exp2)
_unary("expm1", jnp.expm1)
_unary("log", jnp.log)
_unary("log2", jnp.log2)
_unary("log10", jnp.log10)
_unary("log1p", jnp.log1p)
_unary("sin", jnp.sin)
_unary("cos", jnp.cos)
_unary("tan", jnp.tan)
_unary("asin", jnp.arcsin)
_unary("acos", jnp.arccos)
_unary("atan", jnp.arctan)
_unary("sinh", jnp.sinh)
_unary("cosh", jnp.cosh)
_unary("tanh", jnp.tanh)
_unary("asinh", jnp.arcsinh)
_unary("acosh", jnp.arccosh)
_unary("atanh", jnp.arctanh)
_unary("erf", lax.erf)
_unary("erfc", lax.erfc)
_unary("erfinv", lax.erf_inv)
_unary("lgamma", lax.lgamma)
_unary("digamma", lambda x: jnp.where(x == 0, jnp.copysign(jnp.full((), jnp.inf, x.dtype), -x), lax.digamma(x)))
_unary("i0", jax.scipy.special.i0)
_unary("deg2rad", lambda x: x * (math.pi / 180.0))
_unary("rad2deg", lambda x: x * (180.0 / math.pi))


def _sigmoid(x):
    if _is_complex(x):
        return 1 / (1 + jnp.exp(-x))
    return jax.nn.sigmoid(x)


_unary("sigmoid", _sigmoid)


@lower("sinc", promote=INT_TO_FLOAT)
def sinc(self):
    px = self * math.pi
    safe = jnp.where(self == 0, jnp.ones((), self.dtype), px)
    return jnp.where(self == 0, jnp.ones((), self.dtype), jnp.sin(safe) / safe)


@lower("logit")
def logit(self, eps=None):
    # PyTorch computes logit of float16/bfloat16 in that type (no float32 opmath)
    _, res = _result_dtypes(INT_TO_FLOAT, self)
    x = self.astype(res)
    if eps is not None:
        lo, hi = eps, 1.0 - eps
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x)).astype(res)
    return jnp.log(x / (1 - x))


def _rounding(fn):
    def f(x):
        return x if _is_exact(x) else fn(x)

    return f


_unary("floor", _rounding(jnp.floor), promote=DEFAULT)
_unary("ceil", _rounding(jnp.ceil), promote=DEFAULT)
_unary("trunc", _rounding(jnp.trunc), promote=DEFAULT)
_unary("round", _rounding(jnp.round), promote=DEFAULT)
_unary("frac", lambda x: x - jnp.trunc(x), promote=DEFAULT)


@lower("round.decimals", promote=DEFAULT)
def round_decimals(self, decimals=0):
    if _is_exact(self):
        return self
    if decimals == 0:
        return jnp.round(self)
    p = float(10 ** builtins_abs(decimals))
    if decimals < 0:
        return jnp.round(self / p) * p
    return jnp.round(self * p) / p


def builtins_abs(v):
    return v if v >= 0 else -v


# --- clamping, extrema --------------------------------------------------------


def _nan(x):
    return jnp.isnan(x) if _is_float(x) else jnp.zeros(jnp.shape(x), jnp.bool_)


# PyTorch's max/min kernels keep their FIRST operand on ties (so maximum(-0.0, 0.0) is
# -0.0) and propagate NaN from either side; XLA's max/min do not keep that order.
def _max(a, b):
    if _is_bool(a) and _is_bool(b):
        return a | b
    return jnp.where(_nan(b), b, jnp.where(a < b, b, a))


def _min(a, b):
    if _is_bool(a) and _is_bool(b):
        return a & b
    return jnp.where(_nan(b), b, jnp.where(a > b, b, a))


def _clamp(x, lo, hi):
    if lo is not None:
        x = _max(x, jnp.asarray(lo))
    if hi is not None:
        x = _min(x, jnp.asarray(hi))
    return x


@lower("clamp")
def clamp(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if _is_float(self):
        # CPU's clamp meta: a floating self keeps its dtype, the bounds do not promote it (a
        # complex bound with a zero imaginary part, which CPU accepts, is its real part)
        min, max = [b if b is None or not _is_complex(b) else jnp.real(b) for b in (min, max)]
    (self, min, max), res = _promote(DEFAULT, self, min, max)
    return casts.cast(jnp.broadcast_to(_clamp(self, min, max), self.shape), res)


@lower("clamp.Tensor", promote=DEFAULT)
def clamp_tensor(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return _clamp(self, min, max)


@lower("clamp_min", promote=DEFAULT, promote_args=("self", "min"))
def clamp_min(self, min):
    return jnp.broadcast_to(_clamp(self, min, None), self.shape)


@lower("clamp_min.Tensor", promote=DEFAULT)
def clamp_min_tensor(self, min):
    return _clamp(self, min, None)


@lower("clamp_max", promote=DEFAULT, promote_args=("self", "max"))
def clamp_max(self, max):
    return jnp.broadcast_to(_clamp(self, None, max), self.shape)


@lower("clamp_max.Tensor", promote=DEFAULT)
def clamp_max_tensor(self, max):
    return _clamp(self, None, max)


@lower("maximum", promote=DEFAULT)
def maximum(self, other):
    return _max(self, other)


@lower("minimum", promote=DEFAULT)
def minimum(self, other):
    return _min(self, other)


@lower("fmax", promote=DEFAULT)
def fmax(self, other):
    if _is_bool(self):
        return self | other
    return jnp.where(_nan(other), self, jnp.where(_nan(self) | (self < other), other, self))


@lower("fmin", promote=DEFAULT)
def fmin(self, other):
    if _is_bool(self):
        return self & other
    return jnp.where(_nan(other), self, jnp.where(_nan(self) | (self > other), other, self))


# --- ternary and binary math --------------------------------------------------


def _lerp(a, b, w):
    small = jnp.abs(w) < 0.5
    return jnp.where(small, a + w * (b - a), b - (b - a) * (1 - w))


@lower("lerp.Scalar", promote=DEFAULT, promote_args=("self", "end"))
def lerp_scalar(self, end, weight):
    return _lerp(self, end, jnp.asarray(weight).astype(self.dtype))


@lower("lerp.Tensor", promote=DEFAULT)
def lerp_tensor(self, end, weight):
    return _lerp(self, end, weight)


@lower("addcmul", promote=DEFAULT)
def addcmul(self, tensor1, tensor2, value=1):
    if _is_bool(self):
        return self | (tensor1 & tensor2 & jnp.asarray(value).astype(jnp.bool_))
    if _is_one(value):
        return self + tensor1 * tensor2
    return self + value * tensor1 * tensor2


@lower("addcdiv", promote=DEFAULT)
def addcdiv(self, tensor1, tensor2, value=1):
    if _is_exact(tensor1) and _is_exact(tensor2):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release "
            "addcdiv will perform a true division of tensor1 and tensor2."
        )
    if _is_one(value):
        return self + tensor1 / tensor2
    return self + value * tensor1 / tensor2


@lower("atan2", promote=INT_TO_FLOAT)
def atan2(self, other):
    return jnp.arctan2(self, other)


@lower("hypot", promote=DEFAULT)
def hypot(self, other):
    return jnp.hypot(self, other)


@lower("copysign.Tensor", "copysign.Scalar", promote=INT_TO_FLOAT)
def copysign(self, other):
    return jnp.copysign(self, other)


@lower("nextafter", promote=NO_OPMATH)
def nextafter(self, other):
    return jnp.nextafter(self, other)


@lower("xlogy.Tensor", "xlogy.Scalar_Other", "xlogy.Scalar_Self", promote=INT_TO_FLOAT)
def xlogy(self, other):
    x, y = _bcast(self, other)
    out = jnp.where(x == 0, _zeros_like(x), x * jnp.log(y))
    return jnp.where(jnp.isnan(y), y, out)


@lower("special_xlog1py", "special_xlog1py.self_scalar", "special_xlog1py.other_scalar",
       promote=INT_TO_FLOAT)
def xlog1py(self, other):
    x, y = _bcast(self, other)
    out = jnp.where(x == 0, _zeros_like(x), x * jnp.log1p(y))
    return jnp.where(jnp.isnan(y), y, out)


@lower("logaddexp", promote=INT_TO_FLOAT)
def logaddexp(self, other):
    if _is_complex(self):
        m = jnp.where(self.real >= other.real, self, other)
        n = jnp.where(self.real >= other.real, other, self)
        return m + jnp.log1p(jnp.exp(n - m))
    return jnp.logaddexp(self, other)


@lower("logaddexp2", promote=INT_TO_FLOAT)
def logaddexp2(self, other):
    return jnp.logaddexp2(self, other)


@lower("heaviside", promote=DEFAULT)
def heaviside(self, values):
    x, v = _bcast(self, values)
    if _is_bool(x):
        return jnp.where(~x, v, x)
    return jnp.where(x == 0, v, (x > 0).astype(x.dtype))


@lower("nan_to_num")
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    def fix(x):
        fi = jnp.finfo(x.dtype)
        big = float(fi.max) if posinf is None else posinf
        small = float(fi.min) if neginf is None else neginf
        x = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan).astype(x.dtype), x)
        x = jnp.where(x == jnp.inf, jnp.asarray(big).astype(x.dtype), x)
        return jnp.where(x == -jnp.inf, jnp.asarray(small).astype(x.dtype), x)

    if _is_complex(self):
        return lax.complex(fix(jnp.real(self)), fix(jnp.imag(self)))
    if not _is_float(self):
        return self
    return fix(self)


@lower("_conj_physical")
def conj_physical(self):
    return jnp.conj(self) if _is_complex(self) else self


# --- classification -----------------------------------------------------------


def _bools(x):
    return jnp.zeros(jnp.shape(x), jnp.bool_)


@lower("isnan")
def isnan(self):
    return jnp.isnan(self) if _is_float(self) or _is_complex(self) else _bools(self)


@lower("isinf")
def isinf(self):
    return jnp.isinf(self) if _is_float(self) or _is_complex(self) else _bools(self)


# isfinite is CompositeImplicitAutograd, but its complex decomposition reads .real/.imag
# views (complex storage reinterpreted as float), which the runtime cannot alias; a
# direct registration takes precedence (the op is not differentiable anyway).
@lower("isfinite")
def isfinite(self):
    return jnp.isfinite(self) if _is_float(self) or _is_complex(self) else ~_bools(self)


@lower("isposinf")
def isposinf(self):
    return self == jnp.inf if _is_float(self) else _bools(self)


@lower("isneginf")
def isneginf(self):
    return self == -jnp.inf if _is_float(self) else _bools(self)


@lower("signbit")
def signbit(self):
    if _is_float(self):
        return jnp.signbit(self)
    if _is_signed_int(self):
        return self < 0
    return _bools(self)


# --- comparisons and logic ----------------------------------------------------


@lower("eq.Tensor", "eq.Scalar", promote=ALWAYS_BOOL)
def eq(self, other):
    return self == other


@lower("ne.Tensor", "ne.Scalar", promote=ALWAYS_BOOL)
def ne(self, other):
    return self != other


@lower("lt.Tensor", "lt.Scalar", promote=ALWAYS_BOOL)
def lt(self, other):
    return self < other


@lower("le.Tensor", "le.Scalar", promote=ALWAYS_BOOL)
def le(self, other):
    return self <= other


@lower("gt.Tensor", "gt.Scalar", promote=ALWAYS_BOOL)
def gt(self, other):
    return self > other


@lower("ge.Tensor", "ge.Scalar", promote=ALWAYS_BOOL)
def ge(self, other):
    return self >= other


def _truth(x):
    return x if _is_bool(x) else x != 0


@lower("logical_and")
def logical_and(self, other):
    return _truth(self) & _truth(other)


@lower("logical_or")
def logical_or(self, other):
    return _truth(self) | _truth(other)


@lower("logical_xor")
def logical_xor(self, other):
    return _truth(self) ^ _truth(other)


@lower("logical_not")
def logical_not(self):
    return ~_truth(self)


def _check_integral(name, x):
    if not (_is_exact(x)):
        # CPU's dispatch-macro error: NotImplementedError, the dtype by its ScalarType name
        from ..runtime.jaxenv import to_torch_dtype

        st = torch.empty(0, dtype=to_torch_dtype(x.dtype)).type().split(".")[-1].removesuffix("Tensor")
        raise NotImplementedError(f'"{name}_cpu" not implemented for \'{st}\'')


@lower("bitwise_and.Tensor", "bitwise_and.Scalar", "bitwise_and.Scalar_Tensor", promote=DEFAULT)
def bitwise_and(self, other):
    _check_integral("bitwise_and", self)
    return jnp.bitwise_and(self, other)


@lower("bitwise_or.Tensor", "bitwise_or.Scalar", "bitwise_or.Scalar_Tensor", promote=DEFAULT)
def bitwise_or(self, other):
    _check_integral("bitwise_or", self)
    return jnp.bitwise_or(self, other)


@lower("bitwise_xor.Tensor", "bitwise_xor.Scalar", "bitwise_xor.Scalar_Tensor", promote=DEFAULT)
def bitwise_xor(self, other):
    _check_integral("bitwise_xor", self)
    return jnp.bitwise_xor(self, other)


@lower("bitwise_not", promote=DEFAULT)
def bitwise_not(self):
    _check_integral("bitwise_not", self)
    return jnp.invert(self)


# lax shifts give 0 (left, logical right) or the sign fill (arithmetic right) for a shift
# count outside [0, bits), which is exactly PyTorch's rule for such counts.
@lower("bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar",
       "bitwise_left_shift.Scalar_Tensor", "__lshift__.Tensor", "__lshift__.Scalar",
       "__ilshift__.Tensor", "__ilshift__.Scalar", promote=DEFAULT)
def bitwise_left_shift(self, other):
    _check_integral("lshift", self)
    a, b = _bcast(self, other)
    return lax.shift_left(a, b)


@lower("bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar",
       "bitwise_right_shift.Scalar_Tensor", "__rshift__.Tensor", "__rshift__.Scalar",
       "__irshift__.Tensor", "__irshift__.Scalar", promote=DEFAULT)
def bitwise_right_shift(self, other):
    _check_integral("rshift", self)
    a, b = _bcast(self, other)
    if _is_signed_int(a):
        return lax.shift_right_arithmetic(a, b)
    return lax.shift_right_logical(a, b)


@lower("where.self", promote=DEFAULT, promote_args=("self", "other"))
def where(condition, self, other):
    if self.dtype == other.dtype and self.dtype in casts.FLOAT8:
        # selected as bytes: XLA:CPU's select rewrites e5m2 NaN payloads, CPU's moves bytes
        return casts.as_bytes(jnp.where(_truth(condition), casts.as_bytes(self), casts.as_bytes(other)),
                              self.dtype)
    return jnp.where(_truth(condition), self, other)


@lower("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(self, mask, value):
    v = jnp.asarray(value)
    if _is_complex(v) and not _is_complex(self):
        raise RuntimeError("value cannot be converted to type without overflow")
    if jnp.ndim(v) != 0:
        raise RuntimeError(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
            f"{jnp.ndim(v)} dimension(s)."
        )
    out = jnp.where(_truth(mask), v.astype(self.dtype), self)
    return jnp.broadcast_to(out, self.shape) if out.shape != self.shape else out


# --- activations and their backward ops ----------------------------------------


@lower("relu", promote=DEFAULT)
def relu(self):
    if _is_bool(self):
        return self
    # clamp_min(self, 0): NaN and -0.0 pass through
    return jnp.where(self < 0, jnp.zeros((), self.dtype), self)


@lower("threshold", promote=DEFAULT)
def threshold(self, threshold, value):
    return jnp.where(self <= threshold, jnp.asarray(value).astype(self.dtype), self)


@lower("threshold_backward", promote=DEFAULT)
def threshold_backward(grad_output, self, threshold):
    g, x = _bcast(grad_output, self)
    return jnp.where(x <= threshold, _zeros_like(g), g)


@lower("leaky_relu", promote=DEFAULT)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * negative_slope)


@lower("leaky_relu_backward", promote=DEFAULT)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    g, x = _bcast(grad_output, self)
    return jnp.where(x > 0, g, g * negative_slope)


@lower("hardtanh", promote=DEFAULT)
def hardtanh(self, min_val=-1, max_val=1):
    lo = jnp.asarray(min_val).astype(self.dtype)
    hi = jnp.asarray(max_val).astype(self.dtype)
    return jnp.where(self < lo, lo, jnp.where(self > hi, hi, self))


@lower("hardtanh_backward", promote=DEFAULT)
def hardtanh_backward(grad_output, self, min_val, max_val):
    g, x = _bcast(grad_output, self)
    return jnp.where((x <= min_val) | (x >= max_val), _zeros_like(g), g)


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_2_SQRTPI = 2.0 / math.sqrt(math.pi)
_GELU_BETA = math.sqrt(2.0) * _2_SQRTPI * 0.5
_GELU_KAPPA = 0.044715


@lower("gelu", promote=DEFAULT)
def gelu(self, approximate="none"):
    x = self
    if approximate == "tanh":
        inner = _GELU_BETA * (x + _GELU_KAPPA * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    if approximate != "none":
        raise RuntimeError(f"approximate argument must be either none or tanh, got {approximate}")
    return x * 0.5 * (1 + lax.erf(x * _SQRT1_2))


@lower("gelu_backward", promote=DEFAULT)
def gelu_backward(grad_output, self, approximate="none"):
    g, x = grad_output, self
    if approximate == "tanh":
        x_sq = x * x
        inner = _GELU_BETA * (x + _GELU_KAPPA * x_sq * x)
        t = jnp.tanh(inner)
        left = 0.5 * x
        right = 1 + t
        left_d = 0.5 * right
        right_d = (1 - t * t) * _GELU_BETA * (1 + 3 * _GELU_KAPPA * x_sq)
        return g * (left_d + left * right_d)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) * (_2_SQRTPI * _SQRT1_2 * 0.5)
    return g * (cdf + x * pdf)


@lower("silu", promote=DEFAULT)
def silu(self):
    return self * _sigmoid(self)


@lower("silu_backward", promote=DEFAULT)
def silu_backward(grad_output, self):
    s = _sigmoid(self)
    return grad_output * s * (1 + self * (1 - s))


@lower("mish", promote=DEFAULT)
def mish(self):
    return self * jnp.tanh(jax.nn.softplus(self))


@lower("mish_backward", promote=DEFAULT)
def mish_backward(grad_output, self):
    s = _sigmoid(self)
    t = jnp.tanh(jax.nn.softplus(self))
    return grad_output * (t + self * s * (1 - t * t))


@lower("elu", promote=DEFAULT)
def elu(self, alpha=1, scale=1, input_scale=1):
    x = self
    neg = jnp.expm1(x * input_scale) * (alpha * scale)
    return jnp.where(x > 0, x * scale, neg)


@lower("elu_backward", promote=DEFAULT)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, x = _bcast(grad_output, self_or_result)
    negcoef = alpha * scale
    if is_result:
        neg = g * input_scale * (x + negcoef)
    else:
        neg = g * input_scale * negcoef * jnp.exp(x * input_scale)
    return jnp.where(x <= 0, neg, g * scale)


def _elu_backward_check(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    # CPU's kernel (not its meta function) refuses the backward of an in-place elu_/celu_ with a
    # negative alpha: the input cannot be recovered from the result there
    if is_result and float(alpha) < 0:
        raise RuntimeError(
            "In-place elu backward calculation is triggered with a negative slope which is not "
            "supported. This is caused by calling in-place forward function with a negative slope, "
            "please call out-of-place version instead.")


LOWERINGS["elu_backward"].check = _elu_backward_check


@lower("celu", promote=DEFAULT)
def celu(self, alpha=1.0):
    x = self
    return jnp.where(x > 0, x, jnp.expm1(x / alpha) * alpha)


@lower("softplus", promote=DEFAULT)
def softplus(self, beta=1, threshold=20):
    xb = self * beta
    return jnp.where(xb > threshold, self, jnp.log1p(jnp.exp(xb)) / beta)


@lower("softplus_backward", promote=DEFAULT)
def softplus_backward(grad_output, self, beta, threshold):
    xb = self * beta
    z = jnp.exp(xb)
    return jnp.where(xb > threshold, grad_output, grad_output * z / (z + 1))


@lower("hardswish", promote=DEFAULT)
def hardswish(self):
    return self * jnp.minimum(jnp.maximum(self + 3, 0), 6) / 6


@lower("hardswish_backward", promote=DEFAULT)
def hardswish_backward(grad_output, self):
    g, x = _bcast(grad_output, self)
    return jnp.where(x < -3, _zeros_like(g), jnp.where(x <= 3, g * (x / 3 + 0.5), g))


@lower("hardsigmoid", promote=DEFAULT)
def hardsigmoid(self):
    return jnp.minimum(jnp.maximum(self + 3, 0), 6) / 6


@lower("hardsigmoid_backward", promote=DEFAULT)
def hardsigmoid_backward(grad_output, self):
    g, x = _bcast(grad_output, self)
    return jnp.where((x > -3) & (x < 3), g / 6, _zeros_like(g))


@lower("hardshrink", promote=DEFAULT)
def hardshrink(self, lambd=0.5):
    return jnp.where((self >= -lambd) & (self <= lambd), _zeros_like(self), self)


@lower("hardshrink_backward", promote=DEFAULT)
def hardshrink_backward(grad_out, self, lambd):
    g, x = _bcast(grad_out, self)
    return jnp.where((x >= -lambd) & (x <= lambd), _zeros_like(g), g)


@lower("softshrink", promote=DEFAULT)
def softshrink(self, lambd=0.5):
    x = self
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


@lower("softshrink_backward", promote=DEFAULT)
def softshrink_backward(grad_output, self, lambd):
    g, x = _bcast(grad_output, self)
    return jnp.where((x >= -lambd) & (x <= lambd), _zeros_like(g), g)


@lower("sigmoid_backward", promote=DEFAULT)
def sigmoid_backward(grad_output, output):
    d = (1 - output) * output
    return grad_output * (jnp.conj(d) if _is_complex(d) else d)


@lower("tanh_backward", promote=DEFAULT)
def tanh_backward(grad_output, output):
    d = 1 - output * output
    return grad_output * (jnp.conj(d) if _is_complex(d) else d)


@lower("logit_backward", promote=DEFAULT)
def logit_backward(grad_output, self, eps=None):
    g, x = _bcast(grad_output, self)
    d = g / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.full((), jnp.nan, g.dtype), d)
    return jnp.where((x < eps) | (x > 1 - eps), _zeros_like(g), d)


@lower("log_sigmoid_forward")
def log_sigmoid_forward(self):
    (x,) = _opmath(self)
    z = jnp.exp(-jnp.abs(x))
    out = jnp.minimum(x, 0) - jnp.log1p(z)
    return out.astype(self.dtype), z.astype(self.dtype)


@lower("log_sigmoid_backward")
def log_sigmoid_backward(grad_output, self, buffer):
    g, x = _opmath(grad_output, self)
    z = jnp.exp(-jnp.abs(x))  # recomputed: the buffer is not needed
    neg = x < 0
    max_deriv = jnp.where(neg, 1.0, 0.0).astype(x.dtype)
    sgn = jnp.where(neg, 1.0, -1.0).astype(x.dtype)
    out = g * (max_deriv - sgn * (z / (1 + z)))
    return out.astype(jnp.result_type(grad_output.dtype, self.dtype))


def _glu_dim(x, dim):
    nd = x.ndim
    if nd == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    d = dim + nd if dim < 0 else dim
    if x.shape[d] % 2:
        raise RuntimeError(
            f"Halving dimension must be even, but dimension {d} is size {x.shape[d]}"
        )
    return d


@lower("glu", promote=DEFAULT)
def glu(self, dim=-1):
    d = _glu_dim(self, dim)
    a, b = jnp.split(self, 2, axis=d)
    return a * _sigmoid(b)


@lower("glu_backward", promote=DEFAULT)
def glu_backward(grad_output, self, dim):
    d = _glu_dim(self, dim)
    a, b = jnp.split(self, 2, axis=d)
    s = _sigmoid(b)
    ga = grad_output * s
    gb = grad_output * a * s * (1 - s)
    return jnp.concatenate([ga, gb], axis=d)


@lower("_prelu_kernel", promote=DEFAULT)
def prelu_kernel(self, weight):
    return jnp.where(self > 0, self, weight * self)


@lower("_prelu_kernel_backward")
def prelu_kernel_backward(grad_output, self, weight):
    g, x, w = _opmath(grad_output, self, weight)
    pos = x > 0
    gi = jnp.where(pos, g, w * g)
    gw = jnp.where(pos, jnp.zeros((), g.dtype), x * g)
    shape = jnp.broadcast_shapes(g.shape, x.shape, w.shape)
    gi = jnp.broadcast_to(gi, shape).astype(self.dtype)
    gw = jnp.broadcast_to(gw, shape).astype(weight.dtype)
    return gi, gw
