"""The _foreach_* ops optimizers use: one executable per list, not per tensor.

Each lowering takes lists of arrays and returns a list; the executor generates the
in-place `_foreach_xxx_` overloads from the functional ones and writes each result
into each self[i]. Type promotion is per element (PyTorch promotes each
(self[i], other[i]) pair on its own), with float16/bfloat16 computed in float32.

Scalars arrive either as Python numbers or as weakly-typed 0-d JAX values; both are
handled the same way through `promotion.promote`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..runtime.jaxenv import to_jax_dtype
from ._common import opmath_dtype as _opmath, real_dtype as _real_dtype
from .promotion import promote
from .registry import (
    BOOL_TO_LONG,
    COMPLEX_TO_FLOAT,
    DEFAULT,
    INT_TO_FLOAT,
    ArgInfo,
    Lowering,
    lower,
    overload,
)


def _check_lists(name, *lists):
    n = len(lists[0])
    for other in lists[1:]:
        if len(other) != n:
            raise RuntimeError(
                f"{name}: Tensor lists must have the same number of tensors, got {n} and {len(other)}"
            )


def _check_scalars(name, self, scalars):
    if len(scalars) != len(self):
        raise RuntimeError(
            f"{name}: Tensor list must have same number of elements as scalar list, "
            f"got {len(self)} and {len(scalars)}"
        )


def _is_one(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _pointwise(kind, fn, *vals):
    """fn on `vals` promoted to the computation dtype; the result cast to PyTorch's."""
    cast, res = promote(kind, *vals)
    return jnp.asarray(fn(*cast)).astype(res)


# --- binary arithmetic -------------------------------------------------------


def _add(a, b, alpha=1):
    if _is_one(alpha):
        return _pointwise(DEFAULT, lambda x, y: x + y, a, b)
    return _pointwise(DEFAULT, lambda x, y: x + y * _value(alpha, x), a, b)


def _sub(a, b, alpha=1):
    if _is_one(alpha):
        return _pointwise(DEFAULT, lambda x, y: x - y, a, b)
    return _pointwise(DEFAULT, lambda x, y: x - y * _value(alpha, x), a, b)


def _mul(a, b):
    return _pointwise(DEFAULT, lambda x, y: x * y, a, b)


def _div(a, b):
    return _pointwise(INT_TO_FLOAT, lambda x, y: x / y, a, b)


def _maximum(a, b):
    return _pointwise(DEFAULT, jnp.maximum, a, b)


def _minimum(a, b):
    return _pointwise(DEFAULT, jnp.minimum, a, b)


def _pow(a, b):
    return _pointwise(BOOL_TO_LONG, _power, a, b)


def _power(x, y):
    if jnp.issubdtype(x.dtype, jnp.integer):
        # integer pow: torch keeps negative exponents of +-1 exact and others 0
        y = jnp.asarray(y)
        return jnp.where(
            y < 0,
            jnp.where(x == 1, 1, jnp.where(x == -1, jnp.where(y % 2 == 0, 1, -1), 0)).astype(x.dtype),
            jnp.power(x, jnp.maximum(y, 0).astype(x.dtype)),
        )
    return jnp.power(x, y)


def _register_binary(base, fn, lists=True, scalar=True, scalar_list=True, tensor=False, alpha=False):
    name = f"_foreach_{base}"
    if lists:
        if alpha:
            @lower(f"{name}.List")
            def f_list(self, other, alpha=1):
                _check_lists(name, self, other)
                return [fn(a, b, alpha) for a, b in zip(self, other)]
        else:
            @lower(f"{name}.List")
            def f_list(self, other):
                _check_lists(name, self, other)
                return [fn(a, b) for a, b in zip(self, other)]
    if scalar:
        @lower(f"{name}.Scalar")
        def f_scalar(self, scalar):
            return [fn(a, scalar) for a in self]
    if scalar_list:
        @lower(f"{name}.ScalarList")
        def f_scalar_list(self, scalars):
            _check_scalars(name, self, scalars)
            return [fn(a, s) for a, s in zip(self, scalars)]
    if tensor:
        if alpha:
            @lower(f"{name}.Tensor")
            def f_tensor(self, other, alpha=1):
                _check_scalar_tensor(name, other)
                return [fn(a, other, alpha) for a in self]
        else:
            @lower(f"{name}.Tensor")
            def f_tensor(self, other):
                _check_scalar_tensor(name, other)
                return [fn(a, other) for a in self]


def _check_scalar_tensor(name, other):
    if other.ndim != 0:
        raise RuntimeError(
            f"{name}: scalar tensor expected to be 0 dim but it has {other.ndim} dimensions "
            f"and {other.size} elements."
        )


_register_binary("add", _add, tensor=True, alpha=True)
_register_binary("sub", _sub, alpha=True)
_register_binary("mul", _mul, tensor=True)
_register_binary("div", _div, tensor=True)
_register_binary("maximum", _maximum)
_register_binary("minimum", _minimum)
_register_binary("clamp_min", _maximum)
_register_binary("clamp_max", _minimum)


@lower("_foreach_pow.List")
def foreach_pow_list(self, exponent):
    _check_lists("_foreach_pow", self, exponent)
    return [_pow(a, b) for a, b in zip(self, exponent)]


@lower("_foreach_pow.Scalar")
def foreach_pow_scalar(self, exponent):
    return [_pow(a, exponent) for a in self]


@lower("_foreach_pow.ScalarList")
def foreach_pow_scalar_list(self, exponent):
    _check_scalars("_foreach_pow", self, exponent)
    return [_pow(a, e) for a, e in zip(self, exponent)]


@lower("_foreach_pow.ScalarAndTensor")
def foreach_pow_scalar_and_tensor(self, exponent):
    return [_pow(self, e) for e in exponent]


# --- addcmul / addcdiv / lerp -------------------------------------------------


def _value(v, like):
    """A scalar operand in the computation dtype (PyTorch casts it to opmath too)."""
    if isinstance(v, (bool, int, float, complex)):
        return v
    return jnp.asarray(v).astype(like.dtype)


def _addcmul(s, t1, t2, value):
    return _pointwise(DEFAULT, lambda a, b, c: a + _value(value, a) * b * c, s, t1, t2)


def _addcdiv(s, t1, t2, value):
    if not (jnp.issubdtype(t1.dtype, jnp.inexact) or jnp.issubdtype(t2.dtype, jnp.inexact)):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv "
            "behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2))."
            "to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for "
            "float inputs. The future addcdiv behavior is just the latter implementation: "
            "(input + value * tensor1 / tensor2), for all dtypes."
        )
    return _pointwise(DEFAULT, lambda a, b, c: a + _value(value, a) * (b / c), s, t1, t2)


def _register_addc(base, fn):
    name = f"_foreach_{base}"

    @lower(f"{name}.Scalar")
    def f_scalar(self, tensor1, tensor2, value=1):
        _check_lists(name, self, tensor1, tensor2)
        return [fn(s, a, b, value) for s, a, b in zip(self, tensor1, tensor2)]

    @lower(f"{name}.ScalarList")
    def f_scalar_list(self, tensor1, tensor2, scalars):
        _check_lists(name, self, tensor1, tensor2)
        _check_scalars(name, self, scalars)
        return [fn(s, a, b, v) for s, a, b, v in zip(self, tensor1, tensor2, scalars)]

    @lower(f"{name}.Tensor")
    def f_tensor(self, tensor1, tensor2, scalars):
        # `scalars` is a 1-D tensor of len(self) values (a CPU one is moved by eager/composites/foreach.py)
        _check_lists(name, self, tensor1, tensor2)
        if scalars.ndim != 1 or scalars.shape[0] != len(self):
            raise RuntimeError(
                f"{name}: Expected scalars to be 1-D with {len(self)} elements, got shape {list(scalars.shape)}"
            )
        return [fn(s, a, b, scalars[i]) for i, (s, a, b) in enumerate(zip(self, tensor1, tensor2))]


_register_addc("addcmul", _addcmul)
_register_addc("addcdiv", _addcdiv)


def _lerp(s, e, w):
    def f(a, b, wt):
        d = b - a
        return jnp.where(jnp.abs(wt) < 0.5, a + wt * d, b - d * (1 - wt))

    return _pointwise(DEFAULT, f, s, e, w)


@lower("_foreach_lerp.List")
def foreach_lerp_list(self, tensors1, weights):
    _check_lists("_foreach_lerp", self, tensors1, weights)
    return [_lerp(s, e, w) for s, e, w in zip(self, tensors1, weights)]


@lower("_foreach_lerp.Scalar")
def foreach_lerp_scalar(self, tensors1, weight):
    _check_lists("_foreach_lerp", self, tensors1)
    return [_lerp_scalar(s, e, weight) for s, e in zip(self, tensors1)]


@lower("_foreach_lerp.ScalarList")
def foreach_lerp_scalar_list(self, tensors1, weight):
    _check_lists("_foreach_lerp", self, tensors1)
    _check_scalars("_foreach_lerp", self, weight)
    return [_lerp_scalar(s, e, w) for s, e, w in zip(self, tensors1, weight)]


def _lerp_scalar(s, e, w):
    # the weight is a scalar: it does not take part in promotion
    cast, res = promote(DEFAULT, s, e)
    a, b = cast
    d = b - a
    wt = _value(w, a)
    out = jnp.where(jnp.abs(wt) < 0.5, a + wt * d, b - d * (1 - wt))
    return out.astype(res)


# --- unary ---------------------------------------------------------------------


def _unary(kind, fn):
    def f(self):
        return [_pointwise(kind, fn, a) for a in self]

    return f


def _sign(x):
    if x.dtype == jnp.bool_:
        return x
    return jnp.sign(x)


def _exact_if_int(fn):
    def f(x):
        if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
            return x
        return fn(x)

    return f


def _frac(x):
    return x - jnp.trunc(x)


def _rsqrt(x):
    return jax.lax.rsqrt(x)


def _sigmoid(x):
    return jax.nn.sigmoid(x)


def _reciprocal(x):
    return 1 / x


def _neg(x):
    if x.dtype == jnp.bool_:
        raise RuntimeError(
            "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to "
            "invert a mask, use the `~` or `logical_not()` operator instead."
        )
    return -x


def _abs(x):
    return jnp.abs(x)


_UNARY = {
    "abs": (COMPLEX_TO_FLOAT, _abs),
    "neg": (DEFAULT, _neg),
    "sign": (DEFAULT, _sign),
    "ceil": (DEFAULT, _exact_if_int(jnp.ceil)),
    "floor": (DEFAULT, _exact_if_int(jnp.floor)),
    "round": (DEFAULT, _exact_if_int(jnp.round)),
    "trunc": (DEFAULT, _exact_if_int(jnp.trunc)),
    "frac": (DEFAULT, _frac),
    "sqrt": (INT_TO_FLOAT, jnp.sqrt),
    "rsqrt": (INT_TO_FLOAT, _rsqrt),
    "reciprocal": (INT_TO_FLOAT, _reciprocal),
    "exp": (INT_TO_FLOAT, jnp.exp),
    "expm1": (INT_TO_FLOAT, jnp.expm1),
    "log": (INT_TO_FLOAT, jnp.log),
    "log10": (INT_TO_FLOAT, jnp.log10),
    "log1p": (INT_TO_FLOAT, jnp.log1p),
    "log2": (INT_TO_FLOAT, jnp.log2),
    "sin": (INT_TO_FLOAT, jnp.sin),
    "cos": (INT_TO_FLOAT, jnp.cos),
    "tan": (INT_TO_FLOAT, jnp.tan),
    "asin": (INT_TO_FLOAT, jnp.arcsin),
    "acos": (INT_TO_FLOAT, jnp.arccos),
    "atan": (INT_TO_FLOAT, jnp.arctan),
    "sinh": (INT_TO_FLOAT, jnp.sinh),
    "cosh": (INT_TO_FLOAT, jnp.cosh),
    "tanh": (INT_TO_FLOAT, jnp.tanh),
    "sigmoid": (INT_TO_FLOAT, _sigmoid),
    "erf": (INT_TO_FLOAT, jax.scipy.special.erf),
    "erfc": (INT_TO_FLOAT, jax.scipy.special.erfc),
    "lgamma": (INT_TO_FLOAT, jax.scipy.special.gammaln),
}

for _name, (_kind, _fn) in _UNARY.items():
    lower(f"_foreach_{_name}")(_unary(_kind, _fn))


# --- reductions, copies ----------------------------------------------------------


def _norm_dtypes(x, dtype, name):
    if dtype is not None:
        out_dt = jnp.dtype(to_jax_dtype(dtype))
        if not jnp.issubdtype(out_dt, jnp.inexact):
            raise RuntimeError(f"{name}: dtype should be floating point or complex, but got {dtype}")
        x = x.astype(out_dt)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(
            f"{name}: Expected a floating point or complex tensor as input. Got {x.dtype}"
        )
    res = _real_dtype(x.dtype)
    acc = jnp.float32 if res in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)) else res
    return x, res, acc


def _powsum(ax, ord_):
    if ord_ == 0:
        return jnp.sum((ax != 0).astype(ax.dtype))
    if ord_ == 1:
        return jnp.sum(ax)
    if ord_ == 2:
        return jnp.sum(ax * ax)
    return jnp.sum(ax ** ord_)


def _vector_norm(x, ord_, dtype, name):
    x, res, acc = _norm_dtypes(x, dtype, name)
    ax = jnp.abs(x).astype(acc)
    if math.isinf(ord_):
        if x.size == 0:
            raise RuntimeError(
                f"{name}: Expected reduction dim to be specified for input.numel() == 0."
            )
        r = jnp.max(ax) if ord_ > 0 else jnp.min(ax)
    elif ord_ == 0:
        r = jnp.sum((ax != 0).astype(acc))
    elif ord_ == 1:
        r = jnp.sum(ax)
    elif ord_ == 2:
        r = jnp.sqrt(jnp.sum(ax * ax))
    else:
        r = jnp.sum(ax ** ord_) ** (1.0 / ord_)
    return r.astype(res)


def _static_ord(ord_):
    ord_ = float(ord_)
    return ord_


@lower("_foreach_norm.Scalar", static=("ord",))
def foreach_norm(self, ord=2, dtype=None):  # noqa: A002 - schema name
    o = _static_ord(ord)
    return [_vector_norm(a, o, dtype, "_foreach_norm") for a in self]


@lower("_foreach_powsum.Scalar", static=("ord",))
def foreach_powsum(self, ord=2, dtype=None):  # noqa: A002 - schema name
    o = _static_ord(ord)
    out = []
    for a in self:
        x, res, acc = _norm_dtypes(a, dtype, "_foreach_powsum")
        out.append(_powsum(jnp.abs(x).astype(acc), o).astype(res))
    return out


@lower("_foreach_max")
def foreach_max(self):
    out = []
    for a in self:
        if a.size == 0:
            raise RuntimeError(
                "max(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
        out.append(jnp.max(a))
    return out


@lower("_foreach_zero")
def foreach_zero(self):
    return [jnp.zeros(a.shape, a.dtype) for a in self]


@lower("_foreach_copy")
def foreach_copy(self, src, non_blocking=False):
    _check_lists("_foreach_copy", self, src)
    out = []
    for d, s in zip(self, src):
        if jnp.issubdtype(s.dtype, jnp.complexfloating) and not jnp.issubdtype(d.dtype, jnp.complexfloating):
            s = jnp.real(s)
        out.append(jnp.broadcast_to(s.astype(d.dtype), d.shape))
    return out


@lower("_foreach_clone")
def foreach_clone(self, memory_format=None):
    return [jnp.asarray(a) for a in self]


@lower("_foreach_mm")
def foreach_mm(self, mat2):
    _check_lists("_foreach_mm", self, mat2)
    out = []
    for a, b in zip(self, mat2):
        if a.dtype != b.dtype:
            raise RuntimeError(
                f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}"
            )
        out.append(jnp.matmul(a, b).astype(a.dtype))
    return out


# --- fused optimizers (optimizer(..., fused=True)) ----------------------------------
# _fused_adam_ / _fused_adamw_ / _fused_sgd_ / _fused_adagrad_ mutate several lists (params, grads,
# states). The executor writes back one mutated argument, so their kernels
# (eager/composites/foreach.py) pass every mutated list as ONE list and the lowering
# splits it again: the whole update is one executable. Hyperparameters that schedulers
# change (lr, betas, eps, momentum, dampening) are runtime scalars, so changing them
# never recompiles.


def _fused_lowering(name, fn, tensor_args, scalar_args, static_args):
    args = [ArgInfo("self", "tensor_list", False, True)]
    args += [ArgInfo(n, "tensor_list" if n.endswith("s") else "tensor", False, False) for n in tensor_args]
    args += [ArgInfo(n, "scalar", True, False) for n in scalar_args]
    args += [ArgInfo(n, "other", True, False) for n in static_args]
    return Lowering(name, fn, overload(name), args, mode="inplace", mutated=("self",))


def _unscale(grads, grad_scale):
    if grad_scale is None:
        return grads
    inv = 1.0 / grad_scale.astype(jnp.float64)
    return [(g.astype(jnp.float64) * inv).astype(g.dtype) for g in grads]


def _skip_if_inf(found_inf, new, old):
    if found_inf is None:
        return new
    skip = found_inf.reshape(()) == 1
    return [jnp.where(skip, o, n) for n, o in zip(new, old)]


def _adam_math(self, state_steps, grad_scale, found_inf, lr_t, lr, beta1, beta2, eps, *,
               n, amsgrad, maximize, weight_decay, adamw):
    params, grads, m1, m2 = self[:n], self[n:2 * n], self[2 * n:3 * n], self[3 * n:4 * n]
    maxs = self[4 * n:5 * n] if amsgrad else []
    grads = _unscale(grads, grad_scale)
    lr = lr_t.reshape(()).astype(jnp.float64) if lr_t is not None else jnp.asarray(lr, jnp.float64)
    b1 = jnp.asarray(beta1, jnp.float64)
    b2 = jnp.asarray(beta2, jnp.float64)
    new_p, new_m1, new_m2, new_max = [], [], [], []
    for i in range(n):
        p, g = params[i], grads[i]
        odt = _opmath(p.dtype)
        step = state_steps[i].reshape(()).astype(jnp.float64)
        bc1 = 1 - b1**step
        bc2_sqrt = jnp.sqrt(1 - b2**step)
        step_size = (lr / bc1).astype(odt)
        pf, gf = p.astype(odt), g.astype(odt)
        if maximize:
            gf = -gf
        if weight_decay != 0:
            if adamw:
                pf = pf - (lr * weight_decay).astype(odt) * pf
            else:
                gf = gf + pf * weight_decay
        ea = m1[i].astype(odt) * b1.astype(odt) + gf * (1 - b1).astype(odt)
        es = m2[i].astype(odt) * b2.astype(odt) + gf * gf * (1 - b2).astype(odt)
        if amsgrad:
            mx = jnp.maximum(maxs[i].astype(odt), es)
            new_max.append(mx.astype(maxs[i].dtype))
            denom = jnp.sqrt(mx) / bc2_sqrt.astype(odt) + jnp.asarray(eps).astype(odt)
        else:
            denom = jnp.sqrt(es) / bc2_sqrt.astype(odt) + jnp.asarray(eps).astype(odt)
        pf = pf - step_size * ea / denom
        new_p.append(pf.astype(p.dtype))
        new_m1.append(ea.astype(m1[i].dtype))
        new_m2.append(es.astype(m2[i].dtype))
    new = new_p + grads + new_m1 + new_m2 + new_max
    return _skip_if_inf(found_inf, new, list(self))


def _adam_lowering(name):
    return _fused_lowering(
        name, _adam_math, ("state_steps", "grad_scale", "found_inf", "lr_t"),
        ("lr", "beta1", "beta2", "eps"), ("n", "amsgrad", "maximize", "weight_decay", "adamw"),
    )


FUSED_ADAM = _adam_lowering("_fused_adam_")
FUSED_ADAMW = _adam_lowering("_fused_adamw_")


def _sgd_math(self, grad_scale, found_inf, lr_t, lr, momentum, dampening, *,
              n, weight_decay, has_momentum, nesterov, maximize, is_first_step):
    params, grads = self[:n], self[n:2 * n]
    bufs = self[2 * n:3 * n] if has_momentum else []
    grads = _unscale(grads, grad_scale)
    lr = lr_t.reshape(()) if lr_t is not None else lr
    new_p, new_b = [], []
    for i in range(n):
        p, g = params[i], grads[i]
        odt = _opmath(p.dtype)
        pf, gf = p.astype(odt), g.astype(odt)
        if maximize:
            gf = -gf
        if weight_decay != 0:
            gf = gf + weight_decay * pf
        if has_momentum:
            mom = jnp.asarray(momentum).astype(odt)
            if is_first_step:
                b = gf
            else:
                b = bufs[i].astype(odt) * mom + (1 - jnp.asarray(dampening).astype(odt)) * gf
            new_b.append(b.astype(bufs[i].dtype))
            gf = gf + mom * b if nesterov else b
        pf = pf - jnp.asarray(lr).astype(odt) * gf
        new_p.append(pf.astype(p.dtype))
    return _skip_if_inf(found_inf, new_p + grads + new_b, list(self))


FUSED_SGD = _fused_lowering(
    "_fused_sgd_", _sgd_math, ("grad_scale", "found_inf", "lr_t"), ("lr", "momentum", "dampening"),
    ("n", "weight_decay", "has_momentum", "nesterov", "maximize", "is_first_step"),
)


def _adagrad_math(self, state_steps, grad_scale, found_inf, lr_t, lr, eps, *,
                  n, lr_decay, weight_decay, maximize):
    params, grads, sums = self[:n], self[n:2 * n], self[2 * n:3 * n]
    grads = _unscale(grads, grad_scale)
    lr = lr_t.reshape(()).astype(jnp.float64) if lr_t is not None else jnp.asarray(lr, jnp.float64)
    new_p, new_s = [], []
    for i in range(n):
        p, g = params[i], grads[i]
        odt = _opmath(p.dtype)
        # CPU's kernel: clr in double from the step read as a float; its constants pass through
        # the parameter's dtype (bfloat16's weight decay, eps and clr are rounded to bfloat16)
        step = state_steps[i].reshape(()).astype(jnp.float32).astype(jnp.float64)
        clr = lr / (1.0 + (step - 1.0) * lr_decay)
        const = lambda v: jnp.asarray(v).astype(p.dtype).astype(odt)  # noqa: E731
        pf, gf = p.astype(odt), g.astype(odt)
        if maximize:
            gf = -gf
        if weight_decay != 0:
            gf = gf + pf * const(weight_decay)
        ss = sums[i].astype(odt) + gf * gf
        pf = pf - const(clr) * gf / (jnp.sqrt(ss) + const(eps))
        new_p.append(pf.astype(p.dtype))
        new_s.append(ss.astype(sums[i].dtype))
    return _skip_if_inf(found_inf, new_p + grads + new_s, list(self))


FUSED_ADAGRAD = _fused_lowering(
    "_fused_adagrad_", _adagrad_math, ("state_steps", "grad_scale", "found_inf", "lr_t"), ("lr", "eps"),
    ("n", "lr_decay", "weight_decay", "maximize"),
)
