"""`torch.empty(..., pin_memory=True)` and the factories built on it give pinned CPU tensors,
as on CUDA: the same values, dtype, shape and strides as the same call without pinning on
CPU (random ones under the same seed), `is_pinned()` True."""
import pytest
import torch

import torchtpu
from conftest import assert_values

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
    "logspace": (lambda **kw: torch.logspace(0, 2, 5, dtype=torch.float64, **kw), True),
    # factories that resize what they start from, or allocate through the pinned allocator
    "arange": (lambda **kw: torch.arange(7, **kw), True),
    "arange_float": (lambda **kw: torch.arange(0.5, 3, 0.25, **kw), True),
    "eye": (lambda **kw: torch.eye(3, **kw), True),
    "eye_rect": (lambda **kw: torch.eye(2, 4, dtype=torch.int16, **kw), True),
    "hann_window": (lambda **kw: torch.hann_window(8, **kw), True),
    "hamming_window": (lambda **kw: torch.hamming_window(8, False, 0.5, 0.4, **kw), True),
    "bartlett_window": (lambda **kw: torch.bartlett_window(7, **kw), True),
    "blackman_window": (lambda **kw: torch.blackman_window(7, periodic=False, **kw), True),
    "kaiser_window": (lambda **kw: torch.kaiser_window(9, True, 8.0, **kw), True),
    "tril_indices": (lambda **kw: torch.tril_indices(4, 3, -1, **kw), True),
    "triu_indices": (lambda **kw: torch.triu_indices(3, 5, 1, **kw), True),
    "scalar_tensor": (lambda **kw: torch.scalar_tensor(2.5, dtype=torch.float64, **kw), True),
    "fftfreq": (lambda **kw: torch.fft.fftfreq(6, 0.5, **kw), True),
    "rfftfreq": (lambda **kw: torch.fft.rfftfreq(7, **kw), True),
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
    assert_values(back, expected * 2, rtol=0, atol=0)  # the copy back on the host


def test_unpinned_factories_unchanged():
    assert not torch.empty(3).is_pinned() and not torch.zeros(2, pin_memory=False).is_pinned()
    t = torch.empty(4, device="tpu")
    assert t.device.type == "tpu"


def test_pinned_factory_errors_as_cpu():
    # torch.range takes no pin_memory on CPU: the same TypeError
    with pytest.raises(TypeError, match="pin_memory"):
        torch.range(0, 3, pin_memory=True)
    with pytest.raises(RuntimeError) as cpu_err:
        torch.arange(0, 3, -1)
    with pytest.raises(RuntimeError) as pinned_err:
        torch.arange(0, 3, -1, pin_memory=True)
    assert str(pinned_err.value) == str(cpu_err.value)
