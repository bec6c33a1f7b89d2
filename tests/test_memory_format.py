"""channels_last (and any permuted layout) is kept through ops as CPU keeps it.

Each case runs the same function on CPU and on tpu and compares values, strides and
is_contiguous(memory_format=...) of every result and of the inputs' gradients, in
strict and defer_and_fuse; CPU PyTorch is the oracle.
"""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import EAGER_MODES, assert_same, assert_values, check

CL, CL3 = torch.channels_last, torch.channels_last_3d


def _x(*shape, fmt=None, dtype=torch.float32):
    t = torch.randn(*shape, dtype=dtype)
    return t.to(memory_format=fmt) if fmt is not None else t


def _layout(t):
    """What a result's memory format is: shape, strides and the contiguity flags (one string)."""
    return str((tuple(t.shape), t.stride(), t.is_contiguous(),
                t.is_contiguous(memory_format=CL) if t.dim() == 4 else None,
                t.is_contiguous(memory_format=CL3) if t.dim() == 5 else None))


def _laid_out(x):
    """x with each tensor paired with its _layout: comparing it compares the layouts too."""
    return torch.utils._pytree.tree_map(lambda t: (t, _layout(t)) if isinstance(t, torch.Tensor) else t, x)


TOL = dict(atol=1e-4, rtol=1e-4, check_stride=True)


def _check_layouts(fn, *inputs, mode="strict", grad_strides=True):
    """conftest.check of fn in `mode`: values, strides and contiguity of every result, and the
    inputs' gradients (autograd.grad's, before AccumulateGrad lays a .grad out as its input)
    with their strides unless not grad_strides (the cotangent in each output's own layout);
    the inputs keep CPU's layout on tpu."""
    assert all(t.to("tpu").stride() == t.stride() for t in inputs)
    tol = TOL if grad_strides else dict(TOL, check_stride=False)  # the results' layouts are in _laid_out
    check(lambda *a: _laid_out(fn(*a)), *inputs, tpu_mode=mode, grad=True, **tol)


# group_norm's gradient for a channels_last input: PyTorch's own derivative formula
# (derivatives.yaml, native_group_norm) makes grad and input channels_last on CPU only and
# contiguous on every other device, CUDA as tpu, so CPU's strides are not the oracle here (a
# .grad hides it: AccumulateGrad lays it out as the input); the values still are
_GRAD_LAYOUT_DIFFERS = {"group_norm", "group_norm3d"}


def _cases():
    x4 = lambda: _x(2, 3, 8, 8, fmt=CL)  # noqa: E731
    x5 = lambda: _x(2, 3, 4, 6, 6, fmt=CL3)  # noqa: E731
    return {
        "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda: (x4(), _x(4, 3, 3, 3), _x(4))),
        "conv2d_weight_cl": (lambda x, w: F.conv2d(x, w, stride=2), lambda: (_x(2, 3, 8, 8), _x(4, 3, 3, 3, fmt=CL))),
        "conv2d_groups": (lambda x, w: F.conv2d(x, w, groups=3), lambda: (_x(2, 6, 8, 8, fmt=CL), _x(6, 2, 3, 3))),
        "conv3d": (lambda x, w: F.conv3d(x, w, padding=1), lambda: (x5(), _x(4, 3, 3, 3, 3))),
        "conv3d_f64": (lambda x, w: F.conv3d(x, w), lambda: (_x(2, 3, 4, 5, 5, fmt=CL3, dtype=torch.float64),
                                                        _x(4, 3, 2, 2, 2, dtype=torch.float64))),
        "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2), lambda: (x4(), _x(3, 4, 3, 3))),
        "conv_transpose3d": (lambda x, w: F.conv_transpose3d(x, w), lambda: (x5(), _x(3, 2, 2, 2, 2))),
        "conv_from_1x1": (lambda x, w: F.conv_transpose2d(x, w), lambda: (_x(2, 5, 1, 1, fmt=CL), _x(5, 3, 4, 4))),
        "conv_from_1x1_contiguous": (lambda x, w: F.conv_transpose2d(x, w), lambda: (_x(2, 5, 1, 1), _x(5, 3, 4, 4))),
        "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), lambda: (x4(), _x(3), _x(3))),
        "batch_norm_eval": (lambda x: F.batch_norm(x, torch.zeros(3, device=x.device), torch.ones(3, device=x.device)),
                            lambda: (x4(),)),
        "batch_norm3d": (lambda x: F.batch_norm(x, None, None, training=True), lambda: (x5(),)),
        "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b), lambda: (x4(), _x(3), _x(3))),
        "group_norm3d": (lambda x: F.group_norm(x, 1), lambda: (x5(),)),
        "layer_norm": (lambda x: F.layer_norm(x, (8,)), lambda: (x4(),)),
        "instance_norm": (lambda x: F.instance_norm(x), lambda: (x4(),)),
        "max_pool2d": (lambda x: F.max_pool2d(x, 2, return_indices=True), lambda: (x4(),)),
        "max_pool3d": (lambda x: F.max_pool3d(x, 2), lambda: (x5(),)),
        "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), lambda: (x4(),)),
        "avg_pool3d": (lambda x: F.avg_pool3d(x, 2), lambda: (x5(),)),
        "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 3), lambda: (x4(),)),
        "adaptive_avg_pool2d_1": (lambda x: F.adaptive_avg_pool2d(x, 1), lambda: (x4(),)),
        "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, 2), lambda: (x5(),)),
        "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 3), lambda: (x4(),)),
        "nearest": (lambda x: F.interpolate(x, scale_factor=2), lambda: (x4(),)),
        "bilinear": (lambda x: F.interpolate(x, size=(5, 11), mode="bilinear"), lambda: (x4(),)),
        "bicubic": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True), lambda: (x4(),)),
        "trilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), lambda: (x5(),)),
        "nearest3d": (lambda x: F.interpolate(x, scale_factor=2), lambda: (x5(),)),
        "relu": (torch.relu, lambda: (x4(),)),
        "gelu": (F.gelu, lambda: (x4(),)),
        "silu": (F.silu, lambda: (x5(),)),
        "hardswish": (F.hardswish, lambda: (x4(),)),
        "leaky_relu": (F.leaky_relu, lambda: (x4(),)),
        "sigmoid_tanh": (lambda x: torch.sigmoid(x) * torch.tanh(x), lambda: (x4(),)),
        "exp_neg_abs": (lambda x: (-x).abs().exp(), lambda: (x4(),)),
        "add_contiguous": (torch.add, lambda: (x4(), _x(2, 3, 8, 8))),
        "add_contiguous_first": (torch.add, lambda: (_x(2, 3, 8, 8), x4())),
        "mul_broadcast_channel": (torch.mul, lambda: (x4(), _x(3, 1, 1))),
        "mul_broadcast_first": (torch.mul, lambda: (_x(3, 1, 1), x4())),
        "sub_broadcast_batch": (torch.sub, lambda: (x4(), _x(1, 3, 8, 8))),
        "add_scalar": (lambda x: x * 2 + 1, lambda: (x4(),)),
        "where": (lambda x, y: torch.where(x > 0, x, y), lambda: (x4(), _x(2, 3, 8, 8))),
        "transposed_matrix": (lambda x: x * 3 - 1, lambda: (_x(5, 7).t(),)),
        "permuted_3d": (lambda x, y: x + y, lambda: (_x(4, 5, 6).permute(2, 0, 1), _x(6, 4, 5))),
        "sum_keepdim": (lambda x: x.sum(1, keepdim=True), lambda: (x4(),)),
        "mean_spatial": (lambda x: x.mean((2, 3), keepdim=True), lambda: (x4(),)),
        "cat_channels": (lambda x, y: torch.cat([x, y], 1), lambda: (x4(), _x(2, 3, 8, 8, fmt=CL))),
        "softmax_channels": (lambda x: F.softmax(x, 1), lambda: (x4(),)),
        "nc11_relu": (torch.relu, lambda: (_x(4, 5, 1, 1, fmt=CL),)),
    }


CASES = _cases()


@pytest.mark.parametrize("mode", EAGER_MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_as_cpu(name, mode):
    fn, make = CASES[name]
    _check_layouts(fn, *make(), mode=mode, grad_strides=name not in _GRAD_LAYOUT_DIFFERS)


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_dropout_keeps_layout(mode):
    x = _x(2, 3, 8, 8, fmt=CL).to("tpu")
    with torchtpu.eager_mode(mode):
        y, mask = torch.native_dropout(x, 0.5, True)
        d = F.dropout(x, 0.3, training=True)
        c = F.dropout(x.cpu(), 0.3, training=True)
        for t in (y, mask, d):
            assert t.stride() == c.stride() and t.is_contiguous(memory_format=CL)
        kept = mask.cpu()
        assert_same(y, x.cpu() * kept * 2)
        xr = x.detach().requires_grad_()
        out = F.dropout(xr, 0.5, training=True)
        out.sum().backward()
        assert xr.grad.stride() == x.stride()
        assert_same(xr.grad, (out.detach().cpu() != 0).float() * 2)


_FACTORIES = {
    "empty": lambda d: torch.empty(2, 3, 4, 5, device=d, memory_format=CL),
    "empty_3d": lambda d: torch.empty(2, 3, 4, 5, 6, device=d, memory_format=CL3),
    "empty_like": lambda d: torch.empty_like(torch.zeros(2, 3, 4, 5, device=d).to(memory_format=CL)),
    "zeros_like": lambda d: torch.zeros_like(torch.zeros(2, 3, 4, 5, device=d).to(memory_format=CL)),
    "ones_like_contiguous": lambda d: torch.ones_like(torch.zeros(2, 3, 4, 5, device=d).to(memory_format=CL),
                                                      memory_format=torch.contiguous_format),
    "full_like": lambda d: torch.full_like(torch.zeros(2, 3, 4, 5, device=d).to(memory_format=CL), 2.0),
    "empty_like_transposed": lambda d: torch.empty_like(torch.zeros(3, 4, device=d).t()),
    "clone": lambda d: torch.arange(120.0, device=d).view(2, 3, 4, 5).to(memory_format=CL).clone(),
    "clone_contiguous": lambda d: torch.arange(120.0, device=d).view(2, 3, 4, 5).to(memory_format=CL).clone(
        memory_format=torch.contiguous_format),
    "contiguous_cl": lambda d: torch.arange(120.0, device=d).view(2, 3, 4, 5).contiguous(memory_format=CL),
    "contiguous_back": lambda d: torch.arange(120.0, device=d).view(2, 3, 4, 5).contiguous(memory_format=CL).contiguous(),
    "contiguous_cl3": lambda d: torch.arange(720.0, device=d).view(2, 3, 4, 5, 6).contiguous(memory_format=CL3),
    "to_cl": lambda d: torch.arange(120.0, device=d).view(2, 3, 4, 5).to(memory_format=CL),
    "to_dtype_preserve": lambda d: torch.arange(120.0, device=d).view(2, 3, 4, 5).to(memory_format=CL).to(torch.float64),
    "to_device_preserve": lambda d: torch.arange(120.0).view(2, 3, 4, 5).to(memory_format=CL).to(d),
    "to_host_preserve": lambda d: torch.arange(120.0).view(2, 3, 4, 5).to(memory_format=CL).to(d).cpu(),
    "resize_cl": lambda d: torch.empty(0, device=d).resize_(2, 3, 4, 5, memory_format=CL),
    "resize_as_cl": lambda d: torch.empty(0, device=d).resize_as_(torch.empty(2, 3, 4, 5, device=d), memory_format=CL),
    "resize_as_cl3": lambda d: torch.empty(0, device=d).resize_as_(torch.empty(2, 3, 4, 5, 6, device=d),
                                                                   memory_format=CL3),
    "resize_as_preserve": lambda d: torch.empty(0, device=d).resize_as_(
        torch.empty(2, 3, 4, 5, device=d).to(memory_format=CL)),
    "out_resized": lambda d: torch.add(torch.arange(120.0, device=d).view(2, 3, 4, 5).to(memory_format=CL), 1,
                                       out=torch.empty(0, device=d)),
}


@pytest.mark.parametrize("mode", EAGER_MODES)
@pytest.mark.parametrize("name", sorted(_FACTORIES))
def test_factories_and_copies(name, mode):
    with torchtpu.eager_mode(mode):
        c, t = _FACTORIES[name]("cpu"), _FACTORIES[name]("tpu")
        assert _layout(t) == _layout(c)
        if not name.startswith(("empty", "resize")):  # to_host_preserve: a copy back on the CPU
            (assert_values if name == "to_host_preserve" else assert_same)(_laid_out(t), _laid_out(c), **TOL, msg=name)


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_channels_last_training_step(mode):
    """A small channels_last conv net: losses, gradients and parameters after SGD steps as
    on CPU, gradients in the parameters' own layout."""
    def net():
        torch.manual_seed(1)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.GroupNorm(2, 8),
            torch.nn.SiLU(), torch.nn.Upsample(scale_factor=2), torch.nn.Conv2d(8, 4, 1),
            torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(16, 5),
        ).to(memory_format=CL)

    cpu_net, dev_net = net(), net().to("tpu")
    x = _x(4, 3, 8, 8, fmt=CL)
    y = torch.randint(0, 5, (4,))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu_net, dev_net)]
    with torchtpu.eager_mode(mode):
        for _ in range(2):
            losses = []
            for m, opt, xx, yy in ((cpu_net, opts[0], x, y), (dev_net, opts[1], x.to("tpu"), y.to("tpu"))):
                opt.zero_grad()
                loss = F.cross_entropy(m(xx), yy)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-5)
            for (n, pc), pt in zip(cpu_net.named_parameters(), dev_net.parameters()):
                assert_same(_laid_out((pt.grad, pt.detach())), _laid_out((pc.grad, pc.detach())), **TOL, msg=n)


def test_compiled_outputs_keep_layout():
    """torch.compile(backend="tpu"): graph outputs and gradients laid out as CPU eager (and
    Inductor on CPU) lay them out, values equal."""
    def f(x, w, b):
        y = F.conv2d(x, w, b, padding=1)
        return torch.relu(y), F.max_pool2d(y, 2), y.sum(1, keepdim=True), F.batch_norm(y, None, None, training=True)

    x, w, b = _x(2, 3, 8, 8, fmt=CL), _x(4, 3, 3, 3), _x(4)
    want = f(x, w, b)
    got = torch.compile(f, backend="tpu")(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    assert_same(_laid_out(got), _laid_out(want), **TOL)

    def g(x, w):
        return F.conv2d(x, w).relu()

    xc, wc = x.clone().requires_grad_(), w.clone().to(memory_format=CL).requires_grad_()
    xt, wt = x.to("tpu").requires_grad_(), w.to(memory_format=CL).to("tpu").requires_grad_()
    yc, yt = g(xc, wc), torch.compile(g, backend="tpu")(xt, wt)
    assert_same(_laid_out(yt.detach()), _laid_out(yc.detach()), **TOL)
    yc.sum().backward()
    yt.sum().backward()
    assert_same(_laid_out((xt.grad, wt.grad)), _laid_out((xc.grad, wc.grad)), **TOL)
