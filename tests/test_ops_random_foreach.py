"""Random ops and the _foreach_* ops (optimizers) on the tpu device.

Random ops are not bitwise equal to CPU PyTorch: they are checked for shapes, dtypes,
ranges, statistics and reproducibility under torch.manual_seed. The _foreach_* ops
are checked against CPU PyTorch, and through real optimizers.
"""
import copy
import math
import warnings

import pytest
import torch

import conftest
import torchtpu
from conftest import assert_same, check, inplace
from conftest import to_tpu as tpu

pytestmark = conftest.IN_EVERY_MODE  # strict here; defer_and_fuse and compile in the slow tier

warnings.filterwarnings("ignore", category=UserWarning)

RANDOM = {
    "normal", "normal_", "normal_functional", "uniform", "uniform_", "bernoulli", "bernoulli_",
    "random", "random_", "exponential", "exponential_", "geometric", "geometric_", "log_normal",
    "log_normal_", "cauchy", "cauchy_", "randperm", "multinomial", "native_dropout",
    "native_dropout_backward", "poisson",
}


def _mine_fell_back():
    ops = torchtpu.metrics()["fallback_ops"]
    return {k: v for k, v in ops.items() if k.startswith("_foreach") or k.split(".")[0] in RANDOM}


@pytest.fixture
def own_ops_native():
    """Ops of this family must not fall back (ops of other families may, while they are written)."""
    torchtpu.reset_metrics()
    yield
    assert _mine_fell_back() == {}


# =========================================================================== random


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_randn_rand_stats(own_ops_native, dtype):
    torch.manual_seed(0)
    x = torch.randn(4000, device="tpu", dtype=dtype)
    u = torch.rand(4000, device="tpu", dtype=dtype)
    assert x.device.type == "tpu" and x.dtype == dtype and x.shape == (4000,)
    xc, uc = x.cpu().double(), u.cpu().double()
    assert abs(xc.mean()) < 0.1 and abs(xc.std() - 1) < 0.1
    assert uc.min() >= 0 and uc.max() <= 1 and abs(uc.mean() - 0.5) < 0.05
    assert u.dtype == dtype


def test_factories_and_like(own_ops_native):
    base = torch.zeros(2, 3, device="tpu", dtype=torch.float64)
    for t in (torch.randn_like(base), torch.rand_like(base)):
        assert t.shape == (2, 3) and t.dtype == torch.float64 and t.device.type == "tpu"
    r = torch.randint(3, 7, (500,), device="tpu")
    assert r.dtype == torch.int64
    rc = r.cpu()
    assert rc.min() >= 3 and rc.max() <= 6 and set(rc.tolist()) == {3, 4, 5, 6}
    r2 = torch.randint(5, (2, 2), device="tpu", dtype=torch.int32)
    assert r2.dtype == torch.int32 and r2.cpu().max() < 5
    rl = torch.randint_like(base, 10)
    assert rl.dtype == torch.float64 and bool(((rl.cpu() >= 0) & (rl.cpu() < 10)).all())
    assert torch.randn(0, 3, device="tpu").shape == (0, 3)
    assert torch.randn((), device="tpu").shape == ()


def test_reproducible_under_manual_seed(own_ops_native):
    torch.manual_seed(123)
    a = torch.randn(8, device="tpu").cpu()
    b = torch.randn(8, device="tpu").cpu()
    torch.manual_seed(123)
    a2 = torch.randn(8, device="tpu").cpu()
    b2 = torch.randn(8, device="tpu").cpu()
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)
    torch.manual_seed(124)
    assert not torch.equal(torch.randn(8, device="tpu").cpu(), a)


def test_rng_state_roundtrip(own_ops_native):
    torch.manual_seed(7)
    state = torch.tpu.get_rng_state()
    a = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), a)


def test_normal_variants(own_ops_native):
    torch.manual_seed(0)
    x = torch.empty(3000, device="tpu").normal_(2.0, 0.5)
    xc = x.cpu()
    assert abs(xc.mean() - 2) < 0.05 and abs(xc.std() - 0.5) < 0.05
    mean = torch.full((3000,), 5.0, device="tpu")
    std = torch.full((3000,), 2.0, device="tpu")
    for t in (torch.normal(mean, 2.0), torch.normal(5.0, std), torch.normal(mean, std)):
        tc = t.cpu()
        assert t.shape == (3000,) and t.dtype == torch.float32
        assert abs(tc.mean() - 5) < 0.2 and abs(tc.std() - 2) < 0.2
    # Tensor_Tensor broadcasts and keeps mean's dtype
    t = torch.normal(torch.zeros(3, 1, device="tpu", dtype=torch.float64), torch.ones(4, device="tpu"))
    assert t.shape == (3, 4) and t.dtype == torch.float64
    t = torch.normal(0.0, 1.0, (2, 5), device="tpu")
    assert t.shape == (2, 5) and t.dtype == torch.float32
    out = torch.empty(6, device="tpu")
    torch.normal(torch.zeros(6, device="tpu"), 1.0, out=out)
    assert out.cpu().std() > 0
    f = torch.ops.aten.normal_functional(torch.zeros(100, device="tpu"), 10.0, 0.0)
    assert torch.equal(f.cpu(), torch.full((100,), 10.0))
    with pytest.raises(RuntimeError, match="std"):
        torch.empty(3, device="tpu").normal_(0.0, -1.0)


def test_normal_half_and_noncontiguous(own_ops_native):
    x = torch.zeros(4, 6, device="tpu", dtype=torch.float16)
    x[:, ::2].normal_()
    xc = x.cpu()
    assert x.dtype == torch.float16
    assert (xc[:, 1::2] == 0).all() and (xc[:, ::2] != 0).all()


def test_uniform(own_ops_native):
    x = torch.empty(2000, device="tpu").uniform_(-3.0, -1.0)
    xc = x.cpu()
    assert xc.min() >= -3 and xc.max() < -1 and abs(xc.mean() + 2) < 0.1
    y = torch.zeros(10, device="tpu", dtype=torch.float64)
    y[::2].uniform_(5, 6)
    yc = y.cpu()
    assert (yc[1::2] == 0).all() and (yc[::2] >= 5).all()
    with pytest.raises(RuntimeError, match="from"):
        torch.empty(3, device="tpu").uniform_(1.0, 0.0)


def test_bernoulli(own_ops_native):
    x = torch.empty(4000, device="tpu").bernoulli_(0.3)
    xc = x.cpu()
    assert set(xc.unique().tolist()) <= {0.0, 1.0} and abs(xc.mean() - 0.3) < 0.05
    assert torch.empty(10, device="tpu").bernoulli_(0.0).cpu().sum() == 0
    assert torch.empty(10, device="tpu").bernoulli_(1.0).cpu().sum() == 10
    i = torch.empty(10, device="tpu", dtype=torch.int64).bernoulli_(1.0)
    assert i.dtype == torch.int64 and i.cpu().tolist() == [1] * 10
    p = torch.tensor([0.0, 1.0, 0.0, 1.0]).to("tpu")
    assert torch.bernoulli(p).cpu().tolist() == [0.0, 1.0, 0.0, 1.0]
    # p broadcast over self, Tensor p
    z = torch.empty(3, 4, device="tpu").bernoulli_(p)
    assert z.cpu().tolist() == [[0.0, 1.0, 0.0, 1.0]] * 3
    b = torch.bernoulli(torch.full((4000,), 0.7, device="tpu", dtype=torch.float64))
    assert b.dtype == torch.float64 and abs(b.cpu().mean() - 0.7) < 0.05
    bp = torch.bernoulli(torch.zeros(4000, device="tpu"), 0.25)
    assert abs(bp.cpu().mean() - 0.25) < 0.05
    bo = torch.zeros(5, dtype=torch.bool, device="tpu").bernoulli_(1.0)
    assert bo.dtype == torch.bool and bo.cpu().all()


@pytest.mark.parametrize(
    "dtype,lo,hi",
    [
        (torch.float32, 0, 2**24),
        (torch.float16, 0, 2**11),
        (torch.int8, 0, 127),
        (torch.uint8, 0, 255),
        (torch.int64, 0, 2**63 - 1),
        (torch.bool, 0, 1),
    ],
)
def test_random_default_range(own_ops_native, dtype, lo, hi):
    x = torch.empty(2000, device="tpu", dtype=dtype).random_()
    xc = x.cpu()
    assert x.dtype == dtype
    assert xc.min().item() >= lo and xc.max().item() <= hi
    if dtype != torch.int64:
        assert xc.double().max() > lo + (hi - lo) * 0.8  # spans the range


def test_random_from_to(own_ops_native):
    x = torch.empty(1000, device="tpu", dtype=torch.int64).random_(-5, 5)
    assert set(x.cpu().tolist()) == set(range(-5, 5))
    y = torch.empty(1000, device="tpu").random_(4)
    assert set(y.cpu().tolist()) == {0.0, 1.0, 2.0, 3.0}
    z = torch.empty(1000, device="tpu", dtype=torch.int8).random_(-100, None)
    zc = z.cpu()
    assert zc.min() >= -100 and zc.max() <= 127 and zc.min() < -50 and zc.max() > 100
    with pytest.raises(RuntimeError, match="from"):
        torch.empty(3, device="tpu").random_(5, 2)


@pytest.mark.parametrize("dtype,lo,hi", [(torch.bool, 0, 3), (torch.bool, -1, 1), (torch.uint8, 0, 257),
                                          (torch.int8, -129, 0), (torch.int32, 0, 2**40), (torch.float16, -2**40, 0)])
def test_random_bounds_outside_the_dtype_raise_as_on_cpu(dtype, lo, hi):
    # the draw would wrap into the dtype: CPU refuses, naming the bound and the C type
    with pytest.raises(RuntimeError) as cpu:
        torch.zeros(4, dtype=dtype).random_(lo, hi)
    with pytest.raises(RuntimeError) as got:
        torch.zeros(4, dtype=dtype, device="tpu").random_(lo, hi)
    assert str(got.value) == str(cpu.value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_random_kernel_errors_name_the_dtype_as_cpu(dtype):
    for fn in (torch.bernoulli, lambda t: t.uniform_(), torch.poisson):
        with pytest.raises(NotImplementedError) as cpu:
            fn(torch.ones(3, dtype=dtype))
        with pytest.raises(NotImplementedError) as got:
            fn(torch.ones(3, dtype=dtype, device="tpu"))
        assert str(got.value) == str(cpu.value)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
def test_poisson(own_ops_native, dtype):
    torch.manual_seed(0)
    rate = torch.tensor([0.0, 0.5, 4.0, 30.0], dtype=dtype).repeat(4000, 1)
    x = torch.poisson(tpu(rate))
    assert x.dtype == dtype and x.shape == rate.shape
    xc = x.cpu().double()
    assert torch.equal(xc, xc.round()) and xc.min() >= 0 and (xc[:, 0] == 0).all()
    assert_same(xc.mean(0), rate[0].double(), atol=0.1, rtol=0.03, device="cpu")
    assert_same(xc.var(0), rate[0].double(), atol=0.1, rtol=0.06, device="cpu")
    with pytest.raises(RuntimeError, match="invalid Poisson rate"):
        torch.poisson(tpu(torch.tensor([1.0, -1.0]))).cpu()


def test_exponential_geometric_lognormal_cauchy(own_ops_native):
    torch.manual_seed(1)
    e = torch.empty(4000, device="tpu").exponential_(2.0).cpu()
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 0.05
    g = torch.empty(4000, device="tpu").geometric_(0.25).cpu()
    assert g.min() >= 1 and torch.equal(g, g.round()) and abs(g.mean() - 4) < 0.3
    gi = torch.empty(10, device="tpu", dtype=torch.int32).geometric_(0.5)
    assert gi.dtype == torch.int32 and gi.cpu().min() >= 1
    ln = torch.empty(4000, device="tpu").log_normal_(0.0, 0.5).cpu()
    assert ln.min() > 0 and abs(ln.log().mean()) < 0.05 and abs(ln.log().std() - 0.5) < 0.05
    c = torch.empty(4001, device="tpu").cauchy_(3.0, 1.0).cpu()
    assert abs(c.median() - 3) < 0.15
    with pytest.raises(RuntimeError, match="lambda"):
        torch.empty(3, device="tpu").exponential_(-1.0)


def test_randperm(own_ops_native):
    p = torch.randperm(50, device="tpu")
    assert p.dtype == torch.int64 and p.device.type == "tpu"
    assert torch.equal(p.cpu().sort().values, torch.arange(50))
    assert not torch.equal(p.cpu(), torch.arange(50))
    pf = torch.randperm(10, device="tpu", dtype=torch.float32)
    assert pf.dtype == torch.float32 and torch.equal(pf.cpu().sort().values, torch.arange(10.0))
    assert torch.randperm(0, device="tpu").shape == (0,)
    out = torch.empty(3, dtype=torch.int32, device="tpu")
    torch.randperm(7, out=out)
    assert out.shape == (7,) and torch.equal(out.cpu().sort().values, torch.arange(7, dtype=torch.int32))


def test_multinomial(own_ops_native):
    probs = torch.tensor([[0.0, 1.0, 3.0, 0.0, 4.0], [1.0, 1.0, 1.0, 1.0, 0.0]]).to("tpu")
    s = torch.multinomial(probs, 3)
    sc = s.cpu()
    assert s.dtype == torch.int64 and s.shape == (2, 3)
    assert set(sc[0].tolist()) == {1, 2, 4}
    for row in sc:
        assert len(set(row.tolist())) == 3
    assert 4 not in sc[1].tolist()
    r = torch.multinomial(torch.tensor([1.0, 3.0]).to("tpu"), 4000, replacement=True).cpu()
    assert r.shape == (4000,) and abs(r.double().mean() - 0.75) < 0.05
    one = torch.multinomial(torch.tensor([0.0, 0.0, 2.0]).to("tpu"), 1)
    assert one.cpu().tolist() == [2]
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(3, device="tpu"), 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_native_dropout(own_ops_native, dtype):
    torch.manual_seed(0)
    x = torch.rand(4000, dtype=dtype).add(0.5).to("tpu")
    out, mask = torch.ops.aten.native_dropout(x, 0.25, True)
    assert out.dtype == dtype and mask.dtype == torch.bool and out.shape == x.shape
    oc, mc, xc = out.cpu(), mask.cpu(), x.cpu()
    assert abs(mc.float().mean() - 0.75) < 0.05
    assert_same(out, (xc * mc * (1 / 0.75)).to(dtype))
    g = torch.ops.aten.native_dropout_backward(torch.ones_like(x), mask, 1 / 0.75)
    assert_same(g, torch.ops.aten.native_dropout_backward(torch.ones_like(xc), mc, 1 / 0.75))
    o2, m2 = torch.ops.aten.native_dropout(x, 0.25, False)
    assert torch.equal(o2.cpu(), xc) and m2.cpu().all()
    o3, _ = torch.ops.aten.native_dropout(x, 1.0, True)
    assert (o3.cpu() == 0).all()


def test_nn_dropout_train_eval_backward(own_ops_native):
    torch.manual_seed(0)
    drop = torch.nn.Dropout(0.5)
    x = torch.rand(2000).add(0.5).to("tpu").requires_grad_()
    y = drop(x)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    yc, gc = y.detach().cpu(), gx.cpu()
    kept = yc != 0
    assert 0.4 < kept.float().mean() < 0.6
    assert_same(yc[kept], x.detach().cpu()[kept] * 2, device="cpu")
    assert_same(gx, kept.float() * 2)
    drop.eval()
    assert torch.equal(drop(x).detach().cpu(), x.detach().cpu())


def test_explicit_generator_rejected(own_ops_native):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="generator"):
        torch.randn(3, device="tpu", generator=g)
    with pytest.raises(RuntimeError, match="generator"):
        torch.empty(3, device="tpu").uniform_(generator=g)


# =========================================================================== foreach


def _lists(dtype=torch.float32, positive=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,), ()]
    out = []
    for s in shapes:
        t = torch.randn(s, generator=gen, dtype=torch.float64)
        if positive:
            t = t.abs() + 0.5
        out.append(t.to(dtype))
    return out


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max"]


@pytest.mark.parametrize("op", BINARY)
def test_foreach_binary(own_ops_native, op):
    f = getattr(torch, f"_foreach_{op}")
    f_ = getattr(torch, f"_foreach_{op}_")
    a, b = _lists(seed=1), _lists(positive=True, seed=2)
    check(f, a, b)
    check(f, a, 0.5)
    check(f, a, [0.5, -2.0, 3])
    check(inplace(f_), [t.clone() for t in a], b)
    check(inplace(f_), [t.clone() for t in a], 2.5)
    check(inplace(f_), [t.clone() for t in a], [1.5, 2, -0.25])
    if op in ("add", "mul", "div"):
        check(f, a, torch.tensor(1.5))  # 0-d tensor (on the device)
        check(inplace(f_), [t.clone() for t in a], torch.tensor(-2.0))
    if op in ("add", "sub"):
        check(lambda x, y: f(x, y, alpha=0.5), a, b)
        check(inplace(lambda x, y: f_(x, y, alpha=-2)), [t.clone() for t in a], b)


def test_foreach_binary_dtypes(own_ops_native):
    ints = [torch.arange(6).reshape(2, 3), torch.tensor([5, -3])]
    halves = _lists(torch.float16, seed=3)
    bf = _lists(torch.bfloat16, seed=4)
    check(torch._foreach_add, ints, 2)
    check(torch._foreach_add, ints, 1.5)  # int list + float scalar -> float32
    check(torch._foreach_div, ints, 2)  # true division
    check(torch._foreach_mul, ints, [2, 3])
    check(torch._foreach_add, halves, halves)
    check(torch._foreach_mul, bf, 0.1)
    check(torch._foreach_add, halves, torch.tensor(1.0, dtype=torch.float64))  # 0-d: no promotion
    mixed = [torch.ones(2), torch.ones(3, dtype=torch.float64), torch.ones(2, dtype=torch.float16)]
    check(torch._foreach_mul, mixed, 3.0)
    check(inplace(torch._foreach_add_), [t.clone() for t in ints], 3)
    with pytest.raises(RuntimeError):
        torch._foreach_add_(tpu(ints), 1.5)


def test_foreach_noncontiguous_and_views(own_ops_native):
    base = torch.randn(4, 6)
    a = [base.t(), base[::2, 1:]]
    b = [torch.randn(6, 4), torch.randn(2, 5)]
    check(torch._foreach_add, a, b)
    # in-place into strided views of a tpu tensor writes through to the base
    dbase = base.to("tpu")
    torch._foreach_mul_([dbase[::2], dbase[1::2, ::3]], 2.0)
    cb = base.clone()
    torch._foreach_mul_([cb[::2], cb[1::2, ::3]], 2.0)
    assert_same(dbase, cb)


def test_foreach_empty_tensors(own_ops_native):
    a = [torch.randn(0, 3), torch.randn(2)]
    check(torch._foreach_add, a, 1.0)
    check(torch._foreach_sqrt, [t.abs() for t in a])


@pytest.mark.parametrize("op", ["addcmul", "addcdiv"])
@conftest.xfail_in("compile", "PyTorch's fake kernel of _foreach_addcmul/addcdiv.Tensor reads its CPU scalars tensor's values, which a fake tensor lacks ('Expected scalars to be on CPU, got meta'): Dynamo fails before any backend runs")
def test_foreach_addc(own_ops_native, op):
    f = getattr(torch, f"_foreach_{op}")
    f_ = getattr(torch, f"_foreach_{op}_")
    s, t1, t2 = _lists(seed=1), _lists(seed=2), _lists(positive=True, seed=3)
    check(f, s, t1, t2)
    check(lambda a, b, c: f(a, b, c, value=-0.5), s, t1, t2)
    check(f, s, t1, t2, [0.5, 2.0, -1.0])
    check(lambda a, b, c: f(a, b, c, torch.tensor([0.5, 2.0, -1.0])), s, t1, t2)  # a CPU scalars tensor
    with pytest.raises(RuntimeError, match="Expected scalars to be on CPU, got tpu:0 instead"):
        f(tpu(s), tpu(t1), tpu(t2), tpu(torch.tensor([0.5, 2.0, -1.0])))  # as CUDA refuses a device one
    check(inplace(f_), [t.clone() for t in s], t1, t2, 0.25)
    check(inplace(f_), [t.clone() for t in s], t1, t2, [0.5, 2.0, -1.0])
    c = [x.clone() for x in s]
    f_(c, t1, t2, torch.tensor([0.5, 2.0, -1.0]))
    d = tpu([x.clone() for x in s])
    f_(d, tpu(t1), tpu(t2), torch.tensor([0.5, 2.0, -1.0]))
    assert_same(d, c)
    h = [_lists(torch.float16, seed=i) for i in range(3)]
    check(f, h[0], h[1], [x.abs() + 1 for x in h[2]], 0.3)


def test_foreach_lerp(own_ops_native):
    s, e = _lists(seed=1), _lists(seed=2)
    w = [torch.rand(t.shape, dtype=t.dtype) for t in s]
    check(torch._foreach_lerp, s, e, w)
    check(torch._foreach_lerp, s, e, 0.3)
    check(torch._foreach_lerp, s, e, 0.8)
    check(torch._foreach_lerp, s, e, [0.1, 0.6, 1.5])
    check(inplace(torch._foreach_lerp_), [t.clone() for t in s], e, 0.1)
    check(inplace(torch._foreach_lerp_), [t.clone() for t in s], e, w)


def test_foreach_pow(own_ops_native):
    a, e = _lists(positive=True, seed=1), _lists(seed=2)
    check(torch._foreach_pow, a, e)
    check(torch._foreach_pow, a, 2)
    check(torch._foreach_pow, a, 0.5)
    check(torch._foreach_pow, a, [2, 0.5, -1.0])
    check(torch._foreach_pow, 2.0, e)
    check(inplace(torch._foreach_pow_), [t.clone() for t in a], 3)
    ints = [torch.tensor([1, 2, 3]), torch.tensor([[-2, 0]])]
    check(torch._foreach_pow, ints, 3)
    ints = [torch.tensor([1, 2, 3]), torch.tensor([[4, 0]])]
    check(torch._foreach_pow, ints, 2)
    check(torch._foreach_pow, ints, 0.5)


UNARY = [
    "abs", "neg", "sign", "ceil", "floor", "round", "trunc", "frac", "sqrt", "rsqrt", "reciprocal",
    "exp", "expm1", "log", "log10", "log1p", "log2", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "sigmoid", "erf", "erfc", "lgamma",
]


@pytest.mark.parametrize("op", UNARY)
def test_foreach_unary(own_ops_native, op):
    f = getattr(torch, f"_foreach_{op}")
    f_ = getattr(torch, f"_foreach_{op}_")
    positive = op in ("sqrt", "rsqrt", "log", "log10", "log2", "lgamma")
    a = _lists(positive=positive, seed=5)
    if op in ("asin", "acos"):
        a = [t.clamp(-0.9, 0.9) for t in a]
    if op == "log1p":
        a = [t.abs() for t in a]
    check(f, a)
    check(inplace(f_), [t.clone() for t in a])


def test_foreach_unary_dtypes(own_ops_native):
    ints = [torch.tensor([1, -4, 9]), torch.tensor([[2]])]
    check(torch._foreach_abs, ints)
    check(torch._foreach_neg, ints)
    check(torch._foreach_sign, ints)
    check(torch._foreach_floor, ints)
    check(torch._foreach_exp, ints)  # int -> float32
    check(torch._foreach_sqrt, _lists(torch.float16, positive=True))
    check(torch._foreach_exp, _lists(torch.bfloat16))
    check(torch._foreach_round, [torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5])])


@pytest.mark.parametrize("ord", [2, 1, 0, 3, math.inf, -math.inf])
def test_foreach_norm(own_ops_native, ord):
    a = _lists(seed=6)
    check(lambda x: torch._foreach_norm(x, ord), a)


def test_foreach_norm_dtypes_and_max(own_ops_native):
    check(torch._foreach_norm, _lists(torch.float16, seed=7))
    check(lambda x: torch._foreach_norm(x, 2, dtype=torch.float64), _lists(seed=7))
    check(torch._foreach_norm, [torch.randn(0), torch.randn(3)])
    check(torch._foreach_max, _lists(seed=8))
    check(torch._foreach_max, [torch.tensor([3, -1, 7]), torch.tensor([[2]])])
    check(lambda x: torch.ops.aten._foreach_powsum(x, 2), _lists(seed=9))


def test_foreach_zero_copy_clone(own_ops_native):
    a = _lists(seed=10)
    check(inplace(torch._foreach_zero_), [t.clone() for t in a])
    dst = [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64), torch.zeros(2, 2, dtype=torch.float16)]
    src = [torch.randn(2, 3), torch.tensor([1.7, -2.2, 3.9, 0.1]), torch.randn(2)]  # cast + broadcast
    check(inplace(torch._foreach_copy_), [t.clone() for t in dst], src)
    check(torch._foreach_clone if hasattr(torch, "_foreach_clone") else
          torch.ops.aten._foreach_clone, a)
    check(torch.ops.aten._foreach_mm, [torch.randn(2, 3), torch.randn(1, 4)], [torch.randn(3, 2), torch.randn(4, 5)])


# --------------------------------------------------------------- optimizers


def _train(opt_cls, steps=3, clip=None, tpu_kw=None, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    dmodel = copy.deepcopy(model).to("tpu")
    opt, dopt = opt_cls(model.parameters(), **kw), opt_cls(dmodel.parameters(), **kw, **(tpu_kw or {}))
    x = torch.randn(5, 4)
    for _ in range(steps):
        for m, o, xx in ((model, opt, x), (dmodel, dopt, x.to("tpu"))):
            o.zero_grad()
            m(xx).pow(2).sum().backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            o.step()
    assert_same([p.detach() for p in dmodel.parameters()], [p.detach() for p in model.parameters()],
                atol=1e-5, rtol=1e-5)
    return dopt


@pytest.mark.parametrize(
    "opt_cls,kw",
    [
        (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
        (torch.optim.SGD, dict(lr=0.1, momentum=0.5, dampening=0.1, maximize=True)),
        (torch.optim.Adam, dict(lr=0.01, weight_decay=0.01)),
        (torch.optim.AdamW, dict(lr=0.01, amsgrad=True)),
    ],
    ids=["sgd_nesterov_wd", "sgd_dampening_max", "adam", "adamw_amsgrad"],
)
def test_optimizers_foreach(opt_cls, kw):
    torchtpu.reset_metrics()
    _train(opt_cls, foreach=True, **kw)
    fell = {k: v for k, v in torchtpu.metrics()["fallback_ops"].items() if k.startswith("_foreach")}
    assert fell == {}


def test_optimizer_default_uses_foreach_and_clip_grad_norm():
    torchtpu.reset_metrics()
    _train(torch.optim.SGD, clip=0.05, lr=0.1)
    fell = {k: v for k, v in torchtpu.metrics()["fallback_ops"].items() if k.startswith("_foreach")}
    assert fell == {}


def test_adam_capturable():
    torchtpu.reset_metrics()
    dopt = _train(torch.optim.Adam, lr=0.01, foreach=True, tpu_kw=dict(capturable=True))
    assert all(s["step"].device.type == "tpu" for s in dopt.state.values())
    fell = {k: v for k, v in torchtpu.metrics()["fallback_ops"].items() if k.startswith("_foreach")}
    assert fell == {}


# --------------------------------------------------------------- fused optimizers


@pytest.mark.parametrize(
    "opt_cls,kw",
    [
        (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
        (torch.optim.AdamW, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
        (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ],
    ids=["adam", "adamw_amsgrad", "sgd_nesterov"],
)
def test_optimizers_fused(opt_cls, kw):
    torchtpu.reset_metrics()
    _train(opt_cls, fused=True, **kw)
    fell = {k: v for k, v in torchtpu.metrics()["fallback_ops"].items() if k.startswith("_fused")}
    assert fell == {}


@pytest.mark.parametrize("inf", [0.0, 1.0])
def test_fused_adam_grad_scale_found_inf(own_ops_native, inf):
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 2), (4,)]
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen) for s in shapes]
    m1 = [torch.randn(s, generator=gen).abs() for s in shapes]
    m2 = [torch.randn(s, generator=gen).abs() for s in shapes]
    steps = [torch.tensor(3.0), torch.tensor(3.0)]

    def run(dev):
        ts = [[t.clone().to(dev) for t in lst] for lst in (params, grads, m1, m2, steps)]
        torch._fused_adamw_(ts[0], ts[1], ts[2], ts[3], [], ts[4], lr=0.01, beta1=0.9, beta2=0.99,
                            weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False,
                            grad_scale=torch.tensor(4.0, device=dev),
                            found_inf=torch.tensor(inf, device=dev))
        return ts[:4]

    assert_same(run("tpu"), run("cpu"))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16])
def test_native_dropout_backward_dtypes(own_ops_native, dtype):
    # integer/bool grads give a float32 result on CPU (mask.type_as(grad) * scale is float)
    g = torch.randint(0, 5, (3, 4)).to(dtype)
    m = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) > 0.5
    e = torch.ops.aten.native_dropout_backward(g, m, 2.5)
    a = torch.ops.aten.native_dropout_backward(g.to("tpu"), m.to("tpu"), 2.5)
    assert a.dtype == e.dtype
    assert_same(a, e)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_normal_negative_std_tensor_raises_at_the_call(mode):
    # PyTorch's test_normal_std_error: CPU (and CUDA) check a std tensor's elements at the call;
    # tpu returned samples
    with torchtpu.eager_mode(mode):
        for dev in ("cpu", "tpu"):
            mean = torch.tensor(0.0, device=dev)
            std = torch.tensor(-1.0, device=dev)
            for call in (lambda: torch.normal(0, std), lambda: torch.normal(mean, std)):
                with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
                    call()
        assert torch.normal(torch.zeros(3, device="tpu"), torch.ones(3, device="tpu")).shape == (3,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(lr=0.1), dict(lr=0.05, lr_decay=0.1, weight_decay=0.2),
                                dict(lr="tensor", maximize=True, eps=1e-3, initial_accumulator_value=0.3)],
                         ids=["plain", "decay", "tensor_lr_maximize"])
def test_fused_adagrad(dtype, kw):
    # Adagrad(fused=True) is one tpu program (it ran on the CPU, copying every list in and out)
    res = {}
    torchtpu.reset_metrics()
    for dev in ("cpu", "tpu"):
        g = torch.Generator().manual_seed(0)
        ps = [torch.randn(37, 5, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype)]
        ps = [p.to(dev).requires_grad_() for p in ps]
        k = dict(kw, lr=torch.tensor(0.07)) if kw["lr"] == "tensor" else kw
        opt = torch.optim.Adagrad(ps, fused=True, **k)
        for _ in range(4):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g).to(dtype).to(dev)
            opt.step()
        res[dev] = [p.detach() for p in ps] + [opt.state[p]["sum"] for p in ps]
    # bfloat16: CPU's vectorized body rounds lr, eps and the weight decay to bfloat16 and its
    # scalar tail does not; ours rounds everywhere, an ulp apart on the tail's elements
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else {}
    assert_same(res["tpu"], res["cpu"], **tol)
    assert not [k for k in torchtpu.metrics()["fallback_ops"] if k.startswith("_fused")]


@pytest.mark.parametrize("inf", [0.0, 1.0])
def test_fused_adagrad_grad_scale_found_inf(own_ops_native, inf):
    gen = torch.Generator().manual_seed(0)
    lists = [[torch.randn(6, 3, generator=gen)], [torch.randn(6, 3, generator=gen)],
             [torch.rand(6, 3, generator=gen)], [torch.tensor(2.0)]]

    def run(dev):
        ts = [[t.clone().to(dev) for t in lst] for lst in lists]
        torch._fused_adagrad_(ts[0], ts[1], ts[2], ts[3], lr=0.1, lr_decay=0.01, weight_decay=0.1, eps=1e-10,
                              maximize=False, grad_scale=torch.tensor(4.0, device=dev),
                              found_inf=torch.tensor(inf, device=dev))
        return ts[:3]

    assert_same(run("tpu"), run("cpu"))
