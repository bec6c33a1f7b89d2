"""End to end: the same training program on tpu and CPU gives the same losses."""
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtpu
from conftest import assert_same, assert_values


def _mlp():
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.0),
                         nn.LayerNorm(64), nn.Linear(64, 5))


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        # no bias before BatchNorm: its gradient is pure rounding noise, which Adam
        # amplifies to +-lr, so CPU and tpu would drift apart in running_mean alone
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(16 * 2 * 2, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = F.avg_pool2d(x, 2)
        return self.head(x.flatten(1))


def _train(make, data, device, steps=20, opt_name="adamw", clip=False):
    torch.manual_seed(0)
    model = make().to(device)
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    elif opt_name == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, model


def _data(shape, n=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(*shape, generator=g), torch.randint(0, 5, (shape[0],), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("opt_name", ["adamw", "adam", "sgd"])
def test_mlp_matches_cpu(opt_name):
    data = _data((16, 20))
    cpu, _ = _train(_mlp, data, "cpu", opt_name=opt_name, clip=opt_name == "adam")
    torchtpu.reset_metrics()
    tpu, _ = _train(_mlp, data, "tpu", opt_name=opt_name, clip=opt_name == "adam")
    assert torchtpu.metrics()["cpu_fallbacks"] == 0, torchtpu.metrics()["fallback_ops"]
    assert_values(tpu, cpu, rtol=1e-4, atol=1e-6)  # the losses read back, step by step


def test_cnn_matches_cpu():
    data = _data((4, 3, 16, 16))
    cpu, cm = _train(_CNN, data, "cpu")
    torchtpu.reset_metrics()
    tpu, tm = _train(_CNN, data, "tpu")
    assert torchtpu.metrics()["cpu_fallbacks"] == 0, torchtpu.metrics()["fallback_ops"]
    assert_values(tpu, cpu, rtol=1e-4, atol=1e-6)  # the losses read back, step by step
    # BatchNorm running statistics were updated in place on the device
    assert_same((tm.bn1.running_mean, tm.bn1.running_var), (cm.bn1.running_mean, cm.bn1.running_var),
                rtol=1e-4, atol=1e-5)
    assert int(tm.bn1.num_batches_tracked.item()) == 20


def test_live_buffers_flat_over_1000_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, device="tpu")
    y = torch.randint(0, 2, (4,), device="tpu")

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    from torchtpu.runtime import storage

    for _ in range(5):
        step()
    gc.collect()
    start_buffers, start_bytes = storage.live_buffers(), torch.tpu.memory_allocated()
    for _ in range(1000):
        step()
    gc.collect()
    assert storage.live_buffers() == start_buffers
    assert torch.tpu.memory_allocated() == start_bytes


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_forward_ad_make_dual(mode):
    # PyTorch's test_copy_forward_ad_broadcasting and gradcheck(check_forward_ad=True):
    # make_dual sized the tangent from storage().nbytes(), 0 on tpu, and failed as_strided's check
    import torch.autograd.forward_ad as fwAD

    p, t = torch.randn(3, 4), torch.randn(3, 4)
    want = 2 * torch.cos(2 * p.t()) * t.t()
    with torchtpu.eager_mode(mode), fwAD.dual_level():
        d = fwAD.make_dual(p.to("tpu").t(), t.to("tpu").t())
        _, tangent = fwAD.unpack_dual((d * 2).sin())
        assert_same(tangent, want)
        x = torch.zeros(1, 3, 3, device="tpu")
        x.copy_(fwAD.make_dual(torch.ones(3, device="tpu"), torch.full((3,), 5.0, device="tpu")))
        assert fwAD.unpack_dual(x).tangent.cpu().eq(5).all()


def test_forward_ad_copy_of_a_tpu_dual_into_a_cpu_tensor():
    # PyTorch's test_copy_forward_ad_same_layout_copies_grad: the CPU primal's tangent is made
    # with the CPU primal's options (tpu read a device buffer the CPU tensor has not)
    import torch.autograd.forward_ad as fwAD

    tangent = torch.tensor([[5.0], [6.0]], device="tpu")
    with fwAD.dual_level():
        x = fwAD.make_dual(torch.tensor([[3.0], [4.0]], device="tpu"), tangent)
        non_dual = torch.tensor([[1.0], [2.0]])
        non_dual.copy_(x)
        got = fwAD.unpack_dual(non_dual).tangent
        assert got is not tangent and got.device.type == "cpu"
        assert_values(got, tangent)  # the CPU copy's tangent against the tpu one
