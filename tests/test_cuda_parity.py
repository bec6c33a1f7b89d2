"""torch.tpu / torch.accelerator / torch.Event behave as torch.cuda's do (issue 15).

Where CPU PyTorch has the same API (torch.accelerator on a CPU-only build, torch.Event on
"cpu"), the tpu result is compared with it; the rest follows torch.cuda's documented
contract (return types, key names, exception classes)."""
import collections
import contextlib
import time

import pytest
import torch

import torchtpu
from conftest import assert_same
from torchtpu.runtime import inflight, storage


@pytest.fixture(params=["strict", "defer_and_fuse"])
def mode(request):
    with torchtpu.eager_mode(request.param):
        yield request.param


def _dispatch(t: torch.Tensor):
    """The device array behind `t`, its program dispatched but not waited for."""
    from torchtpu.eager import deferred

    deferred.flush("test")
    return storage.lookup(t).buf


def _slow_product(n=900):
    a = torch.randn(n, n, device="tpu")
    (a @ a @ a).sum().item()  # compile both programs first
    torch.tpu.synchronize()
    return a


@pytest.mark.parametrize("sync", ["tpu", "accelerator", "stream"])
def test_synchronize_waits_for_dropped_results(mode, sync):
    a = _slow_product()
    y = a @ a @ a @ a
    arr = _dispatch(y)
    del y  # nobody holds the result any more; its program may still be running
    if arr.is_ready():
        pytest.skip("the device finished before the result was dropped")
    assert inflight.parked() >= 1
    {"tpu": torch.tpu.synchronize, "accelerator": torch.accelerator.synchronize,
     "stream": lambda: torch.tpu.current_stream().synchronize()}[sync]()
    assert arr.is_ready()
    assert inflight.parked() == 0


@pytest.mark.parametrize("overwrite", ["zero_", "copy_host", "storage_copy_host", "mm_out"])
def test_synchronize_waits_for_work_an_inplace_overwrite_replaced(mode, overwrite):
    # a whole overwrite does not need the old buffer, and the overwritten tensor is then
    # dropped: synchronize still waits for both the old buffer's program and the overwrite.
    # A program's output waits for all its inputs, the old buffer included; a transfer from
    # the host waits for nothing, so the replaced buffer must be kept (inflight.replaced)
    a = _slow_product()
    y = a @ a @ a @ a
    old = _dispatch(y)
    if old.is_ready():
        pytest.skip("the device finished before the overwrite was dispatched")
    if overwrite == "zero_":
        y.zero_()
    elif overwrite == "copy_host":
        y.copy_(torch.ones(y.shape))
    elif overwrite == "storage_copy_host":
        y.untyped_storage().copy_(torch.ones(y.shape).untyped_storage())
    else:
        torch.mm(a @ a, a, out=y)
    new = _dispatch(y)
    del y
    torch.tpu.synchronize()
    assert old.is_ready() and new.is_ready()
    assert inflight.parked() == 0


def test_event_elapsed_time_measures_device_completion(mode):
    a = _slow_product()
    start, end = torch.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert start.device == torch.device("tpu") and isinstance(end, torch.Event)
    t0 = time.perf_counter()
    start.record()
    y = a @ a @ a @ a
    end.record()
    dispatched = time.perf_counter() - t0
    arr = _dispatch(y)
    end.synchronize()
    assert arr.is_ready() and end.query() and start.query()
    ms = start.elapsed_time(end)
    ran = time.perf_counter() - t0
    assert isinstance(ms, float)
    # the host only dispatched; the event saw the device finish the three matmuls
    assert ms / 1000 > dispatched
    assert 0.5 * ran <= ms / 1000 <= ran + 0.05


def test_event_errors_and_untimed_events():
    e, f = torch.Event(device="tpu"), torch.Event(device="tpu")
    assert e.query()  # nothing recorded: complete, as on CUDA
    e.record()
    f.record()
    e.wait()
    f.synchronize()
    with pytest.raises(ValueError, match="enable_timing"):
        e.elapsed_time(f)
    s, t = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        s.elapsed_time(t)
    # other devices keep PyTorch's own events, errors included
    c = torch.Event(device="cpu")
    with pytest.raises(RuntimeError):
        c.record()


def test_stream_api_shape():
    s = torch.tpu.current_stream()
    assert s.device == torch.device("tpu", 0) and s == torch.tpu.default_stream()
    with torch.tpu.stream(torch.tpu.Stream()) as inner:
        x = torch.ones(3, device="tpu") * 2
        ev = inner.record_event()
    torch.tpu.current_stream().wait_event(ev)
    torch.tpu.current_stream().wait_stream(inner)
    ev.synchronize()
    assert ev.query() and s.query()
    assert torch.accelerator.current_stream().device_type == s.device_type
    assert_same(x, torch.full((3,), 2.0))


def test_generic_stream_without_an_index_is_on_the_current_device():
    # torch.Stream(device="cuda") is on the current device (index 0), not index -1
    for s in (torch.Stream(device="tpu"), torch.accelerator.current_stream()):
        assert s.device_index == 0
        assert s.device == torch.device("tpu", 0)
    with torch.Stream(device="tpu") as s:
        assert torch.accelerator.current_stream().device_index == 0
        assert_same(torch.ones(2, device="tpu") + 1, torch.full((2,), 2.0))
    s.synchronize()


def test_memory_api(mode):
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    x = torch.ones(1024, 256, device="tpu")
    x.sum().item()
    assert torch.tpu.memory_allocated() - base == x.nbytes
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_allocated() >= base + x.nbytes
    assert torch.accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated()
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    stats = torch.tpu.memory_stats()
    assert isinstance(stats, collections.OrderedDict)
    assert stats == torch.accelerator.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "active_bytes.all.current", "num_ooms"):
        assert isinstance(stats[key], int), key
    del x
    assert torch.tpu.memory_allocated() == base
    torch.accelerator.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base
    torch.tpu.empty_cache()
    torch.accelerator.empty_cache()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert torch.accelerator.get_memory_info()[1] == total
    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and isinstance(summary, str)


def test_device_queries():
    name = torch.tpu.get_device_name()
    assert name != "cpu:cpu" and (name.startswith("XLA:") or torchtpu.platform() != "cpu")
    assert torch.tpu.get_device_name(0) == torch.tpu.get_device_name("tpu:0") == name
    props = torch.tpu.get_device_properties()
    assert props.name == name and props.platform == torchtpu.platform()
    assert props.total_memory > 0 and props.multi_processor_count >= 1
    cap = torch.tpu.get_device_capability()
    assert isinstance(cap, tuple) and len(cap) == 2 and (props.major, props.minor) == cap
    assert torch.float32 in torch.accelerator.get_device_capability()["supported_dtypes"]
    assert torch.accelerator.current_device_index() == 0
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    with pytest.raises(ValueError):
        torch.tpu.get_device_properties("cpu")
    with pytest.raises(AssertionError):
        torch.tpu.get_device_name(3)


def test_default_torch_compile_uses_the_tpu_backend(mode):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("tpu")
    model.load_state_dict(ref.state_dict())
    ref(x).square().sum().backward()
    torchtpu.reset_metrics()
    torch._dynamo.reset()
    compiled = torch.compile(model)  # no backend argument: Inductor's default for other devices
    out = compiled(x.to("tpu"))
    out.square().sum().backward()
    m = torchtpu.metrics()
    assert m["dynamo_graphs"] == 1 and m["compile_graphs"] == 2  # forward and backward, ours
    assert out.device.type == "tpu"
    assert_same(out, ref(x))
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_same(p.grad, q.grad)


def _profiled(device, tmp_path):
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(128, 128).to(device)
    w = torch.randn(128, 128).to(device)
    (x @ w).relu().sum().cpu()  # warm-up: compiles outside the profile, as one would with CUDA
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device == "tpu" else [])
    with profile(activities=acts) as prof:
        (x @ w).relu().sum().cpu()
    path = tmp_path / f"{device}.json"
    prof.export_chrome_trace(str(path))
    import json

    return prof, json.loads(path.read_text())


def test_profiler_records_device_time_per_program(mode, tmp_path):
    cpu_prof, _ = _profiled("cpu", tmp_path)
    prof, trace = _profiled("tpu", tmp_path)
    cpu_ops = {e.name for e in cpu_prof.events()}
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert device and len(kernels) == len(device)
    assert all(e.time_range.elapsed_us() > 0 for e in device) and all(k["dur"] > 0 for k in kernels)
    names = " ".join(e.name for e in device)
    for op in ("aten::mm", "aten::relu", "aten::sum"):
        assert op in cpu_ops and op in names  # the ops CPU's profile names, with their device time
    assert {k["name"] for k in kernels} == {e.name for e in device}
    assert prof.key_averages().self_cpu_time_total > 0
    assert sum(e.self_device_time_total for e in prof.key_averages()) > 0
    if mode == "strict":  # each op's own program is a kernel of that op, as CUDA's are
        mm = [e for e in prof.key_averages() if e.key == "aten::mm" and e.self_device_time_total > 0]
        assert mm


_ALIVE_AT_EXIT = """
import torch, torchtpu
x = torch.randn(4, 5, device="tpu")
view = x[1:, 2:]
storage = torch.ones(3, device="tpu").untyped_storage()
raw = torch.UntypedStorage(16, device="tpu")
model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(x).sum().backward()
opt.step()
with torch.autocast("tpu", dtype=torch.bfloat16):
    amp_out = model(x)  # the parameters' casts stay in autocast's weak cache
on_dev = torch.randn(6).pin_memory().to("tpu", non_blocking=True)
back = (x * 2).to("cpu", non_blocking=True)
unflushed = x @ x.T  # defer_and_fuse: recorded, never run
grown = torch.cat([x, x])
gen = torch.Generator(device="tpu").manual_seed(1)
drawn = torch.rand(3, device="tpu", generator=gen)
ev = torch.tpu.Event(enable_timing=True)
ev.record()
print("reached the end")
"""


@pytest.mark.slow  # a fresh interpreter importing torchtpu: seconds
@pytest.mark.parametrize("eager_mode", ["strict", "defer_and_fuse"])
def test_tpu_objects_alive_at_interpreter_exit_exit_quietly(eager_mode):
    """Storages, views, a model with optimizer state, autocast casts, pending copies still
    alive when the interpreter exits: their release callbacks run after module globals were
    cleared, and printed "Exception ignored in ... 'NoneType' object is not callable"."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHTPU_EAGER_MODE=eager_mode)
    proc = subprocess.run([sys.executable, "-c", _ALIVE_AT_EXIT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout == "reached the end\n"
    assert proc.stderr == ""
    assert proc.returncode == 0


@pytest.fixture
def sync_mode():
    yield
    torch.tpu.set_sync_debug_mode("default")


def _synced(fn) -> int:
    """How many sync warnings running `fn` raised."""
    import warnings

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
    return sum("synchronizing tpu operation" in str(w.message) for w in got)


def test_sync_debug_mode_flags_what_makes_the_host_wait(mode, sync_mode):
    x = torch.tensor([0.0, 1.0, 0.0, 3.0], device="tpu")
    assert torch.tpu.get_sync_debug_mode() == 0
    assert _synced(lambda: x.sum().item()) == 0
    torch.tpu.set_sync_debug_mode("warn")
    assert torch.tpu.get_sync_debug_mode() == 1
    for what in (lambda: x.sum().item(), lambda: x.cpu(), lambda: x.nonzero(), lambda: x[x > 0],
                 lambda: torch.unique(x), lambda: torch.equal(x, x), lambda: x.tolist()):
        assert _synced(what) == 1
    # device work alone, and an explicit synchronize (CUDA's is not flagged either), are not
    assert _synced(lambda: (x * 2 + 1, torch.tpu.synchronize())) == 0
    torch.tpu.set_sync_debug_mode(2)
    with pytest.raises(RuntimeError, match="called a synchronizing tpu operation"):
        x.cpu()
    torch.tpu.set_sync_debug_mode(0)
    assert_same(x, torch.tensor([0.0, 1.0, 0.0, 3.0]))
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        torch.tpu.set_sync_debug_mode("loud")
    with pytest.raises(RuntimeError, match="expected one of 0,1,2"):
        torch.tpu.set_sync_debug_mode(3)
    assert torch.tpu.get_sync_debug_mode() == 0


def test_the_rest_of_torch_cudas_names():
    import warnings

    for name in ("init", "OutOfMemoryError", "is_current_stream_capturing", "StreamContext",
                 "memory_stats_as_nested_dict", "reset_accumulated_memory_stats", "memory_cached",
                 "max_memory_cached", "reset_max_memory_cached", "device_memory_used",
                 "can_device_access_peer", "set_sync_debug_mode", "get_sync_debug_mode"):
        assert hasattr(torch.cuda, name) and hasattr(torch.tpu, name), name
    torch.tpu.init()
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.tpu.is_current_stream_capturing() is False
    s = torch.tpu.Stream()
    with torch.tpu.StreamContext(s) as entered:
        assert entered is s
    assert isinstance(torch.tpu.stream(s), torch.tpu.StreamContext)
    x = torch.ones(256, device="tpu")
    flat = torch.tpu.memory_stats()
    nested = torch.tpu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"] >= x.nbytes
    assert nested["num_ooms"] == flat["num_ooms"]
    torch.tpu.reset_accumulated_memory_stats()
    assert torch.tpu.memory_stats()["num_ooms"] == 0
    with pytest.warns(FutureWarning, match="renamed to torch.tpu.memory_reserved"):
        assert torch.tpu.memory_cached() == torch.tpu.memory_reserved()
    with pytest.warns(FutureWarning):
        assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.tpu.reset_max_memory_cached()
    free, total = torch.tpu.mem_get_info()
    assert 0 < torch.tpu.device_memory_used() <= total
    assert torch.tpu.can_device_access_peer(0, 0) is False  # (a CUDA device is not its own peer)
    with pytest.raises(AssertionError, match="Invalid peer device id"):
        torch.tpu.can_device_access_peer(0, torch.tpu.device_count())


def test_submodules_import_as_torch_cudas():
    # `from torch.cuda.amp import GradScaler` and friends, with "cuda" changed to "tpu"
    import importlib

    for sub, names in (("memory", ("memory_allocated", "host_memory_stats", "mem_get_info")),
                       ("random", ("get_rng_state", "manual_seed", "initial_seed")),
                       ("streams", ("Stream", "Event")),
                       ("amp", ("autocast", "GradScaler", "custom_fwd", "custom_bwd"))):
        cuda_sub = importlib.import_module(f"torch.cuda.{sub}")
        tpu_sub = importlib.import_module(f"torch.tpu.{sub}")
        assert getattr(torch.tpu, sub) is tpu_sub
        for n in names:
            assert hasattr(cuda_sub, n) and hasattr(tpu_sub, n), (sub, n)
    x = torch.ones(64, device="tpu")
    assert torch.tpu.memory.memory_allocated("tpu:0") == torch.tpu.memory_allocated() >= x.nbytes
    torch.tpu.random.manual_seed(7)
    a = torch.rand(4, device="tpu")
    torch.manual_seed(7)
    assert torch.equal(a.cpu(), torch.rand(4, device="tpu").cpu())
    assert "default_generators" in dir(torch.tpu)


def test_deprecated_amp_names_are_torch_amps_on_tpu():
    from torch.tpu.amp import GradScaler, autocast, custom_bwd, custom_fwd

    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(4, 8, device="tpu")
    with pytest.warns(FutureWarning, match=r"torch.amp.autocast\('tpu'"):
        ctx = autocast(dtype=torch.bfloat16)
    with ctx:
        got = m(x)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        want = m(x)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got.cpu(), want.cpu())
    with pytest.warns(FutureWarning):
        assert autocast().fast_dtype == torch.float16  # torch.cuda.amp.autocast's default

    class Scaled(torch.autograd.Function):
        @staticmethod
        @custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, t):
            return t * 2

        @staticmethod
        @custom_bwd
        def backward(ctx, g):
            return g * 2

    with pytest.warns(FutureWarning):  # (the decorators above warned at class creation)
        custom_fwd(lambda ctx, t: t)
    h = torch.ones(3, device="tpu", dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = Scaled.apply(h)
    assert out.dtype == torch.float32  # cast_inputs: run in float32 with autocast off
    out.sum().backward()
    assert torch.equal(h.grad.cpu(), torch.full((3,), 2.0, dtype=torch.bfloat16))

    # GradScaler: the same steps as torch.amp.GradScaler("tpu"), an overflow skipped alike
    results = []
    for deprecated, make in ((True, lambda: GradScaler(init_scale=4.0, growth_interval=1)),
                             (False, lambda: torch.amp.GradScaler("tpu", init_scale=4.0, growth_interval=1))):
        torch.manual_seed(1)
        lin = torch.nn.Linear(4, 1).to("tpu")
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        with pytest.warns(FutureWarning) if deprecated else contextlib.nullcontext():
            scaler = make()
        for inp in (torch.ones(2, 4), torch.full((2, 4), float("inf")), torch.ones(2, 4)):
            opt.zero_grad()
            scaler.scale(lin(inp.to("tpu")).sum()).backward()
            scaler.step(opt)
            scaler.update()
        results.append((scaler.get_scale(), lin.weight.detach().cpu()))
    assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])


def test_host_memory_stats_count_pinned_blocks():
    before = torch.tpu.host_memory_stats()
    keys = {"allocations.current", "allocations.peak", "allocated_bytes.allocated", "active_requests.freed",
            "active_bytes.current", "num_host_alloc", "num_host_free", "host_alloc_time.avg",
            "host_free_time.count"}
    assert keys <= set(before) and list(before) == sorted(before)
    assert all(isinstance(v, int) for v in before.values())
    x = torch.empty(1000, dtype=torch.float32).pin_memory()
    s = torch.tpu.host_memory_stats()
    assert s["allocations.current"] == before["allocations.current"] + 1
    assert s["allocated_bytes.current"] >= before["allocated_bytes.current"] + x.nbytes
    assert s["num_host_alloc"] == before["num_host_alloc"] + 1 and s["host_alloc_time.count"] >= 1
    nested = torch.tpu.host_memory_stats_as_nested_dict()
    assert nested["allocations"]["current"] == s["allocations.current"]
    del x
    import gc

    gc.collect()
    s2 = torch.tpu.host_memory_stats()
    assert s2["allocations.current"] == before["allocations.current"]
    assert s2["num_host_free"] == before["num_host_free"] + 1
    assert s2["allocations.peak"] >= before["allocations.current"] + 1
    torch.tpu.reset_peak_host_memory_stats()
    assert torch.tpu.host_memory_stats()["allocations.peak"] == s2["allocations.current"]
    torch.tpu.reset_accumulated_host_memory_stats()
    s3 = torch.tpu.host_memory_stats()
    assert s3["num_host_alloc"] == s3["num_host_free"] == s3["host_alloc_time.count"] == 0
    assert s3["allocations.current"] == s2["allocations.current"]
