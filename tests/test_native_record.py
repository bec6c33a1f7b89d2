"""defer_and_fuse's record of a signature seen before, in one C++ call (csrc/record.h,
executor._plan_record): results and in-place writes against CPU in every dtype class, the
region it builds (inputs, pending refs, origins, dead outputs), and the cases it hands to
deferred.record (a fresh signature, the size cap, a failed buffer)."""
import gc
import sys
import threading

import pytest
import torch

import torchtpu
from conftest import assert_same, to_tpu
from torchtpu.eager import deferred, executor

pytestmark = pytest.mark.skipif(executor._fast is None, reason="the C++ extensions were not built")

_DTYPES = [torch.float32, torch.bfloat16, torch.complex64, torch.int64, torch.bool]


def _records() -> int:
    return torchtpu.metrics().get("native_records", 0)


def _inputs(dtype):
    g = torch.Generator().manual_seed(2)
    if dtype == torch.bool:
        return torch.rand(5, 4, generator=g) > 0.5, torch.rand(5, 4, generator=g) > 0.5
    if dtype == torch.int64:
        return torch.randint(-9, 9, (5, 4), generator=g), torch.randint(1, 9, (5, 4), generator=g)
    return torch.randn(5, 4, generator=g).to(dtype), torch.randn(5, 4, generator=g).to(dtype)


_FUNCTIONAL = [
    ("add", lambda x, y: x + y),
    ("same input twice", lambda x, y: x * x),
    ("python scalars (runtime inputs)", lambda x, y: x * 3 - y * 2),
    ("chained (pending inputs)", lambda x, y: (x + y) * y + x),
    ("transposed (strided result)", lambda x, y: x.t() + y.t()),
    ("offset views", lambda x, y: x[1:3] + y[2:4]),
    ("where", lambda x, y: torch.where(x == y, x, y)),
    ("unbind (a tuple out)", lambda x, y: torch.unbind(x.t() + y.t())),
    ("split (a list out)", lambda x, y: (x + y).split([2, 3])),
]


@torchtpu.eager_mode("defer_and_fuse")
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("name,fn", _FUNCTIONAL, ids=[n for n, _ in _FUNCTIONAL])
def test_recorded_results_match_cpu(name, fn, dtype):
    x, y = _inputs(dtype)
    want = fn(x, y)
    tx, ty = to_tpu((x, y))
    torch.tpu.synchronize()
    before = _records()
    for _ in range(2):  # the first region records in Python and plans; the second in C++
        got = [fn(tx, ty) for _ in range(3)]  # and within one region, again and again
        torch.tpu.synchronize()
        for g in got:  # (a fused region may contract a * b + c: assert_close's tolerances)
            assert_same(g, want, check_stride=True)
    assert _records() > before


@torchtpu.eager_mode("defer_and_fuse")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.int64], ids=str)
def test_in_place_records_write_the_tensor_and_return_it(dtype):
    x, y = _inputs(dtype)
    tx, ty = to_tpu((x, y))
    torch.tpu.synchronize()
    before = _records()
    for _ in range(4):
        got = tx.add_(ty)
        x.add_(y)
        assert got is tx
        out = torch.mul(ty, 2, out=torch.empty_like(ty))  # an out= variant: written, returned
        assert out.device.type == "tpu"
        assert_same(out, y * 2, rtol=0, atol=0)
        assert_same(tx, x, rtol=0, atol=0)
    assert _records() >= before + 2  # add_ from its third call (each region ends at the reads)


@torchtpu.eager_mode("defer_and_fuse")
def test_a_recorded_node_names_the_users_line():
    x = torch.ones(4, device="tpu")
    torch.tpu.synchronize()
    for _ in range(3):
        before = _records()
        y = x * 3; line = sys._getframe().f_lineno  # noqa: E702
    assert _records() == before + 1  # the last one was recorded in C++
    node = deferred._graph.nodes[-1]
    assert node.origin == (__file__, line, "test_a_recorded_node_names_the_users_line")
    assert node.name == "mul.Tensor" and node.rng is None and not node.collective
    assert_same(y, torch.full((4,), 3.0))


@torchtpu.eager_mode("defer_and_fuse")
def test_region_inputs_and_refs_as_python_records_them():
    x = torch.randn(3, 3, device="tpu")
    torch.tpu.synchronize()
    for _ in range(3):
        torch.tpu.synchronize()
        a = x + x
        b = a + x
    g = deferred._graph
    first, second = g.nodes[-2:]
    assert first.refs == ((1, 0),)  # one storage read twice: one entry
    assert second.refs == ((0, len(g.nodes) - 2, 0), (1, 0))  # the pending a, then x
    assert len(g.inputs) == 1 and second.compiled is not first.compiled
    # what a C++-recorded op leaves in the region holds no cycle: off the GC's lists (record.h)
    assert not any(gc.is_tracked(o) for o in (first, second, first.refs, second.origin, *g.written[-1]))
    assert all(gc.is_tracked(o) for o in (g, g.nodes, g.written))
    assert_same(b, x.cpu() * 3, rtol=1e-6, atol=1e-6)


@torchtpu.eager_mode("defer_and_fuse")
def test_dead_recorded_outputs_are_not_region_outputs():
    t = torch.randn(16, 16, device="tpu")
    for _ in range(3):
        torch.tpu.synchronize()
        a = t * 2
        b = a + 1
    before = _records()
    torch.tpu.synchronize()
    a = t * 2
    b = a + 1
    assert _records() == before + 2
    del a
    gc.collect()
    live = [wr() for wr, p in deferred._graph.written if wr() is not None and wr().buf is p]
    assert len(live) == 1
    assert_same(b, t.cpu() * 2 + 1)


@torchtpu.eager_mode("defer_and_fuse")
def test_the_size_cap_still_ends_regions(monkeypatch):
    x = torch.ones(8, device="tpu")
    y = x + 1
    y = y + 1
    torch.tpu.synchronize()
    monkeypatch.setattr(deferred, "MAX_OPS", 4)
    y = x
    for _ in range(11):
        y = y + 1
        assert deferred.pending_count() < 4
    assert_same(y, torch.full((8,), 12.0))


@torchtpu.eager_mode("defer_and_fuse")
def test_a_failed_input_raises_as_in_python():
    x = torch.ones(4, device="tpu")
    y = x * 2
    y = x * 2
    torch.tpu.synchronize()
    from torchtpu.runtime import storage
    from torchtpu.runtime.pending import Failed

    entry = storage.lookup(y)
    entry.buf = Failed(ValueError("boom"))
    with pytest.raises(RuntimeError, match="lost because computing it failed earlier"):
        y * 2


@torchtpu.eager_mode("defer_and_fuse")
def test_threads_recording_at_once():
    x = torch.randn(6, 6, device="tpu")
    want = x.cpu() * 2 + 1
    errors = []

    def work():
        try:
            with torchtpu.eager_mode("defer_and_fuse"):
                for _ in range(300):
                    r = x * 2 + 1
                assert_same(r, want)
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@torchtpu.eager_mode("defer_and_fuse")
def test_a_run_region_is_freed_by_reference_counting():
    # (a region that only the cyclic GC can free is promoted through its generations and
    # brings on full collections of the whole heap: 200+ ms each with torch and jax loaded)
    x = torch.randn(4, device="tpu")

    def region():
        for _ in range(5):
            y = x + x
            x.mul_(1)
            z = (y * 2).sum()
        torch.tpu.synchronize()
        return z

    for _ in range(3):  # every signature seen, so the C++ record serves the later ones
        region()
    gc.collect()
    gc.disable()
    try:
        before = _records()
        for _ in range(4):
            region()
        assert _records() > before
        graphs = [o for o in gc.get_objects() if type(o) is deferred._Graph]
        assert graphs == [deferred._graph]  # the one being recorded, empty
        # (the nodes of the regions compiled first stay: their fused program holds them)
    finally:
        gc.enable()


def test_record_types_with_other_slots_are_refused():
    # csrc/record.h writes a node's and a Pending's slots itself: other slots fail loudly
    from torchtpu.runtime import tensors
    from torchtpu.runtime.pending import Pending

    class Node:
        __slots__ = ("program", "refs", "origin")

    with pytest.raises(TypeError, match="__slots__ are not the ones"):
        tensors.native.configure_record(vars(deferred), deferred._lock, Node, Pending, {}, {}, {}, len)
    with torchtpu.eager_mode("defer_and_fuse"):  # the configured types still serve
        x = torch.ones(3, device="tpu")
        for _ in range(3):
            y = x * 5
        assert_same(y, torch.full((3,), 5.0))


@torchtpu.eager_mode("defer_and_fuse")
def test_recorded_in_cpp_from_the_python_executor_too():
    # once a carried dtype (complex32, uint4, ...) is seen, every call goes through the Python
    # executor (eager/carried.py checks it), which records planned signatures in C++ as well
    from torchtpu.runtime.jaxenv import CARRIED_SEEN

    x, y = _inputs(torch.float32)
    tx, ty = to_tpu((x, y))
    seen = CARRIED_SEEN[0]
    CARRIED_SEEN[0] = True
    try:
        before = _records()
        for _ in range(4):
            got = tx * ty + 1
            tx.add_(ty)
            x.add_(y)
        assert _records() >= before + 4
    finally:
        CARRIED_SEEN[0] = seen
    assert_same(got, (x - y) * y + 1)
    assert_same(tx, x)
