"""Device RNG state through torch.tpu's functions, as torch.utils.checkpoint and
torch.random.fork_rng use torch.cuda's: the same program on CPU and tpu behaves the same."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import torchtpu

MODES = ["strict", "defer_and_fuse"]


def _block_grads(dev, use_checkpoint, use_reentrant):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).to(dev)
    x = torch.randn(4, 8).to(dev).requires_grad_()

    def block(x):
        return F.dropout(torch.tanh(lin(x)), 0.5, training=True) * 2

    torch.manual_seed(1)
    y = checkpoint(block, x, use_reentrant=use_reentrant) if use_checkpoint else block(x)
    y.sum().backward()
    return lin.weight.grad.cpu(), x.grad.cpu()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_with_dropout_gives_the_same_gradients(mode, use_reentrant):
    # the oracle: on CPU, checkpointing does not change the gradients
    for a, b in zip(_block_grads("cpu", False, use_reentrant), _block_grads("cpu", True, use_reentrant)):
        torch.testing.assert_close(a, b)
    with torchtpu.eager_mode(mode):
        plain = _block_grads("tpu", False, use_reentrant)
        ckpt = _block_grads("tpu", True, use_reentrant)
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert plain[0].abs().sum() > 0


@pytest.mark.parametrize("mode", MODES)
def test_fork_rng_restores_device_state(mode):
    with torchtpu.eager_mode(mode):
        torch.manual_seed(3)
        with torch.random.fork_rng(device_type="tpu"):
            inside = torch.rand(5, device="tpu").cpu()
        after = torch.rand(5, device="tpu").cpu()
    torch.testing.assert_close(inside, after, rtol=0, atol=0)


def test_rng_state_functions_like_cuda():
    torch.tpu.manual_seed(7)
    assert torch.tpu.initial_seed() == 7
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    torch.testing.assert_close(torch.randn(4, device="tpu").cpu(), a, rtol=0, atol=0)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count() == 1
    b = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    torch.testing.assert_close(torch.randn(4, device="tpu").cpu(), b, rtol=0, atol=0)
    torch.tpu.seed()
    s = torch.tpu.initial_seed()
    torch.tpu.manual_seed(s)
    c = torch.randn(4, device="tpu").cpu()
    torch.tpu.manual_seed(s)
    torch.testing.assert_close(torch.randn(4, device="tpu").cpu(), c, rtol=0, atol=0)
    torch.manual_seed(11)  # seeds every device, as on CUDA
    assert torch.tpu.initial_seed() == 11


def test_default_generator_state_methods():
    g = torch.tpu.default_generators[0]
    assert len(torch.tpu.default_generators) == torch.tpu.device_count()
    assert g.device == torch.device("tpu", 0)
    assert g.manual_seed(5) is g and g.initial_seed() == 5 == torch.tpu.initial_seed()
    state = g.get_state()
    a = torch.rand(3, device="tpu").cpu()
    g.set_state(state)
    torch.testing.assert_close(torch.rand(3, device="tpu").cpu(), a, rtol=0, atol=0)
    s = g.seed()
    assert g.initial_seed() == s


@pytest.mark.parametrize("bad,err", [(torch.zeros(4, dtype=torch.uint8), RuntimeError),
                                     (torch.zeros(2, dtype=torch.int64), TypeError)])
def test_set_rng_state_rejects_bad_states(bad, err):
    # CPU's generator rejects the same kinds of state with the same exception classes
    with pytest.raises(err):
        torch.set_rng_state(bad)
    with pytest.raises(err):
        torch.tpu.set_rng_state(bad)
