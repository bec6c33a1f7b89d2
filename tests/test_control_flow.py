"""torch.cond, while_loop, scan, map and associative_scan on tpu against CPU, in strict,
defer_and_fuse and torch.compile(fullgraph=True): values, dtypes, devices and gradients
(where PyTorch defines them: cond, scan, map); compiled graphs must show no graph break and
no CPU fallback, and device loops must stay one program."""
import pytest
import torch
from torch._dynamo.utils import counters
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import torchtpu
from conftest import assert_same, check
from conftest import modes

# strict runs PyTorch's own eager implementation op by op (a compile per op): slow, and
# checked once in the fast suite by test_cond


def _on_tpu(args):
    return [a.detach().to("tpu").requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args]


def _check(fn, args, mode, grad=False, atol=1e-5, rtol=1e-5):
    """conftest.check of fn(*args) with the tpu side, forward and (with grad) backward, in
    `mode`; compiled, the graph must be whole (no graph break, as fullgraph=True) and fall
    back to the CPU nowhere."""
    counters.clear()
    before = torchtpu.metrics()["cpu_fallbacks"]
    got = check(fn, *args, tpu_mode=mode, grad=grad, atol=atol, rtol=rtol)
    if mode == "compile":
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert torchtpu.metrics()["cpu_fallbacks"] == before
    return got


# ---- the programs -------------------------------------------------------------------------

def cond_closure(x, w):
    # w is closed over by both branches: lifted as an extra operand
    return torch.cond(x.sum() > 0, lambda x: x.sin() * w, lambda x: x.cos() + w, (x,))


def cond_nested(x, w):
    def outer_true(x):
        return torch.cond(x.max() > 1.0, lambda x: x * w, lambda x: x - w, (x,))

    return torch.cond(x.mean() > 0, outer_true, lambda x: x.exp(), (x,))


def while_data_dependent(x, limit):
    # the trip count depends on device data (the loop doubles x until its sum passes `limit`)
    def cond_fn(i, x):
        return x.abs().sum() < limit

    def body_fn(i, x):
        return i + 1, x * 2.0 + 0.25

    return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64, device=x.device), x))


def scan_rnn(xs, h0, w_in, w_h):
    def step(h, x):
        h = torch.tanh(x @ w_in + h @ w_h)
        return h, h.sum(-1)

    return scan(step, h0, xs)


def scan_with_cond(xs, h0, w):
    def step(h, x):
        h = torch.cond(x.sum() > 0, lambda h, x: h + x * w, lambda h, x: h * 0.5 - x, (h, x))
        return h, h.mean()

    return scan(step, h0, xs)


def map_closure(xs, w):
    return hop_map(lambda x: x.sin() * w + 1.0, xs)


def assoc_cumsum(x):
    return associative_scan(lambda a, b: a + b, x, dim=1, combine_mode="generic")


def assoc_pairs(x, y):
    # a linear recurrence h_t = a_t * h_{t-1} + b_t as an associative scan over (a, b) pairs
    def combine(l, r):
        return (l[0] * r[0], r[0] * l[1] + r[1])

    return associative_scan(combine, (x, y), dim=0, combine_mode="generic")


def _x(*shape):
    return torch.randn(*shape)


# ---- forward and backward, every mode --------------------------------------------------------

@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond(mode, sign):
    x = _x(4, 3).abs() * sign
    _check(cond_closure, [x, _x(3)], mode, grad=True)


@pytest.mark.parametrize("mode", modes(slow=("strict",)))
def test_cond_nested(mode):
    _check(cond_nested, [_x(4, 3).abs() + 0.6, _x(3)], mode, grad=True)
    _check(cond_nested, [_x(4, 3).abs() * 0.1, _x(3)], mode)


@pytest.mark.parametrize("mode", modes(slow=("strict",)))
def test_while_loop(mode):
    with torch.no_grad():
        _check(while_data_dependent, [_x(4, 3), torch.tensor(300.0)], mode)


# Eager scan backward is PyTorch's ScanAutogradOp, which re-traces its joint graph under
# Dynamo on the autograd engine's device thread at every call; after a particular sequence
# of earlier tests (while_loop, flex_attention) that crashed the interpreter once in a
# while (segfault in CPython's traceback formatting or a weakref creation), so the eager
# backward runs in the slow suite and the fast suite checks its forward.
@pytest.mark.parametrize("mode,grad", [pytest.param("strict", True, marks=pytest.mark.slow),
                                       pytest.param("defer_and_fuse", True, marks=pytest.mark.slow),
                                       ("defer_and_fuse", False), ("compile", True)])
def test_scan(mode, grad):
    _check(scan_rnn, [_x(6, 2, 3), _x(2, 5), _x(3, 5) * 0.5, _x(5, 5) * 0.5], mode, grad=grad, atol=1e-4)


@pytest.mark.parametrize("mode", modes(slow=("strict",)))
def test_scan_nested_cond(mode):
    _check(scan_with_cond, [_x(5, 3), _x(3), _x(3)], mode)


@pytest.mark.parametrize("mode", modes(slow=("strict",)))
def test_map(mode):
    _check(map_closure, [_x(5, 3), _x(3)], mode, grad=True)


@pytest.mark.parametrize("mode", modes(slow=("strict",)))
def test_associative_scan(mode):
    with torch.no_grad():
        _check(assoc_pairs, [_x(9, 2).abs(), _x(9, 2)], mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
def test_associative_scan_cumsum(mode):
    with torch.no_grad():
        _check(assoc_cumsum, [_x(2, 7)], mode)


# ---- one program, no host transfer -----------------------------------------------------------

def test_while_loop_compiled_is_one_program_without_host_reads():
    x, limit = _x(4, 3).to("tpu"), torch.tensor(300.0).to("tpu")
    fn = torch.compile(while_data_dependent, backend="tpu", fullgraph=True)
    torch._dynamo.reset()
    with torch.no_grad():
        fn(x, limit)  # compiles
        x = x * 3
        torch.tpu.synchronize()
        torchtpu.reset_metrics()
        i, out = fn(x, limit)  # another trip count, same program
        m = torchtpu.metrics()
    assert m.get("compiles", 0) == 0 and m["transfers_to_host"] == 0 and m["executions"] == 1
    want_i, want = while_data_dependent(x.cpu(), limit.cpu())
    assert i.item() == want_i.item()
    assert_same(out, want)


def test_while_loop_deferred_reads_nothing_back():
    x, limit = _x(4, 3).to("tpu"), torch.tensor(300.0).to("tpu")
    with torch.no_grad(), torchtpu.eager_mode("defer_and_fuse"):
        torchtpu.reset_metrics()
        i, out = while_data_dependent(x, limit)
        m = torchtpu.metrics()
        assert m["transfers_to_host"] == 0 and m.get("regions_executed", 0) == 0
        torch.tpu.synchronize()
    assert torchtpu.metrics().get("regions_executed") == 1
    assert_same(out, while_data_dependent(x.cpu(), limit.cpu())[1])


@pytest.mark.parametrize("mode", ["defer_and_fuse", "compile"])
def test_scan_128_steps_is_one_program(mode):
    xs, h0, w_in, w_h = _x(128, 2, 3), _x(2, 5), _x(3, 5) * 0.3, _x(5, 5) * 0.3
    args = _on_tpu([xs, h0, w_in, w_h])
    fn = scan_rnn
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(scan_rnn, backend="tpu", fullgraph=True)
    torchtpu.reset_metrics()
    with torchtpu.eager_mode(mode if mode != "compile" else "strict"):
        h, ys = fn(*args)
        torch.tpu.synchronize()
    m = torchtpu.metrics()
    key = "compile_graphs" if mode == "compile" else "region_compiles"
    assert m[key] == 1, m
    # strict ops around the program (the input copies) are not part of it; nothing per step
    assert m["compiles"] <= 2, m
    want_h, want_ys = scan_rnn(xs, h0, w_in, w_h)
    assert_same((h, ys), (want_h, want_ys), atol=1e-4, rtol=1e-4)


def test_deferred_cond_traces_once_per_signature():
    w = _x(3).to("tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        cond_closure(_x(4, 3).to("tpu"), w).cpu()
        torchtpu.reset_metrics()
        for s in (1.0, -1.0, 1.0):
            cond_closure(_x(4, 3).abs().to("tpu") * s, w).cpu()
        m = torchtpu.metrics()
    assert m["control_flow_nodes"] == 3 and m.get("region_compiles", 0) <= 1, m
