"""Reductions, scans, sorting, softmax and losses on the tpu device, against CPU PyTorch."""
import math
import warnings
from functools import partial

import pytest
import torch
import torch.nn.functional as F

import conftest
import torchtpu
from torchtpu.validate.samples import sample_inputs
from conftest import assert_same

pytestmark = conftest.IN_EVERY_MODE  # strict here; defer_and_fuse and compile in the slow tier

warnings.filterwarnings("ignore", category=UserWarning)

# Base names of the ATen ops this family lowers: none of them may fall back to the CPU.
MINE = {
    "sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std",
    "var_mean", "std_mean", "linalg_vector_norm", "norm", "logsumexp", "all", "any",
    "count_nonzero", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "_logcumsumexp",
    "sort", "topk", "kthvalue", "median", "nanmedian", "mode", "nansum", "aminmax",
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
    "mse_loss", "mse_loss_backward", "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss",
    "huber_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
    "binary_cross_entropy_with_logits", "soft_margin_loss", "soft_margin_loss_backward",
}


def _mine_fell_back():
    ops = torchtpu.metrics()["fallback_ops"]
    return {k: v for k, v in ops.items() if k.split(".")[0].rstrip("_") in MINE or k.split(".")[0] in MINE}


@pytest.fixture
def own_ops_native():
    """Ops of this family must not fall back (ops of other families may, while they are written)."""
    torchtpu.reset_metrics()
    yield
    assert _mine_fell_back() == {}


check = partial(conftest.check, equal_nan=True)


# drawn from their own generator: the global RNG's state at import depends on which test
# modules an xdist worker collected first (a new module drawing at import changed X)
_g = torch.Generator().manual_seed(0)
X = torch.randn(4, 6, dtype=torch.float32, generator=_g)
I = torch.randint(-5, 6, (4, 6), generator=_g)
B = torch.rand(4, 6, generator=_g) > 0.5
E = torch.empty(0, 3)
Z = torch.tensor(-1.5)


def _id(t):
    return str(t.dtype).removeprefix("torch.") + "x".join(map(str, t.shape))


# --- sum / mean / prod ------------------------------------------------------------


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("x", [X, I, B, X.half(), X.bfloat16(), Z, E], ids=_id)
def test_sum(x):
    check(torch.sum, x)
    check(lambda t: t.sum(-1), x)
    check(lambda t: torch.ops.aten.sum.dim_IntList(t, [], True), x)
    check(lambda t: torch.sum(t, 0, dtype=torch.float64), x)
    check(torch.nansum, x)


@pytest.mark.usefixtures("no_fallback")
def test_sum_noncontig_out_inplace_variants():
    check(lambda t: t.t().sum(0), X)
    check(lambda t: t[::2].sum((0, 1), keepdim=True), X)
    check(lambda t: torch.nansum(t, 1), torch.tensor([[1.0, math.nan], [math.nan, math.nan]]))
    out_c = torch.empty(6)
    torch.sum(X, 0, out=out_c)
    out_t = torch.empty(6, device="tpu")
    torch.sum(X.to("tpu"), 0, out=out_t)
    assert_same(out_t, out_c)


@pytest.mark.usefixtures("no_fallback")
def test_mean_prod():
    for x in (X, X.half(), Z):
        check(torch.mean, x)
        check(lambda t: t.mean(-1, keepdim=True), x)
    check(lambda t: t.mean((0, 1)), X.t())
    check(lambda t: t.mean(dtype=torch.float64), I)
    check(lambda t: torch.mean(t, 1), torch.empty(2, 0))
    with pytest.raises(RuntimeError):
        I.to("tpu").mean()
    for x in (X, I, B, Z, E):
        check(torch.prod, x)
        check(lambda t: t.prod(-1, keepdim=True), x)
    check(lambda t: t.prod(0, dtype=torch.float64), I)


# --- max / min / arg* ----------------------------------------------------------------


NAN = torch.tensor([[1.0, math.nan, 3.0, math.nan], [2.0, 2.0, -1.0, 0.5], [-math.inf, 1.0, math.inf, 2.0]])


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("x", [NAN, I, B, X.half(), Z], ids=_id)
def test_max_min_family(x):
    check(torch.amax, x)
    check(torch.min, x)
    check(lambda t: torch.max(t, -1), x)
    check(lambda t: torch.amin(t, 0, keepdim=True), x)
    if x.dtype != torch.bool:
        check(torch.argmax, x)
        check(lambda t: torch.argmin(t, 0, keepdim=True), x)
        check(lambda t: torch.aminmax(t, dim=-1), x)


@pytest.mark.usefixtures("no_fallback")
def test_max_min_more():
    ties = torch.tensor([[3, 1, 3], [2, 2, 1]])
    check(lambda t: torch.max(t, 1, keepdim=True), ties)
    check(lambda t: torch.min(t, 0), ties)
    check(lambda t: torch.argmax(t, 1), ties)
    check(lambda t: torch.argmin(t, keepdim=True), ties)
    check(torch.max, NAN)
    check(lambda t: torch.amax(t, (0, 1), keepdim=True), X.t())
    check(lambda t: torch.min(t, 0), NAN)
    check(lambda t: torch.argmin(t, 1), NAN)
    check(torch.aminmax, NAN)
    check(lambda t: torch.aminmax(t, keepdim=True), X)
    check(lambda t: t.amax(1), E)
    check(lambda t: t.max(1), E)
    for f in (lambda t: t.max(), lambda t: t.amax(0), lambda t: t.argmax(), lambda t: t.max(0)):
        with pytest.raises((RuntimeError, IndexError)):
            f(E.to("tpu"))
    vc, ic = torch.empty(6), torch.empty(6, dtype=torch.long)
    vt, it = torch.empty(6, device="tpu"), torch.empty(6, dtype=torch.long, device="tpu")
    torch.max(X, 0, out=(vc, ic))
    torch.max(X.to("tpu"), 0, out=(vt, it))
    assert_same((vt, it), (vc, ic))


# --- var / std / norms / logsumexp -------------------------------------------------------


@pytest.mark.usefixtures("no_fallback")
def test_var_std():
    c = torch.randn(3, 4, dtype=torch.complex64)
    for x in (X, X.half(), c):
        check(torch.var, x)
        check(lambda t: torch.std(t, 0, keepdim=True), x)
        check(lambda t: torch.var_mean(t, -1, correction=0), x)
        check(lambda t: torch.std_mean(t, [0, 1], correction=2), x)
    check(lambda t: torch.var(t, unbiased=False), X.t())
    check(torch.std, Z)
    check(lambda t: torch.var(t, correction=3), torch.tensor([1.0, 2.0]))
    check(lambda t: torch.std(t, 0), torch.empty(0, 2))
    with pytest.raises(RuntimeError):
        torch.var(I.to("tpu"))


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, math.inf, -math.inf])
def test_vector_norm(ord):
    check(lambda t: torch.linalg.vector_norm(t, ord), X)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=1, keepdim=True), X[::2])
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=0), torch.randn(3, 4, dtype=torch.complex64))
    if ord == 2:
        check(lambda t: torch.linalg.vector_norm(t, ord, dtype=torch.float64), X)
        check(lambda t: torch.linalg.vector_norm(t, ord, dim=(0, 1)), X.half())


@pytest.mark.usefixtures("no_fallback")
def test_norm_and_logsumexp():
    check(torch.norm, X)
    check(lambda t: t.norm(p=1, dim=1), X)
    check(lambda t: torch.norm(t, p=3, dim=[0], keepdim=True), X)
    check(lambda t: torch.norm(t, dim=1, dtype=torch.float64), X)
    check(lambda t: torch.ops.aten.norm.ScalarOpt_dtype(t, 2, dtype=torch.float64), X)
    check(lambda t: torch.ops.aten.norm.Scalar(t, 1), X)
    for x in (X, I, X.half(), NAN, torch.full((2, 3), -math.inf)):
        check(lambda t: torch.logsumexp(t, -1), x)
    check(lambda t: torch.logsumexp(t, 0, keepdim=True), Z)
    check(lambda t: torch.logsumexp(t, (0, 1)), X)
    check(lambda t: torch.logsumexp(t, 1), torch.empty(2, 0))


# --- all / any / count_nonzero --------------------------------------------------------------


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("x", [B, X, I.to(torch.uint8), E, torch.tensor(0.0)], ids=_id)
def test_all_any_count(x):
    check(torch.all, x)
    check(lambda t: torch.any(t, -1, keepdim=True), x)
    check(lambda t: torch.all(t, 0), x)
    check(torch.count_nonzero, x)
    check(lambda t: torch.count_nonzero(t, 0), x)
    if x.dim() == 2:
        check(lambda t: torch.any(t, (0, 1)), x)
        check(lambda t: torch.count_nonzero(t, (0, 1)), x)


# --- scans ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("x", [NAN, I, B, X.half(), Z, E], ids=_id)
def test_scans(x):
    check(lambda t: torch.cumsum(t, -1), x)
    check(lambda t: torch.cumprod(t, 0), x)
    if x.dtype != torch.bool:
        check(lambda t: torch.cummax(t, -1), x)
        check(lambda t: torch.cummin(t, 0), x)
    if x.is_floating_point():
        check(lambda t: torch.logcumsumexp(t, -1), x)


@pytest.mark.usefixtures("no_fallback")
def test_scan_ties_dtype_inplace_out():
    t = torch.tensor([1.0, 2.0, 2.0, math.nan, 3.0, math.nan, 0.0])
    check(lambda v: torch.cummax(v, 0), t)
    check(lambda v: torch.cummin(v, 0), t)
    check(lambda v: torch.cummin(v, 0), torch.tensor([3, 1, 1, 2, 0, 0]))
    check(lambda v: torch.cumsum(v, 1, dtype=torch.float64), X.t())
    check(lambda v: torch.logcumsumexp(v, 0), torch.tensor([-math.inf, -math.inf, 1.0, math.inf]))
    check(lambda v: v.cumsum_(1), X.clone())
    oc, ot = torch.empty(4, 6), torch.empty(4, 6, device="tpu")
    torch.cumprod(X, 0, out=oc)
    torch.cumprod(X.to("tpu"), 0, out=ot)
    assert_same(ot, oc)


# --- sorting ------------------------------------------------------------------------------------


S = torch.tensor([[3.0, -1.0, math.nan, 2.0, -0.0, 0.0, 2.0, -math.inf, 3.0],
                  [1.0, 1.0, 1.0, -2.0, math.nan, math.inf, 0.0, 5.0, -2.0]])


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("x", [S, I, B, X.half(), torch.tensor([[5, 0, 255, 7, 0]], dtype=torch.uint8),
                               Z, torch.empty(2, 0)], ids=_id)
def test_sort(x):
    check(lambda t: torch.sort(t, stable=True), x)
    check(lambda t: torch.sort(t, dim=0, descending=True, stable=True), x)
    check(lambda t: torch.argsort(t, dim=-1, descending=True, stable=True), x)


@pytest.mark.usefixtures("no_fallback")
def test_sort_noncontig_nan_sign():
    check(lambda t: torch.sort(t, dim=0, stable=True), X.t())
    neg_nan = torch.tensor([1.0, -math.nan, 2.0, math.nan, -1.0])
    check(lambda t: torch.sort(t, stable=True), neg_nan)
    check(lambda t: torch.sort(t, descending=True, stable=True), neg_nan)


@pytest.mark.usefixtures("no_fallback")
def test_topk_kthvalue():
    u = torch.randperm(24).reshape(4, 6).float()
    for k in (1, 6):
        check(lambda t: torch.topk(t, k), u)
        check(lambda t: torch.kthvalue(t, k), u)
    check(lambda t: torch.topk(t, 3, largest=False), u)
    check(lambda t: torch.kthvalue(t, 2, 0, keepdim=True), u)
    check(lambda t: torch.topk(t, 2, dim=0), u)
    check(lambda t: torch.topk(t, 2), torch.tensor([1.0, math.nan, 3.0, 2.0]))
    check(lambda t: torch.topk(t, 0), u)
    check(lambda t: torch.kthvalue(t, 3, 0), torch.randperm(5))
    with pytest.raises(RuntimeError):
        torch.topk(u.to("tpu"), 7)
    # out= (resized); fresh CPU outs: a CPU tensor copied to tpu loses its resizability (core bug)
    vc, ic = torch.empty(0), torch.empty(0, dtype=torch.long)
    vt, it = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    torch.topk(u, 2, out=(vc, ic))
    torch.topk(u.to("tpu"), 2, out=(vt, it))
    assert_same((vt, it), (vc, ic))


@pytest.mark.usefixtures("no_fallback")
def test_median_mode():
    u = torch.randperm(35).reshape(5, 7).float()
    nanx = torch.tensor([[1.0, math.nan, 2.0, 0.5], [4.0, 3.0, 2.0, 1.0], [math.nan, math.nan, math.nan, math.nan]])
    check(torch.median, nanx)
    check(torch.nanmedian, nanx)
    check(lambda t: torch.median(t, -1), nanx)
    check(lambda t: torch.nanmedian(t[:2], 0, keepdim=True), nanx)
    check(lambda t: torch.nanmedian(t[:2], -1), nanx)
    check(lambda t: torch.nanmedian(t, -1).values, nanx)  # all-NaN row: the index is arbitrary on CPU
    check(torch.median, u.long())
    check(lambda t: torch.median(t, 0, keepdim=True), u.t())
    check(lambda t: torch.median(t, -1), Z)
    check(torch.median, torch.empty(0))
    m = torch.tensor([[3.0, 1.0, 3.0, 1.0, 2.0, 1.0, 3.0], [5.0, 5.0, 2.0, 2.0, 0.0, 9.0, 9.0]])
    check(lambda t: torch.mode(t), m)
    check(lambda t: torch.mode(t.long(), 0), m)
    check(lambda t: torch.mode(t, 1, keepdim=True), m)
    check(lambda t: torch.mode(t), Z)


# --- softmax ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax(fn):
    inf = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, 2.0]])
    for x in (X, X.half(), X.bfloat16(), Z, E, inf):
        check(lambda t: fn(t, -1), x)
    check(lambda t: fn(t, 0), X.t())
    check(lambda t: fn(t, 1, dtype=torch.float64), X)
    op = torch.ops.aten._softmax if fn is torch.softmax else torch.ops.aten._log_softmax
    # half_to_float is a CUDA-only feature on CPU PyTorch: compare with the float32 result
    got = op(X.half().to("tpu"), 1, True)
    assert got.dtype == torch.float32
    assert_same(got, op(X.half().float(), 1, False))
    w = torch.arange(6.0)
    check(lambda t, w: fn(t, 1) * w, X, w, grad=(0,))
    check(lambda t: fn(t, 0), torch.randn(3, 2, 4).double(), grad=True)
    check(lambda t: fn(t, 0), Z, grad=True)


@pytest.mark.usefixtures("no_fallback")
def test_softmax_backward_data():
    g = torch.randn(3, 5)
    y = torch.softmax(torch.randn(3, 5), 1)
    for op in (torch.ops.aten._softmax_backward_data, torch.ops.aten._log_softmax_backward_data):
        check(lambda a, b: op(a, b, 1, torch.float32), g, y)
        check(lambda a, b: op(a, b, 0, torch.float16), g.half(), y.half())
        # half input_dtype with float32 grads (the half_to_float backward): a float16 result
        got = op(g.to("tpu"), y.to("tpu"), 1, torch.float16)
        assert got.dtype == torch.float16
        assert_same(got, op(g, y, 1, torch.float32).half())


# --- backward of reductions -------------------------------------------------------------


@pytest.mark.usefixtures("own_ops_native")
@pytest.mark.parametrize("fn", [
    lambda t: t.sum(1), lambda t: t.mean(), lambda t: t.prod(1), lambda t: t.amax(1),
    lambda t: t.max(0)[0], lambda t: t.std(1), lambda t: torch.var_mean(t, 0)[0], lambda t: t.norm(dim=1),
    lambda t: t.logsumexp(1), lambda t: t.cumsum(1), lambda t: t.cummax(0)[0], lambda t: t.sort(1)[0],
    lambda t: t.topk(2)[0], lambda t: t.median(1)[0], lambda t: t.logcumsumexp(0),
    lambda t: torch.linalg.vector_norm(t, 3),
], ids=["sum", "mean", "prod", "amax", "max", "std", "var_mean", "norm", "logsumexp", "cumsum",
        "cummax", "sort", "topk", "median", "logcumsumexp", "vector_norm3"])
def test_reduction_backward(fn):
    check(fn, torch.randn(4, 5), grad=True)


# --- losses -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("own_ops_native")
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss(reduction):
    logp = torch.randn(5, 4).log_softmax(1)
    tgt = torch.tensor([0, 3, 1, 1, 2])
    w = torch.rand(4)
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), logp, tgt)
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction, ignore_index=2), logp[0], tgt[4])
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), logp[0], tgt[1])
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), logp[:0], tgt[:0])
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), logp.double().t().contiguous().t(), tgt)
    check(lambda a, b, c: F.nll_loss(a, b, weight=c, reduction=reduction, ignore_index=3),
          logp, tgt, w, grad=(0,))
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), logp[2], tgt[2], grad=(0,))
    r = {"none": 0, "mean": 1, "sum": 2}[reduction]
    for args in ((logp, tgt), (logp[0], tgt[1]), (logp[0], tgt[2])):  # output and total_weight
        check(lambda a, b, c: torch.ops.aten.nll_loss_forward(a, b, c, r, 2), *args, w)
    img = torch.randn(2, 4, 3, 3).log_softmax(1)
    timg = torch.randint(0, 4, (2, 3, 3))
    check(lambda a, b, c: F.nll_loss(a, b, weight=c, reduction=reduction, ignore_index=0), img,
          timg, w, grad=(0,))
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), torch.randn(2, 4, 5),
          torch.randint(0, 4, (2, 5)), grad=(0,))


@pytest.mark.usefixtures("own_ops_native")
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.2}, {"reduction": "none", "ignore_index": 1},
                                {"weight": True, "label_smoothing": 0.1, "reduction": "sum"}],
                         ids=["default", "smooth", "none-ignore", "weight-smooth-sum"])
def test_cross_entropy(kw):
    x = torch.randn(6, 5)
    t = torch.tensor([0, 1, 4, 2, 1, 3])
    kw = dict(kw)
    ow = (torch.rand(5),) if kw.pop("weight", False) else ()
    f = (lambda a, b, w: F.cross_entropy(a, b, weight=w, **kw)) if ow else (lambda a, b: F.cross_entropy(a, b, **kw))
    check(f, x, t, *ow, grad=(0,))
    if "ignore_index" not in kw:  # class-probability targets
        check(f, x, torch.softmax(torch.randn(6, 5), 1), *ow, grad=(0,))
    check(f, torch.randn(2, 5, 3, 2), torch.randint(0, 5, (2, 3, 2)), *ow, grad=(0,))


@pytest.mark.usefixtures("own_ops_native")
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_gradient_of_targets_all_ignored(reduction):
    # the mean divides by a total weight of 0 (a NaN loss on CPU too), but CPU's backward never
    # writes an ignored row: its gradient is 0, not NaN (nn.CrossEntropyLoss's ModuleInfo input)
    x = torch.randn(2, 3, dtype=torch.float64)
    check(lambda a, b: F.cross_entropy(a, b, ignore_index=1, reduction=reduction), x, torch.tensor([1, 1]),
          grad=(0,), equal_nan=True)
    check(lambda a, b: F.nll_loss(a, b, ignore_index=0, reduction=reduction), torch.randn(2, 4, 3, 3),
          torch.zeros(2, 3, 3, dtype=torch.int64), grad=(0,), equal_nan=True)


@pytest.mark.usefixtures("no_fallback")
def test_cross_entropy_no_fallback_at_all():
    """Plain cross_entropy needs nothing but this family's ops, forward and backward."""
    check(lambda a, b: F.cross_entropy(a, b), torch.randn(6, 5), torch.tensor([0, 1, 4, 2, 1, 3]), grad=(0,))


@pytest.mark.usefixtures("own_ops_native")
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_pointwise_losses(reduction):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    a[0, 0] = b[0, 0]  # a zero difference
    for fn in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss,
               lambda x, y, reduction: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.0),
               lambda x, y, reduction: F.huber_loss(x, y, reduction=reduction, delta=0.7)):
        check(lambda x, y: fn(x, y, reduction=reduction), a, b, grad=True)
    check(lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5), a.double().t(), b.double().t())
    check(lambda x, y: F.mse_loss(x, y, reduction=reduction), torch.tensor(1.5), torch.tensor(0.5))
    sgn = torch.randint(0, 2, (4, 5)).float() * 2 - 1
    check(lambda x, y: F.soft_margin_loss(x, y, reduction=reduction), a, sgn, grad=(0,))


@pytest.mark.usefixtures("own_ops_native")
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_bce(reduction):
    p = torch.rand(4, 5) * 0.98 + 0.01
    p[0, 0], p[0, 1] = 0.0, 1.0  # log clamps at -100
    t = torch.rand(4, 5)
    w = torch.rand(5)
    check(lambda x, y, z: F.binary_cross_entropy(x, y, weight=z, reduction=reduction), p, t, w)
    check(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), p.double(), t.double())
    check(lambda x, y, z: F.binary_cross_entropy(x, y, weight=z, reduction=reduction), p[1:], t[1:], w, grad=(0,))
    logits = torch.randn(4, 5) * 5
    pw = torch.rand(5) * 3
    check(lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), logits, t)
    # float16: PyTorch CPU rounds every intermediate to half, we compute in float32
    check(lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), logits.half(), t.half(),
          atol=1e-2, rtol=1e-2)
    check(lambda x, y, z, q: F.binary_cross_entropy_with_logits(x, y, weight=z, pos_weight=q, reduction=reduction),
          logits, t, w, pw, grad=(0,))


@pytest.mark.usefixtures("own_ops_native")
def test_kl_div():
    a = torch.randn(3, 4).log_softmax(1)
    b = torch.softmax(torch.randn(3, 4), 1)
    check(lambda x, y: F.kl_div(x, y, reduction="batchmean"), a, b, grad=(0,))
    check(lambda x, y: F.kl_div(x, y, reduction="none", log_target=True), a, b.log(), grad=(0,))


# --- OpInfo samples ---------------------------------------------------------------------------

_OPINFO = ["amax", "var", "logsumexp", "cumsum", "sort", "log_softmax", "max.reduction_with_dim"]


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("name", _OPINFO)
def test_opinfo_samples(name):
    from torch.testing._internal.common_methods_invocations import op_db

    base, _, variant = name.partition(".")
    op = next(o for o in op_db if o.name == base and o.variant_test_name == variant)
    for i, s in enumerate(sample_inputs(op, "cpu", torch.float32, 5)):
        if i >= 5:
            break
        if name == "sort":  # ties make unstable-sort indices implementation-defined
            n = s.input.numel()
            s.input = torch.randperm(max(n, 1))[:n].reshape(s.input.shape).float()
        try:
            check(op.op, s.input, *s.args, **s.kwargs)
        except AssertionError as e:
            raise AssertionError(f"{name} {s}: {e}") from e


@pytest.mark.parametrize("dim", [0, -1])
def test_topk_kthvalue_ties_match_cpu(no_fallback, dim):
    # CPU's selection algorithms are not stable: with ties, the returned indices follow
    # their swaps (nth_element / quickselect), which the lowerings emulate.
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randint(-4, 4, (5, 10, 5), generator=g)
        for largest in (True, False):
            for srt in (True, False):
                a = torch.topk(x.to("tpu"), 3, dim, largest=largest, sorted=srt)
                e = torch.topk(x, 3, dim, largest=largest, sorted=srt)
                assert torch.equal(a[0].cpu(), e[0]) and torch.equal(a[1].cpu(), e[1])
        for k in (1, 2, 5):
            a = torch.kthvalue(x.to("tpu"), k, dim, keepdim=True)
            e = torch.kthvalue(x, k, dim, keepdim=True)
            assert torch.equal(a[0].cpu(), e[0]) and torch.equal(a[1].cpu(), e[1])
    xf = torch.tensor([[1.0, float("nan"), 2.0, 1.0, float("nan"), 2.0, 0.0]])
    for k in range(1, 8):
        a, e = torch.kthvalue(xf.to("tpu"), k), torch.kthvalue(xf, k)
        assert_same(a[0], e[0], equal_nan=True)
        assert torch.equal(a[1].cpu(), e[1])
    a, e = torch.topk(xf.to("tpu"), 4), torch.topk(xf, 4)
    assert_same(a[0], e[0], equal_nan=True)
    assert torch.equal(a[1].cpu(), e[1])


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_nll_loss_rejects_a_weight_not_one_per_class(mode):
    # CPU raises; the lowering read past (or broadcast) a weight of the wrong length and
    # returned a number
    logp = torch.randn(2, 3).log_softmax(1)
    tgt = torch.tensor([0, 1])
    for w in (torch.ones(2), torch.ones(4), torch.ones(1, 3)):
        for f in (lambda a, b, c: F.nll_loss(a, b, weight=c), lambda a, b, c: F.cross_entropy(a, b, weight=c)):
            with pytest.raises(RuntimeError) as want:
                f(logp, tgt, w)
            with torchtpu.eager_mode(mode), pytest.raises(RuntimeError) as got:
                f(logp.to("tpu"), tgt.to("tpu"), w.to("tpu"))
            assert str(got.value).startswith(str(want.value).splitlines()[0]), (got.value, want.value)
    with torchtpu.eager_mode(mode):  # one per class still runs
        got = F.nll_loss(logp.to("tpu"), tgt.to("tpu"), weight=torch.ones(3, device="tpu"))
    assert torch.allclose(got.cpu(), F.nll_loss(logp, tgt, weight=torch.ones(3)))
