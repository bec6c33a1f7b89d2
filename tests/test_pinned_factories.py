"""`torch.empty(..., pin_memory=True)` and the factories built on it give pinned CPU tensors,
as on CUDA: the same values, dtype, shape and strides as the same call without pinning on
CPU (random ones under the same seed), `is_pinned()` True."""
import pytest
import torch

import torchtpu

FACTORIES = {
    "empty": (lambda **kw: torch.empty(2, 3, **kw), False),
    "empty_channels_last": (lambda **kw: torch.empty(2, 3, 4, 5, memory_format=torch.channels_last, **kw), False),
    "empty_strided": (lambda **kw: torch.empty_strided((2, 3), (1, 2), **kw), False),
    "empty_like": (lambda **kw: torch.empty_like(torch.ones(4, 2).t(), **kw), False),
    "zeros": (lambda **kw: torch.zeros(2, 3, dtype=torch.float64, **kw), True),
    "ones": (lambda **kw: torch.ones(5, dtype=torch.int32, **kw), True),
    "full": (lambda **kw: torch.full((3,), 7, **kw), True),
    "zeros_like": (lambda **kw: torch.zeros_like(torch.ones(3, dtype=torch.bfloat16), **kw), True),
    "tensor": (lambda **kw: torch.tensor([[1.5, 2.0], [3.0, -4.0]], **kw), True),
    "randn": (lambda **kw: torch.randn(4, 3, **kw), True),
    "rand": (lambda **kw: torch.rand(6, dtype=torch.float64, **kw), True),
    "randint": (lambda **kw: torch.randint(0, 100, (8,), **kw), True),
    "randperm": (lambda **kw: torch.randperm(9, **kw), True),
    "normal": (lambda **kw: torch.normal(0.0, 2.0, (5,), **kw), True),
    "linspace": (lambda **kw: torch.linspace(-1, 1, 7, **kw), True),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_pinned_factory_as_cpu(name):
    make, compare_values = FACTORIES[name]
    torch.manual_seed(0)
    plain = make()
    torch.manual_seed(0)
    pinned = make(pin_memory=True)
    assert pinned.is_pinned() and not plain.is_pinned()
    assert pinned.device.type == "cpu"
    assert (pinned.dtype, pinned.shape, pinned.stride()) == (plain.dtype, plain.shape, plain.stride())
    if compare_values:
        assert torch.equal(pinned, plain)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_pinned_factory_feeds_a_non_blocking_copy(mode):
    torch.manual_seed(1)
    expected = torch.randn(64, 32)
    torch.manual_seed(1)
    host = torch.randn(64, 32, pin_memory=True)
    with torchtpu.eager_mode(mode):
        dev = host.to("tpu", non_blocking=True)
        torch.tpu.synchronize()
        back = (dev * 2).to("cpu")
    torch.testing.assert_close(back, expected * 2, rtol=0, atol=0)


def test_unpinned_factories_unchanged():
    assert not torch.empty(3).is_pinned() and not torch.zeros(2, pin_memory=False).is_pinned()
    t = torch.empty(4, device="tpu")
    assert t.device.type == "tpu"
