"""Convolution, pooling, normalization and upsampling: forward and backward against CPU PyTorch."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from functools import partial

import conftest
import torchtpu
from conftest import assert_same

pytestmark = conftest.IN_EVERY_MODE  # strict here; defer_and_fuse and compile in the slow tier

F32 = dict(atol=1e-4, rtol=1e-4)
LOW = dict(atol=2e-2, rtol=2e-2)


# this family's tolerances: float32 results to 1e-4, bfloat16/float16 ones (**LOW) to 2e-2
check = partial(conftest.check, **F32)


def rnd(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# --- convolution ----------------------------------------------------------------------

CONV_CASES = [
    # (input shape, weight shape, kwargs)
    ((2, 3, 9), (4, 3, 3), dict(stride=2, padding=1)),
    ((2, 4, 9), (4, 2, 2), dict(dilation=2, groups=2)),
    ((2, 3, 7, 6), (5, 3, 3, 3), dict(padding=1)),
    ((1, 4, 8, 8), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)),
    ((2, 3, 5, 5), (4, 3, 3, 3), dict(padding="same")),
    ((3, 5, 5), (4, 3, 3, 3), dict()),  # unbatched
    ((1, 2, 4, 5, 5), (3, 2, 2, 3, 3), dict(stride=(1, 2, 2), padding=1)),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv(no_fallback, xs, ws, kw, bias):
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(ws)]
    b = rnd(ws[0]) if bias else None
    check(lambda x, w, b: conv(x, w, b, **kw), rnd(*xs), rnd(*ws), b, grad=True)


CONVT_CASES = [
    ((2, 3, 6), (3, 4, 3), dict(stride=2, padding=1, output_padding=1)),
    ((2, 4, 5, 5), (4, 3, 3, 3), dict(stride=2, output_padding=1, groups=2)),
    ((1, 2, 4, 5), (2, 3, 3, 2), dict(stride=(1, 2), padding=(2, 1), dilation=(2, 1))),
    ((1, 2, 3, 4, 4), (2, 2, 2, 2, 2), dict(stride=2)),
]


@pytest.mark.parametrize("xs,ws,kw", CONVT_CASES)
def test_conv_transpose(no_fallback, xs, ws, kw):
    conv = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[len(ws)]
    check(lambda x, w, b: conv(x, w, b, **kw), rnd(*xs), rnd(*ws), rnd(ws[1] * kw.get("groups", 1)), grad=True)


def test_conv_noncontiguous_and_low_precision(no_fallback):
    x = rnd(2, 6, 6, 3).permute(0, 3, 1, 2)  # channels-last view
    check(lambda x, w: F.conv2d(x, w, padding=1), x, rnd(4, 3, 3, 3), grad=True)
    for dt in (torch.bfloat16, torch.float16):
        check(lambda x, w, b: F.conv2d(x, w, b), rnd(1, 2, 5, 5, dtype=dt), rnd(3, 2, 3, 3, dtype=dt),
              rnd(3, dtype=dt), grad=dt == torch.bfloat16, atol=5e-2, rtol=5e-2)


def test_conv_aten_direct(no_fallback):
    x, w = rnd(2, 3, 5, 5), rnd(4, 3, 3, 3)
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    check(lambda x, w: torch.ops.aten.convolution(x, w, None, *args), x, w)
    out = torch.empty(0, device="tpu")
    torch.ops.aten.convolution.out(x.to("tpu"), w.to("tpu"), None, *args, out=out)
    assert_same(out, torch.ops.aten.convolution(x, w, None, *args), **F32)
    # output_mask: unrequested gradients are None, like PyTorch
    g = rnd(2, 4, 3, 3)
    for mask in ([True, False, False], [False, True, True]):
        c = torch.ops.aten.convolution_backward(g, x, w, [4], *args, mask)
        t = torch.ops.aten.convolution_backward(g.to("tpu"), x.to("tpu"), w.to("tpu"), [4], *args, mask)
        assert_same(t, c, **F32)  # None where CPU gives None


def test_conv_empty_batch(no_fallback):
    check(lambda x, w: F.conv2d(x, w), rnd(0, 3, 5, 5), rnd(4, 3, 3, 3))


# --- pooling --------------------------------------------------------------------------

MAXPOOL_CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 7, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 2, 9, 9), dict(kernel_size=(3, 2), stride=(2, 1), dilation=(2, 1), padding=(1, 0))),
    ((3, 6, 5), dict(kernel_size=2, ceil_mode=True)),  # unbatched
]


@pytest.mark.parametrize("xs,kw", MAXPOOL_CASES)
def test_max_pool2d(no_fallback, xs, kw):
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), rnd(*xs), grad=True)


def test_max_pool_1d_3d_and_dtypes(no_fallback):
    check(lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True), rnd(2, 3, 10), grad=True)
    check(lambda x: F.max_pool3d(x, 2, 2, 1, ceil_mode=True, return_indices=True), rnd(1, 2, 5, 4, 5), grad=True)
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.randint(-50, 50, (2, 5, 6)))
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), rnd(1, 2, 6, 6, dtype=torch.bfloat16), grad=True, **LOW)
    # ties and -inf: indices point at the first valid maximum
    x = torch.full((1, 1, 4, 4), float("-inf"))
    x[0, 0, 3, 3] = 1.0
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.ones(1, 2, 4, 4), grad=True)
    check(lambda x: F.max_pool2d(x, 2), rnd(8, 8, 2).permute(2, 0, 1)[None], grad=True)  # non-contiguous
    check(lambda x: F.max_pool2d(x, 2), rnd(0, 2, 4, 4))


AVGPOOL_CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 7, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 7, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((1, 2, 6, 7), dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), divisor_override=4)),
    ((3, 5, 5), dict(kernel_size=2, ceil_mode=True, count_include_pad=False)),
    # kernels past the input's end (efficientnet's AvgPool2d(hidden_dim, ceil_mode=True))
    ((2, 3, 8, 8), dict(kernel_size=64, ceil_mode=True)),
    ((1, 2, 3, 3), dict(kernel_size=8, stride=2, padding=4, ceil_mode=True)),
    ((1, 2, 3, 3), dict(kernel_size=8, stride=2, padding=4, ceil_mode=True, count_include_pad=False)),
]


@pytest.mark.parametrize("xs,kw", AVGPOOL_CASES)
def test_avg_pool2d(no_fallback, xs, kw):
    check(lambda x: F.avg_pool2d(x, **kw), rnd(*xs), grad=True)


def test_avg_pool_kernel_past_the_input_pads_no_more_than_the_data():
    # a 2560-wide kernel on an 8x8 map padded every plane to 2560x2560 zeros, which a
    # compiled graph materialized (efficientnet under torch.compile: 11 GB, then OOM)
    import jax
    import jax.numpy as jnp

    from torchtpu.ops.nn import avg_pool2d

    x = jnp.ones((2, 4, 8, 8), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda a: avg_pool2d(a, (2560, 2560), (), 0, True))(x)
    biggest = max(v.aval.size for e in jaxpr.jaxpr.eqns for v in e.outvars)
    assert biggest <= x.size


def test_avg_pool_1d_3d_and_dtypes(no_fallback):
    check(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), rnd(2, 3, 10), grad=True)
    check(lambda x: F.avg_pool3d(x, 2, 2, 1, ceil_mode=True), rnd(1, 2, 5, 4, 5), grad=True)
    check(lambda x: F.avg_pool3d(x, (2, 3, 2), divisor_override=3), rnd(1, 2, 4, 6, 4), grad=True)
    check(lambda x: F.avg_pool2d(x, 2), rnd(1, 2, 6, 6, dtype=torch.bfloat16), grad=True, **LOW)
    check(lambda x: F.avg_pool2d(x, 3, 2, 1), torch.randint(-50, 50, (2, 2, 7, 7)))
    check(lambda x: F.avg_pool2d(x, 2), rnd(8, 8, 2).permute(2, 0, 1)[None], grad=True)


@pytest.mark.parametrize("xs,out", [((2, 3, 7, 9), (3, 4)), ((3, 8, 8), (8, 3)), ((1, 2, 5, 5), (7, 2))])
def test_adaptive_pool2d(no_fallback, xs, out):
    check(lambda x: F.adaptive_avg_pool2d(x, out), rnd(*xs), grad=True)
    check(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), rnd(*xs), grad=True)


def test_adaptive_pool_1d_3d(no_fallback):
    check(lambda x: F.adaptive_avg_pool1d(x, 4), rnd(2, 3, 10), grad=True)
    check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), rnd(2, 3, 10), grad=True)
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), rnd(1, 2, 5, 7, 4), grad=True)
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True), rnd(1, 2, 5, 7, 4), grad=True)
    check(lambda x: F.adaptive_avg_pool2d(x, (2, 3)), rnd(1, 2, 5, 7, dtype=torch.bfloat16), grad=True, **LOW)


def test_pool_out_variants(no_fallback):
    x = rnd(1, 2, 6, 6)
    out, idx = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.long, device="tpu")
    torch.ops.aten.max_pool2d_with_indices.out(x.to("tpu"), [2], [2], [0], [1], False, out=out, indices=idx)
    c = torch.ops.aten.max_pool2d_with_indices(x, [2], [2])
    assert_same(out, c[0])
    assert_same(idx, c[1])
    o = torch.empty(0, device="tpu")
    torch.ops.aten.avg_pool2d.out(x.to("tpu"), [3], [1], [1], out=o)
    assert_same(o, torch.ops.aten.avg_pool2d(x, [3], [1], [1]))


# --- normalization ------------------------------------------------------------------


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 3), (3, 2, 7)])
def test_batch_norm_train(no_fallback, affine, shape):
    c = shape[1]
    w, b = (rnd(c), rnd(c)) if affine else (None, None)
    rm_c, rv_c = rnd(c), torch.rand(c) + 0.5
    rm_t, rv_t = rm_c.to("tpu"), rv_c.to("tpu")
    x = rnd(*shape) * 3 + 1
    cx, tx = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    cw = w.clone().requires_grad_() if affine else None
    tw = w.to("tpu").requires_grad_() if affine else None
    cy = F.batch_norm(cx, rm_c, rv_c, cw, b, training=True, momentum=0.3)
    ty = F.batch_norm(tx, rm_t, rv_t, tw, b.to("tpu") if affine else None, training=True, momentum=0.3)
    assert_same(ty, cy, **F32)
    assert_same(rm_t, rm_c, **F32)  # running stats updated in place
    assert_same(rv_t, rv_c, **F32)
    cot = rnd(*shape)
    ins_c, ins_t = [cx] + ([cw] if affine else []), [tx] + ([tw] if affine else [])
    assert_same(torch.autograd.grad(ty, ins_t, cot.to("tpu")), torch.autograd.grad(cy, ins_c, cot), **F32)


def test_batch_norm_eval_and_no_stats(no_fallback):
    x, w, b, rm, rv = rnd(4, 3, 5), rnd(3), rnd(3), rnd(3), torch.rand(3) + 0.5
    check(lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b, training=False), x, w, b, grad=True)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, grad=True)
    check(lambda x: F.instance_norm(x), rnd(2, 3, 4, 4), grad=True)
    # bfloat16 input with float32 parameters (mixed precision)
    xb = rnd(4, 3, 5, dtype=torch.bfloat16)
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), xb, w, b, grad=True, **LOW)
    check(lambda x: torch.ops.aten.native_batch_norm(x, None, None, rm.to(x.device), rv.to(x.device), False,
                                                     0.1, 1e-5), x)


def test_batch_norm_aten_variants(no_fallback):
    A = torch.ops.aten
    x, w, b, rm, rv = rnd(4, 3, 5), rnd(3), rnd(3), rnd(3), torch.rand(3) + 0.5

    for fn in (lambda x, w, b, m, v: A._native_batch_norm_legit(x, w, b, m, v, True, 0.1, 1e-5),
               lambda x, w, b, m, v: A._native_batch_norm_legit(x, w, b, m, v, False, 0.1, 1e-5),
               lambda x, w, b, m, v: A._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
               lambda x, w, b, m, v: A._native_batch_norm_legit_no_training(x, w, b, m, v, 0.1, 1e-5),
               lambda x, w, b, m, v: A._batch_norm_with_update(x, w, b, m, v, 0.1, 1e-5),
               lambda x, w, b, m, v: A._batch_norm_no_update(x, w, b, m, v, 0.1, 1e-5),
               lambda x, w, b, m, v: A.native_batch_norm(x, w, b, m, v, True, 0.2, 1e-3)):
        # the outputs and the running stats, updated in place
        check(lambda x, w, b, m, v: (fn(x, w, b, m, v), m, v), x, w, b, rm.clone(), rv.clone())
    # backward ops called directly, with a partial output_mask
    g = rnd(4, 3, 5)
    _, sm, si = A.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    for mask in ([True, True, True], [True, False, False], [False, True, False]):
        for update in (True, False):
            c = A.batch_norm_backward(g, x, w, rm, rv, sm, si, update, 1e-5, mask, torch.empty(0, dtype=torch.uint8))
            t = A.batch_norm_backward(*[a.to("tpu") for a in (g, x, w, rm, rv, sm, si)], update, 1e-5, mask,
                                      torch.empty(0, dtype=torch.uint8, device="tpu"))
            assert_same(t, c, **F32)  # None where CPU gives None


def test_batch_norm_momentum_none_no_recompile(no_fallback):
    bn_c, x = nn.BatchNorm1d(3, momentum=None), rnd(8, 3)
    bn_t = nn.BatchNorm1d(3, momentum=None).to("tpu")
    for i in range(3):
        if i == 1:
            torchtpu.reset_metrics()
        xi = x + i
        assert_same(bn_t(xi.to("tpu")), bn_c(xi), **F32)
    assert torchtpu.metrics()["compiles"] <= 1  # only num_batches_tracked's add may compile
    assert_same(bn_t.running_mean, bn_c.running_mean, **F32)
    assert_same(bn_t.running_var, bn_c.running_var, **F32)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(no_fallback, affine):
    shape = (2, 3, 4, 5)
    w, b = (rnd(4, 5), rnd(4, 5)) if affine else (None, None)
    check(lambda x, w, b: F.layer_norm(x, (4, 5), w, b, eps=1e-3), rnd(*shape), w, b, grad=True)
    check(lambda x, w, b: torch.ops.aten.native_layer_norm(x, [5], w, b, 1e-5),
          rnd(*shape), rnd(5) if affine else None, rnd(5) if affine else None, grad=True)
    check(lambda x: F.layer_norm(x, (5,)), rnd(5, 3).t(), grad=True)  # non-contiguous
    check(lambda x: F.layer_norm(x, (6,)), rnd(2, 6, dtype=torch.bfloat16), grad=True, **LOW)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(no_fallback, affine):
    w, b = (rnd(6), rnd(6)) if affine else (None, None)
    check(lambda x, w, b: F.group_norm(x, 3, w, b), rnd(2, 6, 4, 3), w, b, grad=True)
    check(lambda x, w, b: F.group_norm(x, 2, w, b, eps=1e-3), rnd(3, 6), w, b, grad=True)
    check(lambda x: F.group_norm(x, 2), rnd(2, 4, 5, dtype=torch.bfloat16), grad=True, **LOW)


def test_rms_norm(no_fallback):
    A = torch.ops.aten
    x, w = rnd(2, 3, 4), rnd(4)
    check(lambda x, w: A._fused_rms_norm(x, [4], w, 1e-6), x, w, grad=True)
    check(lambda x: A._fused_rms_norm(x, [3, 4], None, None), x, grad=True)
    check(lambda x: A._fused_rms_norm(x, [4], None, None), rnd(2, 4, dtype=torch.bfloat16), **LOW)
    # _fused_rms_norm_backward has no CPU kernel: compare with autograd of the CPU composite
    g = rnd(2, 3, 4)
    cx, cw = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.autograd.grad(F.rms_norm(cx, [4], cw, 1e-6), (cx, cw), g)
    tx, tw = x.to("tpu"), w.to("tpu")
    _, rstd = A._fused_rms_norm(tx, [4], tw, 1e-6)
    for mask in ([True, True], [False, True], [True, False]):
        t = A._fused_rms_norm_backward(g.to("tpu"), tx, [4], rstd, tw, mask)
        assert_same(t, tuple(a if m else None for m, a in zip(mask, ref)), **F32)
    tx.requires_grad_()
    gt = torch.autograd.grad(A._fused_rms_norm(tx, [4], None, 1e-6)[0], tx, g.to("tpu"))[0]
    cx = x.clone().requires_grad_()
    assert_same(gt, torch.autograd.grad(F.rms_norm(cx, [4], None, 1e-6), cx, g)[0], **F32)


def test_rms_norm_bfloat16_backward(no_fallback):
    # eps=None is the epsilon of float, the type ATen computes a bfloat16 norm in, not bfloat16's
    check(lambda x: torch.ops.aten._fused_rms_norm(x, [4], None, None), rnd(64, 4, dtype=torch.bfloat16),
          grad=True, **LOW)


def test_rms_norm_module():
    """nn.RMSNorm decomposes into pointwise ops on this device (no fused kernel is called)."""
    m_c = nn.RMSNorm(4)
    m_t = nn.RMSNorm(4).to("tpu")
    x = rnd(2, 3, 4)
    assert_same(m_t(x.to("tpu")), m_c(x), **F32)


# --- upsampling ------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    dict(scale_factor=2, mode="nearest"),
    dict(size=(5, 7), mode="nearest"),
    dict(scale_factor=1.7, mode="nearest-exact"),
    dict(scale_factor=2, mode="bilinear"),
    dict(size=(3, 7), mode="bilinear", align_corners=True),
    dict(scale_factor=0.6, mode="bilinear"),
    dict(scale_factor=1.5, mode="bicubic"),
    dict(size=(6, 3), mode="bicubic", align_corners=True),
])
def test_interpolate2d(no_fallback, kw):
    check(lambda x: F.interpolate(x, **kw), rnd(2, 3, 4, 5), grad=True)


def test_interpolate_1d_3d_and_ints(no_fallback):
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode="linear"), rnd(2, 3, 4), grad=True)
    check(lambda x: F.interpolate(x, size=7, mode="nearest"), rnd(2, 3, 4), grad=True)
    check(lambda x: F.interpolate(x, size=(3, 5, 4), mode="trilinear", align_corners=True), rnd(1, 2, 2, 3, 4), grad=True)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), rnd(1, 2, 2, 3, 2), grad=True)
    img = torch.randint(0, 255, (1, 3, 9, 9), dtype=torch.uint8)
    check(lambda x: F.interpolate(x, scale_factor=3, mode="nearest"), img)
    # uint8 bilinear/bicubic: PyTorch uses fixed-point weights, so allow off-by-one rounding
    for mode in ("bilinear", "bicubic"):
        check(lambda x: F.interpolate(x, scale_factor=1.7, mode=mode), img, atol=1, rtol=0)


# --- modules: a small CNN trains with no CPU fallback from this family ------------------------

_FAMILY = ("conv", "pool", "norm", "upsample")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False)
        self.gn = nn.GroupNorm(2, 8)
        self.ct = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.ln = nn.LayerNorm(4)
        self.ap = nn.AdaptiveAvgPool2d((2, 3))

    def forward(self, x):
        x = self.pool(self.bn(self.c1(x)))
        x = self.ct(self.gn(self.c2(x)))
        x = F.avg_pool2d(F.interpolate(x, scale_factor=2, mode="bilinear"), 2)
        return self.ap(self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


def test_module_training_grads():
    torch.manual_seed(0)
    net_c = Net()
    net_t = Net()
    net_t.load_state_dict(net_c.state_dict())
    net_t.to("tpu")
    x = rnd(2, 3, 8, 8)
    torchtpu.reset_metrics()
    yc, yt = net_c(x), net_t(x.to("tpu"))
    assert_same(yt, yc, **F32)
    cot = rnd(*yc.shape)
    gc = torch.autograd.grad(yc, list(net_c.parameters()), cot)
    gt = torch.autograd.grad(yt, list(net_t.parameters()), cot.to("tpu"))
    for (name, _), a, b in zip(net_c.named_parameters(), gc, gt):
        try:
            assert_same(b, a, atol=1e-3, rtol=1e-3)
        except AssertionError as e:
            e.add_note(name)
            raise
    for name in ("bn.running_mean", "bn.running_var"):
        assert_same(net_t.state_dict()[name], net_c.state_dict()[name], **F32)
    mine = [op for op in torchtpu.metrics()["fallback_ops"] if any(f in op for f in _FAMILY)]
    assert mine == []
