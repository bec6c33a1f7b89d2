"""Device RNG state through torch.tpu's functions, as torch.utils.checkpoint and
torch.random.fork_rng use torch.cuda's: the same program on CPU and tpu behaves the same."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import torchtpu
from conftest import EAGER_MODES, assert_values


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


@pytest.mark.parametrize("mode", EAGER_MODES)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_with_dropout_gives_the_same_gradients(mode, use_reentrant):
    # the oracle: on CPU, checkpointing does not change the gradients
    assert_values(_block_grads("cpu", False, use_reentrant), _block_grads("cpu", True, use_reentrant))
    with torchtpu.eager_mode(mode):
        plain = _block_grads("tpu", False, use_reentrant)
        ckpt = _block_grads("tpu", True, use_reentrant)
    assert_values(plain, ckpt, rtol=0, atol=0)
    assert plain[0].abs().sum() > 0


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_fork_rng_restores_device_state(mode):
    with torchtpu.eager_mode(mode):
        torch.manual_seed(3)
        with torch.random.fork_rng(device_type="tpu"):
            inside = torch.rand(5, device="tpu").cpu()
        after = torch.rand(5, device="tpu").cpu()
    assert_values(inside, after, rtol=0, atol=0)


def test_rng_state_functions_like_cuda():
    torch.tpu.manual_seed(7)
    assert torch.tpu.initial_seed() == 7
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert_values(torch.randn(4, device="tpu"), a, rtol=0, atol=0)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count() == 1
    b = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state_all(states)
    assert_values(torch.randn(4, device="tpu"), b, rtol=0, atol=0)
    torch.tpu.seed()
    s = torch.tpu.initial_seed()
    torch.tpu.manual_seed(s)
    c = torch.randn(4, device="tpu").cpu()
    torch.tpu.manual_seed(s)
    assert_values(torch.randn(4, device="tpu"), c, rtol=0, atol=0)
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
    assert_values(torch.rand(3, device="tpu"), a, rtol=0, atol=0)
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


# --- torch.Generator(device="tpu") -----------------------------------------------------------
# Values are not bitwise CPU's (JAX's PRNG), so each test runs the same program with a CPU
# generator on CPU and checks that the same draws repeat, differ or match there and on tpu.

def _draws(dev, g, every_family=False):
    """A draw from a few generator-taking random ops on `dev` (from each family when
    `every_family`: slower, its first run compiles eleven programs)."""
    out = [
        torch.randn(6, device=dev, generator=g),
        torch.rand(2, 3, device=dev, generator=g, dtype=torch.float64),
        torch.randint(0, 100, (6,), device=dev, generator=g),
    ]
    if not every_family:
        return [t.cpu() for t in out]
    out += [
        torch.randperm(7, device=dev, generator=g),
        torch.normal(torch.zeros(5, device=dev), 1.0, generator=g),
        torch.empty(5, device=dev).uniform_(-2, 2, generator=g),
        torch.empty(5, device=dev).normal_(generator=g),
        torch.empty(5, device=dev).exponential_(generator=g),
        torch.empty(5, device=dev).random_(0, 50, generator=g),
        torch.bernoulli(torch.full((8,), 0.5, device=dev), generator=g),
        torch.multinomial(torch.ones(9, device=dev), 4, generator=g),
    ]
    return [t.cpu() for t in out]


def _repeats_and_advances(mode, every_family):
    with torchtpu.eager_mode(mode):
        for dev in ("cpu", "tpu"):
            g = torch.Generator(device=dev)
            assert g.device.type == dev and type(g) is torch.Generator
            assert g.initial_seed() == torch.Generator().initial_seed()  # PyTorch's default seed
            assert g.manual_seed(123) is g
            first = _draws(dev, g, every_family)
            second = _draws(dev, g, every_family)  # the generator advanced: different numbers
            assert not torch.equal(first[0], second[0]) and not torch.equal(first[1], second[1])
            g.manual_seed(123)
            assert_values(_draws(dev, g, every_family), first, rtol=0, atol=0, msg=dev)
            state = g.get_state()
            assert state.dtype == torch.uint8 and state.device.type == "cpu"
            third = _draws(dev, g, every_family)
            g.set_state(state)
            assert_values(_draws(dev, g, every_family), third, rtol=0, atol=0, msg=dev)
            h = g.clone_state()  # a copy with the same state draws the same, independently
            assert_values(_draws(dev, h, every_family), _draws(dev, g, every_family), rtol=0, atol=0, msg=dev)
            assert g.initial_seed() == 123 and g.get_state().equal(h.get_state())


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_generator_repeats_and_advances_as_cpu(mode):
    _repeats_and_advances(mode, every_family=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode", EAGER_MODES)
def test_generator_repeats_and_advances_in_every_random_family(mode):
    _repeats_and_advances(mode, every_family=True)


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_generator_is_independent_of_the_default(mode):
    with torchtpu.eager_mode(mode):
        for dev in ("cpu", "tpu"):
            g = torch.Generator(device=dev).manual_seed(5)
            torch.manual_seed(0)
            a = torch.rand(4, device=dev).cpu()
            torch.manual_seed(0)
            torch.rand(4, device=dev, generator=g)  # draws from g; the default does not move
            b = torch.rand(4, device=dev).cpu()
            assert torch.equal(a, b), dev
            # the same seed in an explicit generator and in the default gives the same numbers
            torch.manual_seed(5)
            c = torch.rand(4, device=dev).cpu()
            d = torch.rand(4, device=dev, generator=torch.Generator(device=dev).manual_seed(5)).cpu()
            assert torch.equal(c, d), dev


@pytest.mark.slow
def test_strict_and_defer_and_fuse_draw_the_same_numbers():
    draws = {}
    for mode in EAGER_MODES:
        with torchtpu.eager_mode(mode):
            draws[mode] = _draws("tpu", torch.Generator(device="tpu").manual_seed(9), every_family=True)
    assert_values(draws["strict"], draws["defer_and_fuse"], rtol=0, atol=0)


def test_default_generator_is_a_torch_generator():
    g = torch.tpu.default_generators[0]
    assert type(g) is torch.Generator and g.device == torch.device("tpu", 0)
    torch.manual_seed(4)
    a = torch.randn(5, device="tpu").cpu()
    torch.manual_seed(4)
    assert torch.equal(torch.randn(5, device="tpu", generator=g).cpu(), a)
    assert torch.tpu.get_rng_state().equal(g.get_state())


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_fallback_random_op_uses_the_tpu_generator(mode):
    # poisson has no lowering: the CPU fallback draws from a host generator made from g's state
    rates = torch.full((16,), 3.0)
    with torchtpu.eager_mode(mode):
        for dev in ("cpu", "tpu"):
            g = torch.Generator(device=dev).manual_seed(2)
            a = torch.poisson(rates.to(dev), generator=g).cpu()
            b = torch.poisson(rates.to(dev), generator=g).cpu()
            g.manual_seed(2)
            assert torch.equal(torch.poisson(rates.to(dev), generator=g).cpu(), a), dev
            assert not torch.equal(a, b), dev


def test_generator_of_the_wrong_device_raises_as_on_cuda():
    # CUDA: "Expected a 'cuda' device type for generator but found 'cpu'", and for a CPU
    # tensor with a CUDA generator "Expected a 'cpu' device type for generator but found 'cuda'"
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, device="tpu", generator=torch.Generator())
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.empty(3, device="tpu").bernoulli_(0.5, generator=torch.Generator())
    g = torch.Generator(device="tpu")
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'tpu'"):
        torch.rand(3, generator=g)
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'tpu'"):
        torch.multinomial(torch.ones(3), 2, generator=g)


@pytest.mark.parametrize("bad,err", [(torch.zeros(4, dtype=torch.uint8), RuntimeError),
                                     (torch.zeros(2, dtype=torch.int64), TypeError)])
def test_generator_set_state_rejects_what_cpu_rejects(bad, err):
    with pytest.raises(err):
        torch.Generator().set_state(bad)
    g = torch.Generator(device="tpu").manual_seed(1)
    with pytest.raises(err):
        g.set_state(bad)
    assert g.initial_seed() == 1


def test_missing_extension_is_a_clear_error(monkeypatch):
    from torchtpu.runtime import rng

    monkeypatch.setattr(rng, "_missing", ImportError("no module"))
    monkeypatch.setattr(rng, "_default", {})
    with pytest.raises(RuntimeError, match="C\\+\\+ extension.*make venv"):
        torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="C\\+\\+ extension.*make venv"):
        torch.randn(2, device="tpu")
