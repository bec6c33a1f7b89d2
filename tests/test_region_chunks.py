"""defer_and_fuse: a long region holding a loop's iterations runs as chunks that repeat
(eager/region_plan.py), each compiled once, with CPU's numbers."""
import pytest
import torch

import torchtpu
from conftest import assert_same
from torchtpu.eager import deferred, region_plan
from torchtpu.runtime import checks as pending_checks


def test_cuts_fall_before_each_iteration_of_a_loop():
    prefix = [f"p{i}" for i in range(40)]
    body = [f"b{i}" for i in range(16)]
    keys = prefix + body * 20 + ["tail"]
    starts = region_plan.choose_cuts(keys)
    assert starts is not None and starts[0] == 0
    # every chunk after the first is one iteration, starting at the same op of the body
    gaps = {b - a for a, b in zip(starts[1:], starts[2:])}
    assert gaps == {16}, starts
    assert {keys[s] for s in starts[1:]} == {keys[starts[1]]}


def test_a_forward_loop_then_a_backward_loop_are_cut_at_their_own_ops():
    # the two bodies share no op (a backward's residual sums are add_ where the forward has add)
    fwd = ["addmm", "tanh", "add"]
    bwd = ["tanh_backward", "mm", "mm.t", "sum", "add_"]
    keys = fwd * 64 + ["pow", "mean", "fill_", "div"] + bwd * 64
    starts = region_plan.choose_cuts(keys)
    assert starts is not None and starts[0] == 0
    split = len(fwd) * 64
    assert any(0 < s < split for s in starts) and any(s > split for s in starts), starts
    # each loop's cuts fall at one op of its own body
    assert len({keys[s] for s in starts if 0 < s < split}) == 1
    assert len({keys[s] for s in starts if s > split}) == 1


@pytest.mark.parametrize("keys", [
    [f"o{i}" for i in range(100)] * 2 + [f"x{i}" for i in range(100)],  # two repeats: compile whole
    [f"u{i}" for i in range(400)],  # nothing repeats
    [f"s{i}" for i in range(10)] * 20,  # short of MIN_OPS
], ids=["two-repeats", "no-repeats", "short"])
def test_regions_without_a_loop_compile_whole(keys):
    assert region_plan.choose_cuts(keys) is None


def test_a_plan_wires_each_chunk_to_the_values_earlier_chunks_leave():
    # node j reads node j-1's output 0; node 0 reads input 0; every node reads input 1
    n = 6
    nodes = tuple(("op", ((1, 0) if j == 0 else (0, j - 1, 0), (1, 1))) for j in range(n))
    chunks = region_plan.plan(nodes, ((5, 0),), [1] * n, (0, 2, 4))
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 4), (4, 6)]
    assert chunks[0].sources == ((1, 0), (1, 1)) and chunks[0].outputs == ((1, 0),)
    assert chunks[1].sources == ((0, 1, 0), (1, 1)) and chunks[1].outputs == ((3, 0),)
    assert chunks[2].outputs == ((5, 0),) and chunks[2].local_outputs == ((1, 0),)
    # the two later chunks are the same program: one compile serves both
    assert chunks[1].nodes == chunks[2].nodes
    assert [(c.first_scalar, c.stop_scalar) for c in chunks] == [(0, 2), (2, 4), (4, 6)]
    # a value is let go after the last chunk reading it
    assert [c.done for c in chunks] == [(), ((1, 0),), ((3, 0),)]


def _loop(dev, steps, w, b, h0):
    """A recurrence with an in-place write into a view per step and Python numbers that
    change every step (runtime scalars): no host read inside."""
    w, b, h = w.to(dev), b.to(dev), h0.to(dev)
    acc = torch.zeros(4, 16, device=dev)
    trace = torch.zeros(64, device=dev)
    for i in range(steps):
        h = torch.tanh(h @ w + b) * 0.5 + h * (1.0 / (i + 2))
        acc[i % 4].add_(h[0])
        trace[i] = h.sum()
        h = h - h.mean(0, keepdim=True)
    return h, acc, trace


@pytest.fixture
def defer():
    with torchtpu.eager_mode("defer_and_fuse"):
        torch.tpu.synchronize()
        yield
        torch.tpu.synchronize()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 16, generator=g) * 0.3, torch.randn(16, generator=g), torch.randn(8, 16, generator=g)


def test_a_loop_without_host_reads_compiles_one_chunk_per_iteration_shape(defer):
    w, b, h0 = _inputs()
    torchtpu.reset_metrics()
    got = _loop("tpu", 40, w, b, h0)
    assert deferred.pending_count() >= region_plan.MIN_OPS
    assert_same(got, _loop("cpu", 40, w, b, h0), atol=1e-5, rtol=1e-5)
    m = torchtpu.metrics()
    assert m["regions_chunked"] == 1 and m["regions_executed"] == 1, m
    # before the chunks: a 400-op region compiled whole; now the setup, an iteration (or
    # four: `acc[i % 4]` is a view at one of four places), the end
    assert m["region_compiles"] <= 4 and m["executions"] >= 8, m
    # another trip count: the iterations are compiled already
    before = torchtpu.metrics()["region_compiles"]
    got = _loop("tpu", 33, w, b, h0)
    assert_same(got, _loop("cpu", 33, w, b, h0), atol=1e-5, rtol=1e-5)
    assert torchtpu.metrics()["region_compiles"] - before <= 2


def test_random_ops_in_chunks_draw_what_strict_draws(defer):
    def run():
        torch.manual_seed(3)
        x = torch.zeros(8, 8, device="tpu")
        for _ in range(60):
            x = x * 0.9 + torch.rand(8, 8, device="tpu") + torch.randn(8, device="tpu")
            x = x - x.mean()
        return x.cpu()

    torchtpu.reset_metrics()
    chunked = run()
    # (this region compiled whole took 35 s of XLA:CPU compiling: 120 random ops)
    assert torchtpu.metrics()["regions_chunked"] == 1
    with torchtpu.eager_mode("strict"):
        one_by_one = run()
    # the same draws (others would differ by about one); sums round as their fusion does
    torch.testing.assert_close(chunked, one_by_one, rtol=1e-5, atol=1e-5)


def test_an_index_out_of_range_in_a_chunk_raises_with_the_ops_name(defer):
    x = torch.arange(6.0, device="tpu")
    h = torch.zeros(6, device="tpu")
    torch.tpu.synchronize()  # (the values a failed region computes are lost with it)
    for i in range(60):
        idx = torch.tensor([i % 6 if i != 45 else 9], device="tpu")
        h = (h + x.index_select(0, idx)) * 0.5
        h = h - 1
    with pytest.raises(IndexError, match="out of range|out of bounds") as ei:
        h.cpu()
    assert "index_select" in str(ei.value)
    assert pending_checks.pending() == 0
    assert_same(x + 1, torch.arange(6.0) + 1)


def _deep_step(layers, x):
    h = x
    for lin in layers:
        h = h + torch.tanh(lin(h))
    h.pow(2).mean().backward()


def test_a_training_steps_region_stays_whole(defer):
    torch.manual_seed(0)
    # (deep enough that cutting the forward at one op and the backward at another is clearly
    # worth it: the backward's residual-gradient sums are in-place add_ as on CPU, so the two
    # loops share no op to cut both at)
    layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(64)).to("tpu")
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    x = torch.randn(4, 8, device="tpu")
    torch.tpu.synchronize()
    # the same ops read on the host: a loop's region, cut at its layers
    torchtpu.reset_metrics()
    _deep_step(layers, x)
    layers[0].weight.grad.cpu()
    m = torchtpu.metrics()
    assert m["region_ops"] >= region_plan.MIN_OPS and m["regions_chunked"] == 1, m
    # ended by the optimizer step, it runs every step: one program
    torchtpu.reset_metrics()
    opt.zero_grad()
    _deep_step(layers, x)
    opt.step()
    m = torchtpu.metrics()
    assert m["region_ops"] >= region_plan.MIN_OPS and "regions_chunked" not in m, m


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex64, torch.int64, torch.bool])
def test_chunked_loops_in_every_dtype_class(defer, dtype):
    def run(dev):
        g = torch.Generator().manual_seed(0)
        if dtype == torch.bool:
            x, y = torch.rand(6, 5, generator=g) > 0.5, torch.rand(6, 5, generator=g) > 0.5
        elif dtype == torch.int64:
            x, y = torch.randint(-5, 5, (6, 5), generator=g), torch.randint(-5, 5, (6, 5), generator=g)
        else:
            x, y = torch.randn(6, 5, generator=g).to(dtype), torch.randn(6, 5, generator=g).to(dtype)
        x, y = x.to(dev), y.to(dev)
        acc = torch.zeros(5, dtype=torch.int64 if dtype == torch.bool else dtype, device=dev)
        for i in range(60):
            if dtype == torch.bool:
                x = (x ^ y) | (x & ~y.roll(1, 0))
                acc += x.sum(0)
            elif dtype == torch.int64:
                x = (x * 3 + y) % 11 - 5
                acc += x[i % 6]
            else:
                x = x * 0.5 + y.flip(0) * 0.25
                acc += x[i % 6]
        return x, acc

    torchtpu.reset_metrics()
    got = run("tpu")
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    assert_same(got, run("cpu"), **tol)
    assert torchtpu.metrics()["regions_chunked"] == 1
