"""Device-side checks inside control-flow bodies (issue 16): an out-of-range index in a
torch.cond branch, a while_loop body, a scan combine or a map body raises what CPU raises,
naming the op, in defer_and_fuse and torch.compile (strict runs PyTorch's own eager
implementation op by op, whose checks are the strict executor's); a branch not taken and
valid iterations raise nothing; the device keeps working after the error."""
import pytest
import torch
from torch._dynamo.utils import counters
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import torchtpu
from conftest import assert_same, check, modes


def _cond(x, idx, p):
    return torch.cond(p, lambda x, i: torch.gather(x, 0, i) * 2, lambda x, i: x[:3] + 1, (x, idx))


def _while(x, idx, limit):
    # the index steps up by one each turn: CPU raises on the iteration that leaves x
    def cond_fn(n, acc, i):
        return n < limit

    def body_fn(n, acc, i):
        return n + 1, acc + torch.gather(x, 0, i), i + 1

    return while_loop(cond_fn, body_fn, (idx.new_zeros(()), x.new_zeros(3), idx))[1]


def _scan(x, idx, rows):
    def combine(acc, r):
        g = torch.index_select(x, 0, r).sum(0)
        return acc + g, g * 2

    return scan(combine, x.new_zeros(2), rows)


def _map(x, idx, rows):
    return hop_map(lambda r, x: torch.nn.functional.embedding(r, x), rows, x)


def _as_cpu(fn, args, mode):
    """CPU's outcome is tpu's in `mode` (conftest.check(raises=True)): its value, or its
    exception class and first message line, which on tpu names a device-side check; compiled,
    one whole graph (as fullgraph=True); the device keeps working after."""
    counters.clear()
    got = check(fn, *args, tpu_mode=mode, raises=True)
    if isinstance(got, Exception):
        assert "torchtpu device-side check" in str(got), str(got)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # the device keeps working: a following op is right
    assert_same(torch.arange(3.0, device="tpu") * 2, torch.arange(3.0) * 2)


@pytest.mark.parametrize("mode", modes("defer_and_fuse", "compile"))
@pytest.mark.parametrize("taken", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("bad", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_cond_branch(mode, taken, bad):
    x = torch.arange(6.0)
    idx = torch.tensor([0, 7 if bad else 5, 1])
    _as_cpu(_cond, (x, idx, torch.tensor(taken)), mode)


@pytest.mark.parametrize("mode", modes("defer_and_fuse", "compile"))
@pytest.mark.parametrize("limit", [pytest.param(2, marks=pytest.mark.slow), 4])  # 4 turns run the index past the end on the last
def test_while_loop_body(mode, limit):
    x = torch.arange(5.0)
    _as_cpu(_while, (x, torch.tensor([0, 1, 2]), torch.tensor(limit)), mode)


@pytest.mark.parametrize("mode", modes("defer_and_fuse", "compile"))
@pytest.mark.parametrize("last", [pytest.param(3, marks=pytest.mark.slow), 9])
def test_scan_combine(mode, last):
    x = torch.arange(8.0).reshape(4, 2)
    rows = torch.tensor([[0], [2], [last]])
    _as_cpu(lambda x, r: _scan(x, None, r), (x, rows), mode)


@pytest.mark.parametrize("mode", modes("defer_and_fuse", "compile"))
@pytest.mark.parametrize("last", [pytest.param(3, marks=pytest.mark.slow), 4])
def test_map_body(mode, last):
    x = torch.arange(8.0).reshape(4, 2)
    rows = torch.tensor([[0, 1], [2, last]])
    _as_cpu(lambda x, r: _map(x, None, r), (x, rows), mode)


def test_checks_off_keeps_xla_semantics_in_bodies():
    torchtpu.set_checks(False)
    try:
        torch._dynamo.reset()
        out = torch.compile(_cond, backend="tpu", fullgraph=True)(
            torch.arange(6.0, device="tpu"), torch.tensor([0, 7, 1], device="tpu"), torch.tensor(True, device="tpu"))
        assert out.cpu().shape == (3,)  # a clamped number, as XLA gives it, and no error
    finally:
        torchtpu.set_checks(True)
