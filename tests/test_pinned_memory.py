"""Pinned host memory and non-blocking copies, as a torch.cuda user meets them.

The values moved through pinned memory are compared with the CPU program's; what
pinning itself promises (is_pinned(), strides kept, the same tensor back when already
pinned, a pinned result for a non-blocking device->host copy) follows CUDA's behaviour.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchtpu
from conftest import assert_same
from torchtpu.runtime import pinned


@pytest.fixture(params=["strict", "defer_and_fuse"])
def mode(request):
    with torchtpu.eager_mode(request.param):
        yield request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_pin_memory(dtype):
    x = (torch.arange(12) % 3).to(dtype).reshape(3, 4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p[1].is_pinned() and p.t().is_pinned()
    assert p.data_ptr() != x.data_ptr()
    assert p.dtype == x.dtype and p.stride() == x.stride()
    assert_same(p, x, rtol=0, atol=0, device="cpu")
    assert p.pin_memory() is p  # already pinned: the same tensor, as on CUDA
    pt = x.t().pin_memory()  # a permuted dense layout keeps its strides
    assert pt.stride() == x.t().stride() and pt.is_pinned()
    assert_same(pt, x.t(), rtol=0, atol=0, device="cpu")
    ps = x[:, ::2].pin_memory()  # not dense: packed contiguous
    assert ps.is_contiguous() and ps.is_pinned()
    assert_same(ps, x[:, ::2], rtol=0, atol=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pin_memory(device) is deprecated in torch
        assert x.pin_memory("tpu").is_pinned()
        assert x.pin_memory(torch.device("tpu")).is_pinned()
    assert x.untyped_storage().pin_memory().is_pinned()
    assert not x.untyped_storage().is_pinned()


def test_pin_memory_errors_as_cpu_torch():
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match="not an accelerator"):
            x.pin_memory("cpu")
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="tpu").pin_memory()
    assert not torch.ones(2, device="tpu").is_pinned()  # device memory is not pinned host memory


def test_pinned_blocks_are_released():
    before = pinned.stats()
    p = torch.randn(1000).pin_memory()
    view = p[10:]
    assert pinned.stats()["bytes"] >= before["bytes"] + 4000
    del p
    assert view.is_pinned()  # the view keeps the block
    del view  # CPU tensors hold no cycles: the block goes when the last one dies
    assert pinned.stats() == before
    assert not torch.randn(1000).is_pinned()


def test_non_blocking_copies_both_ways(mode):
    x = torch.randn(4, 5)
    cpu = (x * 2).t().to(torch.float64)
    t = x.pin_memory().to("tpu", non_blocking=True)
    assert t.device.type == "tpu"
    y = (t * 2).t()
    back = y.to("cpu", torch.float64, non_blocking=True)
    plain = y.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert back.is_pinned() and plain.is_pinned()  # CUDA's non-blocking device->host result is pinned
    assert back.device.type == "cpu" and back.dtype == cpu.dtype and back.stride() == cpu.stride()
    assert_same(back, cpu, rtol=0, atol=0, device="cpu")
    assert_same(plain, (x * 2).t(), rtol=0, atol=0, device="cpu")
    blocking = y.to("cpu")
    assert not blocking.is_pinned()
    assert_same(blocking, (x * 2).t(), rtol=0, atol=0, device="cpu")
    # the copy_ spelling
    dst = torch.empty(5, 4).pin_memory()
    dst.copy_(y, non_blocking=True)
    torch.tpu.synchronize()
    assert_same(dst, (x * 2).t(), rtol=0, atol=0, device="cpu")


@pytest.mark.parametrize("pin_memory_device", ["", "tpu"])
def test_dataloader_pin_memory(mode, pin_memory_device):
    data = TensorDataset(torch.arange(24.0).reshape(12, 2), torch.arange(12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory_device is deprecated in torch
        pinned_loader = DataLoader(data, batch_size=5, pin_memory=True, pin_memory_device=pin_memory_device)
        batches = list(pinned_loader)
    plain = list(DataLoader(data, batch_size=5))
    assert len(batches) == len(plain) == 3
    model = torch.nn.Linear(2, 3).to("tpu")
    cpu_model = torch.nn.Linear(2, 3)
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    for (xb, yb), (xp, yp) in zip(batches, plain):
        assert xb.is_pinned() and yb.is_pinned() and not xp.is_pinned()
        assert_same(xb, xp, rtol=0, atol=0, device="cpu")
        assert_same(yb, yp, rtol=0, atol=0, device="cpu")
        out = model(xb.to("tpu", non_blocking=True))
        assert_same(out, cpu_model(xp), rtol=1e-5, atol=1e-6)


_SYNCS = ["synchronize", "stream", "plain_stream", "event", "accelerator", "host_read", "save"]


def _synchronize(sync, other, tmp_path):
    """Every way a CUDA user waits for the stream; `other` is a tpu tensor not involved."""
    if sync == "synchronize":
        torch.tpu.synchronize()
    elif sync == "stream":
        torch.tpu.current_stream().synchronize()
    elif sync == "plain_stream":
        torch.Stream(device="tpu").synchronize()  # PyTorch's C++ stream type on the device
    elif sync == "event":
        ev = torch.tpu.Event()
        ev.record()
        ev.synchronize()
    elif sync == "accelerator":
        torch.accelerator.synchronize()
    elif sync == "host_read":
        (other + 1).sum().item()  # a blocking read of another tensor: the one stream is in order
    else:
        torch.save(other, str(tmp_path / "t.pt"))


@pytest.mark.parametrize("sync", _SYNCS)
def test_non_blocking_copy_lands_by_any_synchronization(mode, sync, tmp_path):
    """A non-blocking device->host copy may still be in flight when it returns; every way a
    CUDA user synchronizes (or a later blocking host read on the one in-order stream) makes
    its value right."""
    x = torch.randn(256, 256) / 16
    t = x.to("tpu")
    out = (t @ t @ t * 2).to("cpu", non_blocking=True)
    half = (t * 3)[::2].to("cpu", torch.bfloat16, non_blocking=True)
    flipped = (t - 1).t().to("cpu", torch.float64, non_blocking=True)
    into = torch.empty(256, 256).pin_memory()
    into.copy_(t @ t - 2, non_blocking=True)  # the copy_ spelling, into the user's pinned tensor
    rows = torch.zeros(4, 256).pin_memory()
    rows[1:3].copy_((t + 5)[:2], non_blocking=True)  # a contiguous view inside a pinned block
    _synchronize(sync, t, tmp_path)
    assert_same(into, x @ x - 2, rtol=1e-5, atol=1e-5, device="cpu")
    want_rows = torch.zeros(4, 256)
    want_rows[1:3] = (x + 5)[:2]
    assert_same(rows, want_rows, rtol=0, atol=0, device="cpu")
    assert out.is_pinned() and half.is_pinned() and flipped.is_pinned()
    assert_same(out, x @ x @ x * 2, rtol=1e-5, atol=1e-5, device="cpu")
    assert_same(half, (x * 3)[::2].to(torch.bfloat16), rtol=0, atol=0, device="cpu")
    want = (x - 1).t().to("cpu", torch.float64)
    assert flipped.dtype == want.dtype and flipped.stride() == want.stride()
    assert_same(flipped, want, rtol=0, atol=0, device="cpu")


def _slow_product(n=900):
    a = torch.randn(n, n) / 30
    d = a.to("tpu")
    (d @ d @ d).sum().item()  # compile the programs first
    torch.tpu.synchronize()
    return a, d


def _issued_in_flight(issue, attempts=5):
    """(a, d, want, result of issue(y)) for the first attempt at which the copy `issue(y)` of a
    slow product y returned while the device was still busy. One attempt can race on a loaded
    machine (the device finishes between our readiness check and the query), so a few are made;
    a copy that blocks is never seen in flight and fails every one. Skips when the device was
    always done before the copy could be issued."""
    from torchtpu.eager import deferred
    from torchtpu.runtime import storage

    raced = 0
    for _ in range(attempts):
        a, d = _slow_product()
        y = d @ d @ d @ d
        deferred.flush("test")
        if storage.lookup(y).buf.is_ready():
            continue
        out = issue(y)
        if not torch.tpu.current_stream().query():
            return a, d, a @ a @ a @ a, out
        raced += 1
        torch.tpu.synchronize()
    if not raced:
        pytest.skip("the device finished before the copy was issued")
    raise AssertionError(f"the copy was never seen in flight in {raced} tries: it waited for the device")


@pytest.mark.parametrize("sync", ["synchronize", "host_read"])
def test_non_blocking_copy_returns_before_the_value_lands(mode, sync, tmp_path):
    """As on CUDA, the call returns once the copy is queued, not when the device is done;
    the value is there after a synchronization."""
    a, d, want, out = _issued_in_flight(lambda y: y.to("cpu", non_blocking=True))
    assert out.is_pinned()
    _synchronize(sync, d, tmp_path)
    from torchtpu.runtime import inflight
    assert torch.tpu.current_stream().query(), [(type(b), getattr(b, "shape", None)) for b in inflight.pending()]
    assert_same(out, want, rtol=1e-4, atol=1e-5, device="cpu")


@pytest.mark.parametrize("read", ["synchronize", "to_device", "copy_to_device"])
def test_non_blocking_copy_into_pinned_returns_before_the_value_lands(mode, read):
    """`pinned.copy_(tpu_tensor, non_blocking=True)` is queued, as CUDA's; the value is there
    after a synchronization, and a host->device copy of the destination issued before any
    synchronization reads the landed value (on CUDA's one stream it queues behind the copy)."""
    def issue(y):
        dst = torch.empty(y.shape).pin_memory()
        assert dst.copy_(y, non_blocking=True) is dst
        return dst

    a, d, want, dst = _issued_in_flight(issue)
    if read == "synchronize":
        torch.tpu.synchronize()
        got = dst
    elif read == "to_device":
        got = dst.to("tpu", non_blocking=True).cpu()
    else:
        got = torch.empty(a.shape, device="tpu")
        got.copy_(dst, non_blocking=True)
        got = got.cpu()
    assert_same(got, want, rtol=1e-4, atol=1e-5, device="cpu")
    torch.tpu.synchronize()
    assert_same(dst, want, rtol=1e-4, atol=1e-5, device="cpu")


def test_non_blocking_copy_into_other_host_memory_blocks(mode):
    """Where the copy thread cannot write the destination in place (pageable memory, a
    cast, a strided or broadcast destination), copy_ with non_blocking=True copies before it
    returns, as CUDA does from pageable memory: the value is right with no synchronization."""
    x = torch.randn(6, 8)
    t = x.to("tpu")
    pageable = torch.empty(6, 8)
    pageable.copy_(t * 2, non_blocking=True)
    assert_same(pageable, x * 2, rtol=0, atol=0, device="cpu")
    cast = torch.empty(6, 8, dtype=torch.float64).pin_memory()
    cast.copy_(t - 1, non_blocking=True)
    assert_same(cast, (x - 1).double(), rtol=0, atol=0, device="cpu")
    strided = torch.empty(8, 6).pin_memory().t()
    strided.copy_(t + 3, non_blocking=True)
    assert_same(strided, x + 3, rtol=0, atol=0, device="cpu")
    broadcast = torch.empty(6, 8).pin_memory()
    broadcast.copy_(t[0], non_blocking=True)
    assert_same(broadcast, x[0].expand(6, 8), rtol=0, atol=0, device="cpu")
    half = torch.empty(6, 8, dtype=torch.bfloat16).pin_memory()
    half.copy_(t.bfloat16(), non_blocking=True)  # same dtype, a bitcast numpy view
    torch.tpu.synchronize()
    assert_same(half, x.bfloat16(), rtol=0, atol=0, device="cpu")


def test_non_blocking_copies_under_gc_stress(mode):
    """Tensors on both sides die inside garbage collection (reference cycles), collected on
    this thread and on another one, while non-blocking copies land on the copy thread; the
    storage release callbacks run in the middle of all that (a segfault when they called
    into JAX, fixed in 41b2c52, was what backed the asynchronous copy out in 9924c7b)."""
    import gc
    import threading

    stop = threading.Event()

    def collect():
        while not stop.wait(0.002):
            gc.collect(1)  # the young generations, where the cycles below are

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        kept = []
        for i in range(40):
            x = torch.randn(32, 16)
            t = x.to("tpu")
            cycle = [t * 2, torch.randn(64).pin_memory(), _frame_holding(t, i)]
            cycle.append(cycle)  # freed only by the collector
            dropped = (t * 3).to("cpu", non_blocking=True)  # dropped before it lands
            del dropped, cycle
            kept.append((x, (t.t() @ t + i).to("cpu", non_blocking=True)))
            storage_copy = t.untyped_storage().cpu()  # a blocking storage read on the way
            assert storage_copy.nbytes() == x.nbytes
            if i % 10 == 0:
                gc.collect(1)  # (a full collection costs ~0.4 s with torch and jax loaded)
    finally:
        stop.set()
        collector.join()
    torch.tpu.synchronize()
    for i, (x, out) in enumerate(kept):
        assert out.is_pinned()
        assert_same(out, x.t() @ x + i, rtol=1e-5, atol=1e-5, device="cpu")


def _frame_holding(t, i):
    """An exception whose traceback keeps this frame (and its tpu tensors) alive: the
    collector frees them while clearing the frame, as pytest.raises leaves them."""
    y = (t + i).untyped_storage()
    z = y.clone()
    try:
        raise ValueError(z.nbytes())
    except ValueError as e:
        return e


@pytest.mark.slow
def test_pinned_memory_then_serialization_in_one_process():
    """The order that crashed before (9924c7b): this file's tests, then test_serialization's,
    in one process."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
         os.path.join(here, "test_pinned_memory.py"), os.path.join(here, "test_serialization.py")],
        capture_output=True, text=True, timeout=900, cwd=os.path.dirname(here))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
