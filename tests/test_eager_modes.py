"""Eager modes: strict, debug, defer_and_fuse."""
import gc
import threading

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same
from torchtpu.eager import deferred


@pytest.fixture
def defer():
    with torchtpu.eager_mode("defer_and_fuse"):
        yield


def test_mode_api_and_env_names():
    old = torchtpu.get_eager_mode()
    for m in ("strict", "debug", "defer_and_fuse"):
        with torchtpu.eager_mode(m):
            assert torchtpu.get_eager_mode() == m == torch.tpu.get_eager_mode()
    assert torchtpu.get_eager_mode() == old
    with pytest.raises(ValueError, match="unknown mode"):
        torchtpu.set_eager_mode("lazy")


def test_defer_records_then_materializes_on_host_read(defer):
    x = torch.randn(4, 4)
    t = x.to("tpu")
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    y = (t * 2 + 1).relu().sum(0)
    assert deferred.pending_count() >= 3
    assert torchtpu.metrics()["executions"] == 0
    assert_same(y, (x * 2 + 1).relu().sum(0))
    m = torchtpu.metrics()
    assert deferred.pending_count() == 0
    assert m["regions_executed"] == 1 and m["materialize:host_read"] == 1


def test_device_dtype_conversions_stay_in_the_region(defer):
    """.to(dtype) and .float() on tpu are ops of the region, not host reads: only the
    copy to the host computes it (a flush per conversion cut greedy decoding's step in
    three regions, each recompiled at every bucket edge)."""
    x = torch.randn(6, generator=torch.Generator().manual_seed(0))
    t = x.to("tpu")
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    y = ((t * 3).to(torch.int32) + 1).float().to(torch.float64).sum()
    assert torchtpu.metrics()["executions"] == 0
    assert y.cpu().item() == (((x * 3).to(torch.int32) + 1).float().to(torch.float64).sum()).item()
    assert torchtpu.metrics()["regions_executed"] == 1


@pytest.mark.parametrize("trigger", ["item", "tolist", "print", "bool", "synchronize"])
def test_materialization_triggers(defer, trigger):
    t = torch.ones(3, device="tpu") * 2
    if trigger == "item":
        assert t.sum().item() == 6
    elif trigger == "tolist":
        assert t.tolist() == [2, 2, 2]
    elif trigger == "print":
        assert "2." in repr(t)
    elif trigger == "bool":
        assert bool((t > 1).all())
    else:
        torch.tpu.synchronize()
    assert deferred.pending_count() == 0


def test_inplace_and_views_stay_correct(defer):
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    t.t()[1].fill_(-1)
    t[::2] += 1
    t.view(-1).mul_(2)
    x.t()[1].fill_(-1)
    x[::2] += 1
    x.view(-1).mul_(2)
    assert_same(t, x)


def test_dead_buffers_are_not_outputs(defer):
    t = torch.randn(64, 64, device="tpu")
    torch.tpu.synchronize()
    a = t * 2
    b = a + 1  # noqa: F841 - stays alive
    del a
    gc.collect()
    live = [wr() for wr, p in deferred._graph.written if wr() is not None and wr().buf is p]
    assert len(live) == 1
    torch.tpu.synchronize()


def test_changing_scalars_never_recompile(defer):
    w = torch.randn(8, device="tpu")
    for i in range(2):
        w.mul_(0.5 + i).add_(1.0)
        torch.tpu.synchronize()
    torchtpu.reset_metrics()
    for i in range(5):
        w.mul_(0.9 - i * 0.01).add_(i + 0.5)
        torch.tpu.synchronize()
    assert torchtpu.metrics()["compiles"] == 0


def test_training_matches_strict_and_reuses_one_executable():
    def run(mode):
        torch.manual_seed(0)
        with torchtpu.eager_mode(mode):
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).to("tpu")
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            g = torch.Generator().manual_seed(0)
            losses, compiles = [], []
            for step in range(6):
                x = torch.randn(4, 8, generator=g).to("tpu")
                y = torch.randint(0, 3, (4,), generator=g).to("tpu")
                for group in opt.param_groups:
                    group["lr"] = 1e-2 / (step + 1)
                before = torchtpu.metrics()["compiles"]
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                compiles.append(torchtpu.metrics()["compiles"] - before)
        return losses, compiles

    strict, _ = run("strict")
    fused, compiles = run("defer_and_fuse")
    for a, b in zip(strict, fused):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert compiles[2:] == [0] * 4, compiles


def test_mode_seen_by_backward_thread(defer):
    seen = []
    orig = deferred.record

    def spy(*a, **k):
        seen.append(threading.current_thread().name)
        return orig(*a, **k)

    deferred.record = spy
    try:
        x = torch.randn(3, device="tpu", requires_grad=True)
        (x * x).sum().backward()
        torch.tpu.synchronize()
    finally:
        deferred.record = orig
    assert len(set(seen)) >= 2  # forward on this thread, backward on the engine's, both deferred
    assert x.grad is not None


def test_deferred_shape_error_points_at_issuing_line(defer):
    a = torch.ones(3, 4, device="tpu")
    b = torch.ones(5, device="tpu")
    with pytest.raises(RuntimeError) as info:
        c = a + b  # the issuing line  # noqa: F841
    text = str(info.value)
    assert "add.Tensor" in text and "(3, 4)" in text and "(5,)" in text
    assert "test_eager_modes.py" in text and "the issuing line" not in text
    import traceback

    frames = traceback.extract_tb(info.tb)
    assert any(f.filename.endswith("test_eager_modes.py") and "a + b" in (f.line or "") for f in frames)


def test_materialization_error_names_issuing_op(defer, monkeypatch):
    t = torch.ones(4, device="tpu")
    torch.tpu.synchronize()
    y = t * 3  # issued here; fails only when the region is traced
    node = deferred._graph.nodes[-1]

    def broken(*a, **k):
        raise ValueError("lowering bug")

    monkeypatch.setattr(node, "program", broken)
    with pytest.raises(ValueError) as info:
        y.cpu()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "mul" in notes and "test_eager_modes.py" in notes
    with pytest.raises(RuntimeError, match="value was lost"):
        y.cpu()


def test_debug_mode_names_op_and_line():
    with torchtpu.eager_mode("debug"):
        a = torch.ones(2, 3, device="tpu")
        with pytest.raises(RuntimeError) as info:
            a @ torch.ones(2, 3, device="tpu")
    text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
    assert "mm" in text and "test_eager_modes.py" in text


def test_debug_nans_names_first_op():
    with torchtpu.eager_mode("debug"):
        torchtpu.set_debug_nans(True)
        try:
            x = torch.tensor([1.0, -1.0], device="tpu")
            with pytest.raises(FloatingPointError, match="sqrt"):
                torch.sqrt(x)
        finally:
            torchtpu.set_debug_nans(False)


@pytest.fixture
def churn3(monkeypatch):
    """A low compile-storm threshold, and no churn memory leaking into other tests."""
    monkeypatch.setattr(deferred, "CHURN", 3)
    deferred.forget_signatures()
    yield
    torch.tpu.synchronize()
    deferred.forget_signatures()


def test_compile_storm_replays_op_by_op(defer, churn3):
    # A tensor of a new length each step: every step's region has new shapes and never
    # repeats. Instead of compiling each such region fused, it is replayed op by op.
    # (Not a tensor growing by torch.cat: eager/dynamism.py buckets that one.)
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    for i in range(8):
        x = torch.full((i + 2, 4), float(i), device="tpu")
        xc = torch.full((i + 2, 4), float(i))
        s = (x * 2).sum(0)
    assert_same(s, (xc * 2).sum(0))
    m = torchtpu.metrics()
    assert m.get("regions_replayed", 0) >= 2, m
    assert m.get("region_compiles", 0) == 0, {k: v for k, v in m.items() if "region" in k or "materialize" in k}
    # Shapes that stop changing fuse again: one compile, then cache hits.
    compiles = []
    for _ in range(4):
        before = torchtpu.metrics()["compiles"]
        assert_same((x * 2).sum(0) + 1, (xc * 2).sum(0) + 1)
        compiles.append(torchtpu.metrics()["compiles"] - before)
    assert compiles[1:] == [0, 0, 0], compiles


def test_replayed_region_error_names_issuing_op(defer, churn3, monkeypatch):
    # a shape that changes every step (new tensors, not a growing cat, which
    # eager/growth.py and eager/dynamism.py bucket)
    base, one = torch.zeros(2, 8, device="tpu"), torch.ones(2, 1, device="tpu")
    for i in range(4):
        x = torch.cat([base[:, :i + 1], one], 1)
    y = x * 3  # issued here; this region is replayed op by op
    assert deferred._graph.churn and deferred._graph.nodes[-1].name == "mul.Tensor"
    node = deferred._graph.nodes[-1]

    def broken(*a, **k):
        raise ValueError("lowering bug")

    broken.codes = node.compiled.fn.codes
    monkeypatch.setattr(node.compiled, "fn", broken)
    with pytest.raises(ValueError) as info:
        y.cpu()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "mul" in notes and "test_eager_modes.py" in notes
    with pytest.raises(RuntimeError, match="value was lost"):
        y.cpu()


def test_an_op_whose_shape_keeps_changing_compiles_fast_and_stays_exact():
    # a KV cache growing by one each decoded token: after a few shapes of one op its
    # executables compile without LLVM optimizations (cheaper), same numbers
    torchtpu.reset_metrics()
    # (a new tensor per length: a cache grown by torch.cat is bucketed by eager/dynamism.py)
    q = torch.randn(1, 2, 1, 8)
    qt = q.to("tpu")
    for i in range(8):
        k = torch.randn(1, 2, i + 2, 8)
        kt = k.to("tpu")
        assert_same((qt @ kt.transpose(-1, -2)).softmax(-1), (q @ k.transpose(-1, -2)).softmax(-1))
    assert torchtpu.metrics().get("fast_compiles", 0) >= 1


def test_flush_is_invisible_to_user_dispatch_modes(defer):
    """A region materialized while a user's TorchDispatchMode is active (a synchronize, a
    compiled graph reading a pending input inside a checkpointed block) runs torchtpu's
    own lowering code; its torch calls (torch.promote_types in cat's lowering, ...) must not
    reach the user's mode. Selective activation checkpointing's mode counted them as the
    block's ops and, in TorchTitan's defer_and_fuse run, raised "aten.promote_types.default
    encountered during backward but not found in storage"."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    a = torch.randn(3).to("tpu")
    b = torch.randn(4, dtype=torch.float64).to("tpu")
    c = torch.cat([a, b]) * 2
    with Log() as log:
        torch.tpu.synchronize()
    assert log.ops == []
    assert torch.equal(c.cpu(), torch.cat([a.cpu(), b.cpu()]) * 2)


def test_a_host_read_waits_for_the_flush_another_thread_is_running(defer, monkeypatch):
    # A flush swaps in an empty region, then runs the old one with the lock held (XLA lets go
    # of the GIL). A thread reading one of that region's values finds nothing recorded: it
    # must wait for the lock, not read the storage's Pending as if it were an array.
    from torchtpu.runtime import launcher, pending

    x = torch.randn(6, 6, device="tpu")
    want = x.cpu() * 2 + 1
    r = x * 2 + 1  # pending
    reader_reached = threading.Event()
    flusher = threading.current_thread()
    real_launch, real_materialize = launcher.launch, pending._materialize[0]
    got = []

    def read():
        try:
            got.append(r.cpu())
        except Exception as e:  # reported below, not lost in the thread
            got.append(e)

    reader = threading.Thread(target=read)

    def launch(*a, **k):  # the flushing thread, its region swapped out: the reader asks for r now
        if threading.current_thread() is flusher and not reader.is_alive() and not got:
            reader.start()
            reader_reached.wait(30)  # (a safety bound: a reader that never gets there fails below)
        return real_launch(*a, **k)

    def materialize(reason):
        if threading.current_thread() is reader:
            reader_reached.set()
        return real_materialize(reason)

    monkeypatch.setattr(launcher, "launch", launch)
    monkeypatch.setattr(pending, "_materialize", [materialize])
    deferred.flush("test")
    reader.join()
    assert reader_reached.is_set()
    assert len(got) == 1 and isinstance(got[0], torch.Tensor), got
    assert torch.equal(got[0], want)
