"""Pinned host memory and non-blocking copies, as a torch.cuda user meets them.

The values moved through pinned memory are compared with the CPU program's; what
pinning itself promises (is_pinned(), strides kept, the same tensor back when already
pinned, a pinned result for a non-blocking device->host copy) follows CUDA's behaviour.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchtpu
from torchtpu.runtime import pinned


@pytest.fixture(params=["strict", "defer_and_fuse"])
def mode(request):
    with torchtpu.eager_mode(request.param):
        yield request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_pin_memory(dtype):
    x = (torch.arange(12) % 3).to(dtype).reshape(3, 4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p[1].is_pinned() and p.t().is_pinned()
    assert p.data_ptr() != x.data_ptr()
    assert p.dtype == x.dtype and p.stride() == x.stride()
    torch.testing.assert_close(p, x, rtol=0, atol=0)
    assert p.pin_memory() is p  # already pinned: the same tensor, as on CUDA
    pt = x.t().pin_memory()  # a permuted dense layout keeps its strides
    assert pt.stride() == x.t().stride() and pt.is_pinned()
    torch.testing.assert_close(pt, x.t(), rtol=0, atol=0)
    ps = x[:, ::2].pin_memory()  # not dense: packed contiguous
    assert ps.is_contiguous() and ps.is_pinned()
    torch.testing.assert_close(ps, x[:, ::2], rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pin_memory(device) is deprecated in torch
        assert x.pin_memory("tpu").is_pinned()
        assert x.pin_memory(torch.device("tpu")).is_pinned()
    assert x.untyped_storage().pin_memory().is_pinned()
    assert not x.untyped_storage().is_pinned()


def test_pin_memory_errors_as_cpu_torch():
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match="not an accelerator"):
            x.pin_memory("cpu")
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="tpu").pin_memory()
    assert not torch.ones(2, device="tpu").is_pinned()  # device memory is not pinned host memory


def test_pinned_blocks_are_released():
    before = pinned.stats()
    p = torch.randn(1000).pin_memory()
    view = p[10:]
    assert pinned.stats()["bytes"] >= before["bytes"] + 4000
    del p
    assert view.is_pinned()  # the view keeps the block
    del view  # CPU tensors hold no cycles: the block goes when the last one dies
    assert pinned.stats() == before
    assert not torch.randn(1000).is_pinned()


def test_non_blocking_copies_both_ways(mode):
    x = torch.randn(4, 5)
    cpu = (x * 2).t().to(torch.float64)
    t = x.pin_memory().to("tpu", non_blocking=True)
    assert t.device.type == "tpu"
    y = (t * 2).t()
    back = y.to("cpu", torch.float64, non_blocking=True)
    plain = y.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert back.is_pinned() and plain.is_pinned()  # CUDA's non-blocking device->host result is pinned
    assert back.device.type == "cpu" and back.dtype == cpu.dtype and back.stride() == cpu.stride()
    torch.testing.assert_close(back, cpu, rtol=0, atol=0)
    torch.testing.assert_close(plain, (x * 2).t(), rtol=0, atol=0)
    blocking = y.to("cpu")
    assert not blocking.is_pinned()
    torch.testing.assert_close(blocking, (x * 2).t(), rtol=0, atol=0)
    # the copy_ spelling
    dst = torch.empty(5, 4).pin_memory()
    dst.copy_(y, non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(dst, (x * 2).t(), rtol=0, atol=0)


@pytest.mark.parametrize("pin_memory_device", ["", "tpu"])
def test_dataloader_pin_memory(mode, pin_memory_device):
    data = TensorDataset(torch.arange(24.0).reshape(12, 2), torch.arange(12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory_device is deprecated in torch
        pinned_loader = DataLoader(data, batch_size=5, pin_memory=True, pin_memory_device=pin_memory_device)
        batches = list(pinned_loader)
    plain = list(DataLoader(data, batch_size=5))
    assert len(batches) == len(plain) == 3
    model = torch.nn.Linear(2, 3).to("tpu")
    cpu_model = torch.nn.Linear(2, 3)
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    for (xb, yb), (xp, yp) in zip(batches, plain):
        assert xb.is_pinned() and yb.is_pinned() and not xp.is_pinned()
        torch.testing.assert_close(xb, xp, rtol=0, atol=0)
        torch.testing.assert_close(yb, yp, rtol=0, atol=0)
        out = model(xb.to("tpu", non_blocking=True))
        torch.testing.assert_close(out.cpu(), cpu_model(xp), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sync", ["synchronize", "stream", "event", "accelerator", "host_read", "save"])
def test_non_blocking_copy_lands_by_any_synchronization(mode, sync, tmp_path):
    """A non-blocking device->host copy may still be in flight when it returns; every way a
    CUDA user synchronizes (or a later blocking host read on the one in-order stream) makes
    its value right."""
    x = torch.randn(64, 32)
    t = x.to("tpu")
    out = (t @ t.t() * 2).to("cpu", non_blocking=True)
    half = (t * 3)[::2].to("cpu", torch.bfloat16, non_blocking=True)
    if sync == "synchronize":
        torch.tpu.synchronize()
    elif sync == "stream":
        torch.tpu.current_stream().synchronize()
    elif sync == "event":
        ev = torch.tpu.Event()
        ev.record()
        ev.synchronize()
    elif sync == "accelerator":
        torch.accelerator.synchronize()
    elif sync == "host_read":
        (t + 1).sum().item()
    else:
        torch.save(t, str(tmp_path / "t.pt"))
    assert out.is_pinned() and half.is_pinned()
    torch.testing.assert_close(out, x @ x.t() * 2, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(half, (x * 3)[::2].to(torch.bfloat16), rtol=0, atol=0)
