"""`generator=` under torch.compile(backend="tpu"), as stock PyTorch treats it on CPU.

Dynamo cannot put a torch.Generator into a graph: it breaks the graph at a random op given
`generator=` and runs that op eagerly (on CPU with any backend). The tpu backend breaks
at the same places, so the compiled function draws from the user's generator exactly as
eager code does: the same numbers, the generator left in the same state."""
import pytest
import torch
import torch._dynamo

import torchtpu
from conftest import assert_values


def _f(x, g):
    return x * 2 + torch.rand(x.shape, generator=g, device=x.device) \
        + torch.randn(3, generator=g, device=x.device).sum()


def _eager_and_compiled(dev, backend):
    x = torch.ones(4, device=dev)
    g = torch.Generator(device=dev)
    g.manual_seed(3)
    eager = [_f(x, g).cpu() for _ in range(3)]
    state = g.get_state()
    torch._dynamo.reset()
    g.manual_seed(3)
    compiled_f = torch.compile(_f, backend=backend)
    compiled = [compiled_f(x, g).cpu() for _ in range(3)]
    return eager, compiled, state, g.get_state()


def _graph_breaks(dev):
    torch._dynamo.reset()
    x = torch.ones(4, device=dev)
    return torch._dynamo.explain(_f)(x, torch.Generator(device=dev).manual_seed(0)).graph_break_count


@pytest.mark.slow  # ~10 s: Dynamo compiles three graphs per backend
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_generator_under_compile_draws_as_eager(mode):
    # the oracle: stock Dynamo on CPU breaks the graph at each generator= op, and the
    # compiled function's numbers and generator state are eager's
    eager, compiled, state, after = _eager_and_compiled("cpu", "eager")
    assert_values(eager, compiled, rtol=0, atol=0)
    assert torch.equal(state, after)
    with torchtpu.eager_mode(mode):
        assert _graph_breaks("tpu") == _graph_breaks("cpu") > 0
        eager, compiled, state, after = _eager_and_compiled("tpu", "tpu")
    # the same draws, read back; a fused region may sum in another order than the compiled graph
    assert_values(eager, compiled, rtol=1e-6, atol=1e-6)
    assert torch.equal(state, after)
    assert not torch.equal(compiled[0], compiled[1])  # each call advanced the generator
    torch._dynamo.reset()
