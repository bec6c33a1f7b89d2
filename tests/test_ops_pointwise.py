"""Pointwise family: arithmetic, math, comparisons, logic, activations (+ backward).

CPU PyTorch is the oracle. Every test runs with the CPU fallback forbidden, so a
missing lowering fails loudly.
"""
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import conftest
import torchtpu
from torchtpu.validate.samples import sample_inputs
from conftest import assert_same, to_tpu

pytestmark = [pytest.mark.usefixtures("no_fallback"), conftest.IN_EVERY_MODE]  # (conftest: modes)

# returns (the tpu result on the CPU, the CPU result), for the tests that look further
check = partial(conftest.check, equal_nan=True, both=True)


def bits_equal(a, b):
    """Exact comparison that tells -0.0 from 0.0 and NaN from NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.is_floating_point():
        a, b = a.double(), b.double()
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        a, b = torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0)
        assert torch.equal(torch.signbit(a), torch.signbit(b))
    assert torch.equal(a, b), (a, b)


# --- OpInfo sweep ---------------------------------------------------------------

F32, F16, BF16, I64, I32, I8, U8, B, C64 = (
    torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
    torch.uint8, torch.bool, torch.complex64,
)
UNARY_FLOAT = [
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sigmoid",
    "sqrt", "rsqrt", "reciprocal", "logit", "deg2rad", "rad2deg", "frac", "lgamma", "digamma",
    "sinc", "i0",
]
UNARY_ANY = [
    "neg", "abs", "sign", "sgn", "floor", "ceil", "trunc", "round", "square", "positive",
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "nan_to_num", "logical_not",
]
BINARY = [
    "add", "sub", "mul", "rsub", "div", "floor_divide", "remainder", "fmod", "pow", "atan2",
    "maximum", "minimum", "fmax", "fmin", "hypot", "copysign", "nextafter", "xlogy",
    "special.xlog1py", "logaddexp", "logaddexp2", "heaviside", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_xor", "true_divide", "float_power", "__rsub__",
    "__rpow__", "__rmod__",
]
INTEGRAL = ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
            "bitwise_right_shift", "__rand__", "__ror__", "__rxor__"]
OTHER = ["clamp", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv", "where", "masked_fill"]
ACTS = [
    "nn.functional.relu", "nn.functional.threshold", "nn.functional.leaky_relu",
    "nn.functional.hardtanh", "nn.functional.relu6", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.mish", "nn.functional.elu", "nn.functional.selu", "nn.functional.celu",
    "nn.functional.softplus", "nn.functional.hardswish", "nn.functional.hardsigmoid",
    "nn.functional.logsigmoid", "nn.functional.glu", "nn.functional.prelu",
    "nn.functional.hardshrink", "nn.functional.softshrink", "nn.functional.tanhshrink",
]

# (op names, dtypes, samples per (op, dtype))
PLAN = [
    (UNARY_FLOAT, (F32,), 3),
    (UNARY_FLOAT[:12], (BF16, I64), 1),
    (UNARY_ANY, (F32, I64), 2),
    (UNARY_ANY[:9], (F16, B, I8), 1),
    (BINARY, (F32,), 3),
    (BINARY, (I64,), 2),
    (BINARY[:12], (F16, BF16, U8), 1),
    (INTEGRAL, (I64, B), 2),
    (OTHER, (F32, I64), 3),
    (OTHER, (BF16, B), 1),
    (ACTS, (F32,), 3),
    (ACTS, (BF16,), 1),
    (["add", "mul", "sub", "div", "exp", "abs", "sgn", "sigmoid", "tanh", "eq", "where", "pow",
      "neg", "sqrt", "log", "reciprocal", "isnan", "nan_to_num"], (C64,), 2),
]


def _opinfo_params():
    names = {n for plan in PLAN for n in plan[0]}
    from torch.testing._internal.common_methods_invocations import op_db

    by_name = {}
    for o in op_db:
        if o.name in names and o.name not in by_name:
            by_name[o.name] = o
    params = []
    for ops, dtypes, n in PLAN:
        for name in ops:
            for dt in dtypes:
                params.append(pytest.param(name, dt, n, id=f"{name}-{str(dt)[6:]}"))
    return by_name, params


_BY_NAME, _PARAMS = _opinfo_params()


@pytest.mark.parametrize("name,dtype,n", _PARAMS)
def test_opinfo(name, dtype, n):
    op = _BY_NAME[name]
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip("dtype not supported by PyTorch CPU")
    done = 0
    for s in sample_inputs(op, "cpu", dtype):
        if done >= n:
            break
        try:
            cpu = op.op(s.input, *s.args, **s.kwargs)
        except Exception:
            continue
        tpu = op.op(to_tpu(s.input), *to_tpu(s.args), **to_tpu(s.kwargs))
        assert_same(tpu, cpu, equal_nan=True)
        done += 1


# --- arithmetic edge cases ------------------------------------------------------


def test_int_overflow_wraps():
    a = torch.tensor([127, -128, 100], dtype=torch.int8)
    check(lambda a: a + 1, a)
    check(lambda a: a * 3, a)
    check(lambda a: -a, a)
    check(torch.abs, a)
    big = torch.tensor([2**62, -(2**63), 3], dtype=torch.int64)
    check(lambda a: a * 4, big)
    check(lambda a: a - 1, big)


def test_int_division_rounding():
    a = torch.tensor([7, -7, 7, -7, 0, 5, -1], dtype=torch.int64)
    b = torch.tensor([2, 2, -2, -2, 3, -7, 3], dtype=torch.int64)
    for mode in ("trunc", "floor"):
        got, _ = check(lambda a, b: torch.div(a, b, rounding_mode=mode), a, b)
        assert got.dtype == torch.int64
    got, _ = check(torch.div, a, b)
    assert got.dtype == torch.float32
    check(torch.floor_divide, a, b)
    check(torch.remainder, a, b)
    check(torch.fmod, a, b)
    check(lambda a: torch.remainder(a, -3), a)
    check(lambda a: torch.div(a, 2, rounding_mode="floor"), a)
    check(lambda b: torch.remainder(5, b), b)
    u = torch.tensor([200, 7, 0], dtype=torch.uint8)
    check(lambda u: torch.div(u, 3, rounding_mode="floor"), u)
    check(lambda u: u % 3, u)


def test_float_division_rounding_and_signed_zero():
    a = torch.tensor([7.5, -7.5, 0.0, -0.0, 1.0, -1.0, 5.0, float("inf"), float("nan"), 1e-30])
    b = torch.tensor([2.0, 2.0, -3.0, 3.0, 0.0, 0.0, -0.0, 2.0, 1.0, -1e30])
    for fn in (
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        torch.floor_divide, torch.remainder, torch.fmod, torch.div,
    ):
        got, cpu = check(fn, a, b)
        bits_equal(got, cpu)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_float_floor_div_exact(dtype):
    q = (torch.randn(500) * 100).to(dtype)
    r = torch.randn(500).to(dtype)
    for mode in ("floor", "trunc"):
        got, cpu = check(lambda q, r: torch.div(q, r, rounding_mode=mode), q, r)
        bits_equal(got, cpu)
    got, cpu = check(torch.remainder, q, r)
    bits_equal(got, cpu)


def test_signed_zero_and_sign():
    x = torch.tensor([-0.0, 0.0, -2.5, 3.0, float("nan"), float("-inf")])
    for fn in (torch.sign, torch.sgn, torch.signbit, torch.neg, torch.abs, torch.floor, torch.ceil,
               torch.round, torch.trunc, torch.frac, lambda x: torch.copysign(x.abs() + 1, x),
               lambda x: torch.copysign(x, -1.0), lambda x: x * -1, torch.relu):
        got, cpu = check(fn, x)
        bits_equal(got, cpu)
    check(torch.sign, torch.tensor([-3, 0, 4]))
    check(torch.sign, torch.tensor([True, False]))


def test_nan_propagation():
    x = torch.tensor([1.0, float("nan"), 3.0, float("nan"), -0.0])
    y = torch.tensor([float("nan"), 2.0, 1.0, float("nan"), 0.0])
    for fn in (torch.maximum, torch.minimum, torch.fmax, torch.fmin,
               lambda x, y: torch.clamp(x, min=y), lambda x, y: torch.clamp(x, max=y),
               lambda x, y: torch.clamp(x, y, y + 1), torch.eq, torch.ne, torch.lt, torch.ge,
               torch.hypot, torch.atan2, torch.xlogy, torch.logaddexp, torch.heaviside):
        check(fn, x, y)
    check(lambda x: torch.clamp(x, 0.5, 2.0), x)
    check(lambda x: torch.clamp(x, min=float("nan")), x)
    check(lambda x: x.clamp_min(2.0), x)
    check(lambda x: F.hardtanh(x), x)
    check(lambda x: torch.nan_to_num(x), x)


def test_pow_integer_and_special():
    a = torch.tensor([2, 3, -3, 0, 1, -1, 7], dtype=torch.int64)
    check(lambda a: a ** 2, a)
    check(lambda a: a ** 63, a)
    check(lambda a: a ** 100, a)
    e = torch.tensor([-1, -2, -3, -1, -5, -3, 0], dtype=torch.int64)
    check(torch.pow, a, e)
    check(lambda e: 2 ** e.abs(), e)
    check(lambda a: a ** 0.5, a.abs())
    check(lambda a: torch.pow(a.to(torch.int8), 5), a)
    f = torch.tensor([0.0, -2.0, float("nan"), 2.0, float("inf")])
    check(lambda f: f ** 0, f)
    check(lambda f: f ** -1, f)
    check(lambda f: f ** 2.5, f)
    check(lambda f: torch.pow(2.0, f), f)
    check(lambda f: torch.pow(f, f), f)


def test_shifts_out_of_range():
    a = torch.tensor([1, -8, 255, -1, 64], dtype=torch.int64)
    s = torch.tensor([3, 1, 64, 70, -1], dtype=torch.int64)
    check(torch.bitwise_left_shift, a, s)
    check(torch.bitwise_right_shift, a, s)
    check(lambda a: a << 2, a)
    check(lambda a: a >> 1, a)
    u = torch.tensor([1, 128, 255], dtype=torch.uint8)
    check(lambda u: u << 3, u)
    check(lambda u, s: u >> s, u, torch.tensor([1, 9, 7], dtype=torch.uint8))
    check(lambda u: torch.bitwise_left_shift(2, u), u)
    check(lambda u: ~u, u)
    check(lambda u: u & 0x0F, u)
    check(lambda u: u ^ torch.tensor(3, dtype=torch.uint8), u)


# --- promotion -------------------------------------------------------------------


@pytest.mark.parametrize(
    "da,db",
    [(torch.int64, torch.float32), (torch.bool, torch.int32), (torch.float16, torch.float32),
     (torch.uint8, torch.int8), (torch.bfloat16, torch.float16), (torch.int32, torch.int64),
     (torch.bool, torch.bool), (torch.float32, torch.complex64), (torch.int8, torch.float64)],
)
def test_binary_promotion(da, db):
    a = torch.tensor([3, 0, 1, 5]).to(da)
    b = torch.tensor([2, 1, 1, 3]).to(db)
    for fn in (torch.add, torch.mul, torch.sub, torch.div, torch.eq, torch.lt, torch.maximum,
               torch.where.__call__ if False else (lambda a, b: torch.where(a > b, a, b)),
               lambda a, b: a + 2.5, lambda a, b: b * 3, lambda a, b: a * torch.tensor(1.5),
               lambda a, b: b + torch.tensor(2, dtype=torch.int16),
               lambda a, b: torch.where(a > 2, a, 1.5), lambda a, b: torch.where(a > 2, 1, b),
               torch.logical_and, torch.logical_xor):
        try:
            cpu = fn(a, b)
        except RuntimeError:
            continue
        got, _ = check(fn, a, b)
        assert got.dtype == cpu.dtype


def test_scalar_overloads_direct():
    x = torch.arange(4)
    h = torch.randn(4).half()
    aten = torch.ops.aten
    for fn in (
        lambda x: aten.add.Scalar(x, 1.5), lambda x: aten.mul.Scalar(x, 2),
        lambda x: aten.sub.Scalar(x, 1, 2), lambda x: aten.rsub.Scalar(x, 1.5),
        lambda x: aten.div.Scalar(x, 2), lambda x: aten.div.Scalar_mode(x, 2, rounding_mode="floor"),
        lambda x: aten.eq.Scalar(x, 2.0), lambda x: aten.remainder.Scalar(x, 1.5),
        lambda x: aten.remainder.Scalar_Tensor(7, x + 1), lambda x: aten.pow.Scalar(2.5, x),
        lambda x: aten.pow.Tensor_Scalar(x, 2.0), lambda x: aten.clamp(x, 0.5, None),
        lambda x: aten.clamp_min(x, 1.5), lambda x: aten.clamp_max(x, 1),
        lambda x: aten.bitwise_and.Scalar_Tensor(6, x), lambda x: aten.fmod.Scalar(x, 2.5),
        lambda x: aten.copysign.Scalar(x, -1), lambda x: aten.xlogy.Scalar_Self(2, x),
        lambda x: aten.xlogy.Scalar_Other(x, 3),
    ):
        for t in (x, h):
            try:
                fn(t)
            except (RuntimeError, NotImplementedError):
                continue  # not supported by PyTorch for this dtype either
            got, cpu = check(fn, t)
            assert got.dtype == cpu.dtype


def test_alpha_and_value_scalars():
    a, b, c = torch.randn(3, 4), torch.randn(3, 4), torch.rand(3, 4) + 0.5
    check(lambda a, b: torch.add(a, b, alpha=2.5), a, b)
    check(lambda a, b: torch.sub(a, b, alpha=-3), a, b)
    check(lambda a, b: torch.rsub(a, b, alpha=2), a, b)
    check(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), a, b, c)
    check(lambda a, b, c: torch.addcdiv(a, b, c, value=-2), a, b, c)
    i = torch.arange(6).reshape(2, 3)
    check(lambda i: torch.add(i, i, alpha=3), i)
    check(lambda i: torch.addcmul(i, i, i, value=2), i)
    check(lambda a, b: torch.lerp(a, b, 0.3), a, b)
    check(lambda a, b: torch.lerp(a, b, 0.7), a, b)
    check(lambda a, b, c: torch.lerp(a, b, c), a, b, c)


# --- layouts, in-place, out= -----------------------------------------------------


def test_noncontiguous_empty_zero_dim():
    x = torch.randn(4, 6)
    y = torch.randn(6, 4)
    check(lambda x, y: x.t() + y, x, y)
    check(lambda x: torch.sin(x[::2, 1::2]), x)
    check(lambda x, y: torch.maximum(x[:, :1].expand(4, 6), y.t()), x, y)
    check(lambda x: torch.where(x.t() > 0, x.t(), 0.0), x)
    e = torch.randn(0, 3)
    check(lambda e: e * 2 + 1, e)
    check(lambda e: torch.exp(e), e)
    check(lambda e: e > 0, e)
    s = torch.tensor(1.5)
    check(lambda s, x: s * x, s, x)
    check(lambda s: torch.tanh(s), s)
    check(lambda s: torch.clamp(s, 0, 1), s)
    check(lambda s, x: torch.atan2(s, x), s, x)


def test_inplace_variants():
    def run(x):
        x = x.clone()
        x.add_(1.5)
        x.mul_(torch.arange(6.0).to(x.device))
        x[:, ::2].sub_(2)
        x.t()[1].div_(4)
        x.clamp_(-3, 10)
        x.sigmoid_()
        x.masked_fill_(x > 0.9, -1.0)
        F.relu(x, inplace=True)
        x.pow_(2).neg_()
        torch.nn.functional.leaky_relu_(x, 0.2)
        x.lerp_(torch.ones(6).to(x.device), 0.25)
        return x

    check(run, torch.randn(6, 6))

    def run_int(i):
        i = i.clone()
        i.bitwise_and_(6)
        i <<= 1
        i.floor_divide_(3)
        i.remainder_(5)
        return i

    check(run_int, torch.arange(-6, 6).reshape(3, 4))
    t = torch.arange(4).to("tpu")
    with pytest.raises(RuntimeError):
        t.add_(1.5)
    with pytest.raises(RuntimeError):
        t.div_(2)


def test_out_variants():
    a, b = torch.randn(3, 4), torch.randn(4)

    def run(a, b):
        o = torch.empty(3, 4, device=a.device)
        torch.add(a, b, out=o)
        o2 = torch.empty(0, device=a.device)
        torch.mul(a, b, out=o2)  # resized
        o3 = torch.empty(3, 4, dtype=torch.float64, device=a.device)
        torch.exp(a, out=o3)
        o4 = torch.empty(3, 4, dtype=torch.float32, device=a.device)
        torch.logical_and(a > 0, b > 0, out=o4)
        o5 = torch.empty(3, 4, dtype=torch.bool, device=a.device)
        torch.gt(a, b, out=o5)
        return o, o2, o3, o4, o5

    check(run, a, b)
    bad = torch.empty(3, 4, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError):
        torch.div(a.to("tpu"), b.to("tpu"), out=bad)


def test_where_and_masked_fill():
    x = torch.randn(3, 4)
    m = x > 0
    check(lambda m, x: torch.where(m, x, x.double()), m, x)
    check(lambda m, x: torch.where(m, 1, 0), m, x)
    check(lambda m, x: x.masked_fill(m, 2), m, x)
    check(lambda m, x: x.masked_fill(m[0], torch.tensor(3.0)), m, x)
    check(lambda m: m.masked_fill(~m, True), m)
    check(lambda m, x: x.long().masked_fill(m, 7), m, x)


def test_complex():
    z = torch.randn(5, dtype=torch.complex64)
    w = torch.randn(5, dtype=torch.complex64)
    for fn in (torch.add, torch.mul, torch.div, torch.sub, torch.eq, torch.ne):
        check(fn, z, w)
    for fn in (torch.abs, torch.sgn, torch.exp, torch.log, torch.sqrt, torch.sigmoid, torch.tanh,
               torch.isnan, torch.isfinite, torch.reciprocal, torch.neg, lambda z: z * 2.0,
               lambda z: z + 1j, torch.conj_physical):
        got, cpu = check(fn, z)
        assert got.dtype == cpu.dtype


# --- activations and backward ------------------------------------------------------

ACT_FNS = [
    F.relu, F.relu6, lambda x: F.threshold(x, 0.1, -2.0), lambda x: F.leaky_relu(x, 0.1),
    lambda x: F.hardtanh(x, -0.5, 0.7), F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.silu,
    F.mish, F.elu, lambda x: F.elu(x, 0.5), F.selu, lambda x: F.celu(x, 1.5), F.softplus,
    lambda x: F.softplus(x, beta=2, threshold=1), F.hardswish, F.hardsigmoid, F.logsigmoid,
    F.glu, lambda x: F.glu(x, 0), F.hardshrink, lambda x: F.softshrink(x, 0.3), torch.sigmoid,
    torch.tanh, lambda x: torch.logit(x.sigmoid()), lambda x: torch.logit(x.sigmoid(), 0.2),
    lambda x: F.prelu(x, torch.full((1,), 0.25, dtype=x.dtype, device=x.device)),
    lambda x: F.prelu(x, torch.linspace(0.1, 0.5, 6, dtype=x.dtype, device=x.device)),
    torch.exp, torch.log1p, torch.sin, torch.atan, torch.erf, torch.erfinv, torch.sqrt,
    torch.rsqrt, torch.reciprocal, torch.abs, lambda x: x ** 3, lambda x: torch.pow(x, x),
    lambda x: torch.clamp(x, -0.5, 0.5), lambda x: torch.maximum(x, x.flip(0)),
    lambda x: torch.atan2(x, x.flip(0)), lambda x: torch.lerp(x, x.flip(0), 0.3),
    lambda x: torch.where(x > 0, x * 2, x / 3), lambda x: torch.hypot(x, x.flip(0)),
]
# ops of other families that autograd legitimately needs around pointwise backward
OTHER_FAMILIES = {"sum.dim_IntList", "sum.default", "flip.default", "fill.Scalar", "zeros_like.default",
                  "ones_like.default", "empty_like.default", "linspace.default", "unsqueeze.default",
                  "expand.default", "full.default", "sum.IntList_out"}


@pytest.mark.parametrize("i", range(len(ACT_FNS)))
def test_forward_backward(i):
    fn = ACT_FNS[i]
    torchtpu.set_fallback(True)  # other families' ops (sum, flip) may fall back here
    torchtpu.reset_metrics()
    x = torch.randn(4, 6, dtype=torch.float64)
    if fn in (torch.sqrt, torch.rsqrt, torch.reciprocal, torch.log1p):
        x = x.abs() + 0.1
    if fn is torch.erfinv:
        x = x.tanh() * 0.9
    g = torch.randn(4, 6 if fn not in (F.glu,) else 3, dtype=torch.float64)

    def run(x, g):
        x = x.detach().requires_grad_(True)
        y = fn(x)
        gg = g if g.shape == y.shape else torch.ones_like(y)
        (gx,) = torch.autograd.grad(y, x, gg)
        return y, gx

    check(run, x, g)
    bad = {k for k in torchtpu.metrics()["fallback_ops"] if k not in OTHER_FAMILIES}
    assert not bad, bad


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_activations_reduced_precision(dtype):
    x = (torch.randn(64) * 3).to(dtype)
    for fn in (F.gelu, F.silu, F.elu, F.softplus, F.hardswish, F.mish, F.logsigmoid, torch.sigmoid,
               F.leaky_relu, F.hardsigmoid, F.glu):
        check(fn, x)
    g = torch.randn(64).to(dtype)
    aten = torch.ops.aten
    for fn in (lambda g, x: aten.gelu_backward(g, x), lambda g, x: aten.silu_backward(g, x),
               lambda g, x: aten.threshold_backward(g, x, 0.0),
               lambda g, x: aten.softplus_backward(g, x, 1.0, 20.0),
               lambda g, x: aten.sigmoid_backward(g, x.sigmoid()),
               lambda g, x: aten.log_sigmoid_backward(g, x, aten.log_sigmoid_forward(x)[1]),
               lambda g, x: aten._prelu_kernel_backward(g, x, torch.full_like(x, 0.2))):
        check(fn, g, x)


def test_special_values_and_reduced_precision_math():
    check(torch.digamma, torch.tensor([0.0, -0.0, -2.0, 1.0, 2.5]))
    check(torch.digamma, torch.tensor([0, 1, 3]))
    check(torch.square, torch.tensor([True, False]))
    check(torch.square, torch.tensor([3, -4], dtype=torch.int8))
    for dt in (torch.float16, torch.bfloat16):
        x = torch.rand(200).to(dt)
        got, cpu = check(torch.logit, x)
        bits_equal(got, cpu)
        check(lambda x: torch.logit(x, 0.1), x)
    check(torch.isfinite, torch.tensor([1 + 1j, complex("nan"), complex("inf")], dtype=torch.complex64))
    check(lambda x: torch.nan_to_num(x, nan=1.0, posinf=2.0), torch.tensor([float("nan"), float("inf"), -float("inf")]))
    check(torch.nan_to_num, torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float16))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("fn", [torch.nn.functional.elu_, torch.nn.functional.celu_])
def test_inplace_elu_negative_alpha_backward_raises(mode, fn):
    # PyTorch's test_elu_inplace_with_neg_alpha: CPU's elu_backward kernel (not its meta function)
    # refuses is_result with alpha < 0; tpu returned a gradient
    for dev in ("cpu", "tpu"):
        with torchtpu.eager_mode(mode):
            a = torch.tensor([-1.0, 1.0], device=dev, requires_grad=True)
            b = fn(a.clone(), alpha=-2)
            with pytest.raises(RuntimeError, match="call out-of-place version"):
                b.backward(torch.ones(2, device=dev))
    conftest.check(lambda a: fn(a.clone(), alpha=2), torch.tensor([-1.0, 1.0]), grad=True)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_heaviside_polar_mixed_dtypes_raise_as_on_cpu(mode):
    # PyTorch's test_heaviside and test_torch_complex_same_dtype_error: CPU's kernels refuse
    # tensors of different dtypes that the meta kernels accept; tpu computed a result
    calls = [lambda i, v, o: torch.heaviside(i, v), lambda i, v, o: i.heaviside(v),
             lambda i, v, o: torch.heaviside(i, v, out=o), lambda i, v, o: i.clone().heaviside_(v),
             lambda i, v, o: torch.polar(i.float(), v.double()),
             lambda i, v, o: torch.polar(v.long(), v.long()), lambda i, v, o: torch.polar(v.bool(), v.bool())]
    i, v = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float16), torch.tensor([3, 4, 5], dtype=torch.int8)
    with torchtpu.eager_mode(mode):
        for call in calls:
            with pytest.raises(RuntimeError) as want:
                call(i, v, torch.empty_like(i))
            with pytest.raises(RuntimeError, match=str(want.value).splitlines()[0][:40]):
                call(to_tpu(i), to_tpu(v), torch.empty_like(to_tpu(i)))
        assert_same(torch.heaviside(to_tpu(i), to_tpu(i)), torch.heaviside(i, i))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_add_sub_alpha_checks_as_on_cpu(mode):
    # PyTorch's test_alpha_mismatch: torch.add(bool, bool, alpha=1.1) computed on tpu (the meta
    # kernel misses the bool case of CPU's alpha_check)
    with torchtpu.eager_mode(mode):
        for dt in (torch.bool, torch.int32, torch.float32, torch.complex64):
            for alpha in (1.1, True, 2, 1j):
                for op in (torch.add, torch.sub):
                    if op is torch.sub and dt == torch.bool:
                        continue
                    x = torch.ones(4, dtype=dt)
                    try:
                        want = op(x, x, alpha=alpha)
                    except RuntimeError as err:
                        with pytest.raises(RuntimeError, match=str(err)[:40]):
                            op(to_tpu(x), to_tpu(x), alpha=alpha)
                        continue
                    assert_same(op(to_tpu(x), to_tpu(x), alpha=alpha), want)
