"""A strict op's cache hit served in one C++ call (csrc/hit.cpp, eager/executor.fast_path):
results, in-place writes, strides, counters, storage lifetimes and the cases it must hand to
the Python path (a pending input, the profiler, a matmul precision change), against CPU."""
import gc
import threading

import jax
import pytest
import torch

import torchtpu
from conftest import EAGER_MODES, assert_same, to_tpu
from torchtpu.eager import executor
from torchtpu.runtime import storage

pytestmark = pytest.mark.skipif(executor._fast is None, reason="the C++ extensions were not built")

_DTYPES = [torch.float32, torch.bfloat16, torch.complex64, torch.int64, torch.bool]


def _native_hits() -> int:
    return torchtpu.metrics().get("native_hits", 0)


def _inputs(dtype):
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        return torch.rand(5, 4, generator=g) > 0.5, torch.rand(5, 4, generator=g) > 0.5
    if dtype == torch.int64:
        return torch.randint(-9, 9, (5, 4), generator=g), torch.randint(1, 9, (5, 4), generator=g)
    return torch.randn(5, 4, generator=g).to(dtype), torch.randn(5, 4, generator=g).to(dtype)


_FUNCTIONAL = [
    ("add", lambda x, y: x + y),
    ("mul scalar", lambda x, y: x * 3),
    ("transposed (strided result)", lambda x, y: x.t() + y.t()),
    ("offset views", lambda x, y: x[1:3] + y[2:4]),
    ("where", lambda x, y: torch.where(x == y, x, y)),
    ("stack (a list in)", lambda x, y: torch.stack([x, y, x])),
    ("unbind (a tuple out)", lambda x, y: torch.unbind(x.t() + y.t())),
    ("split (a list out)", lambda x, y: (x + y).split([2, 3])),
]


@torchtpu.eager_mode("strict")
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("name,fn", _FUNCTIONAL, ids=[n for n, _ in _FUNCTIONAL])
def test_functional_hits_match_cpu(name, fn, dtype):
    x, y = _inputs(dtype)
    if dtype == torch.bool and name == "mul scalar":
        pytest.skip("CPU: a bool tensor times an int is an int64 result; covered by add")
    want = fn(x, y)
    tx, ty = to_tpu((x, y))
    before = _native_hits()
    for _ in range(3):  # the first call compiles; the next two are hits
        assert_same(fn(tx, ty), want, rtol=0, atol=0, check_stride=True)
    assert _native_hits() > before


@torchtpu.eager_mode("strict")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.int64], ids=str)
def test_in_place_hits_write_the_tensor_and_return_it(dtype):
    x, y = _inputs(dtype)
    tx, ty = to_tpu((x, y))
    before = _native_hits()
    for _ in range(3):
        got = tx.add_(ty)
        x.add_(y)
        assert got is tx
        # into a view (a row whose bucket would leave the 5x4 storage: written exact, so its
        # quick key finds the exact program and it is a hit too from the second call)
        row = tx[2].mul_(2)
        x[2].mul_(2)
        assert row._base is tx
        assert_same(tx, x, rtol=0, atol=0)
    assert _native_hits() == before + 4  # the second and third add_ and mul_


@torchtpu.eager_mode("strict")
def test_results_of_hits_free_their_storage():
    x = torch.randn(64, 64, device="tpu")
    y = torch.randn(64, 64, device="tpu")
    (x + y).sum()
    torch.tpu.synchronize()
    gc.collect()  # an earlier test's garbage freed now, not in the middle of the counting
    base = torch.tpu.memory_allocated()
    live = storage.live_buffers()
    kept = [x + y for _ in range(10)]
    assert torch.tpu.memory_allocated() == base + 10 * 64 * 64 * 4
    assert storage.live_buffers() == live + 10
    del kept
    assert torch.tpu.memory_allocated() == base
    assert storage.live_buffers() == live
    assert torch.tpu.max_memory_allocated() >= base + 10 * 64 * 64 * 4
    torch.tpu.synchronize()  # the dropped results' buffers were parked, and are waited for


@torchtpu.eager_mode("strict")
def test_hits_from_two_threads_count_their_bytes():
    x = torch.randn(32, 32, device="tpu")
    (x * 2).sum()
    gc.collect()  # an earlier test's garbage freed now, not in the middle of the counting
    base = torch.tpu.memory_allocated()
    out, errors = {}, []

    def work(k):
        try:
            acc = torch.zeros(32, 32, device="tpu")
            for _ in range(200):
                acc = acc + x * 2
            out[k] = acc
        except Exception as e:  # (a thread's error would otherwise only be printed)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    want = (x.cpu() * 2) * 200
    for k in range(2):
        assert_same(out[k], want, rtol=1e-5, atol=1e-4)
    assert torch.tpu.memory_allocated() == base + 2 * 32 * 32 * 4
    out.clear()
    assert torch.tpu.memory_allocated() == base


def test_defer_and_fuse_records_a_planned_signature():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    tx, ty = to_tpu((x, y))
    with torchtpu.eager_mode("strict"):
        for _ in range(2):
            tx + ty  # the signature's plan is made
    with torchtpu.eager_mode("defer_and_fuse"):
        before = _native_hits()
        p = tx + ty  # recorded (found by its quick key), not run
        q = p * 2
        assert _native_hits() == before
        assert_same(q, (x + y) * 2, rtol=0, atol=0)


@torchtpu.eager_mode("strict")
def test_under_the_profiler_hits_are_timed_by_the_python_path():
    x = torch.randn(8, 8, device="tpu")
    for _ in range(2):
        x - x
    before = _native_hits()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            x - x
    assert _native_hits() == before
    assert any("sub" in e.name for e in prof.events())
    x - x
    assert _native_hits() == before + 1


@torchtpu.eager_mode("strict")
def test_a_matmul_precision_change_reaches_jax_before_a_hit():
    a = torch.randn(8, 8, device="tpu")
    old = torch.get_float32_matmul_precision()
    try:
        for _ in range(2):
            a @ a
        torch.set_float32_matmul_precision("medium")
        a @ a
        assert jax.config.jax_default_matmul_precision == "default"  # (one bf16 pass)
        torch.set_float32_matmul_precision("highest")
        a @ a
        assert jax.config.jax_default_matmul_precision == "highest"
    finally:
        torch.set_float32_matmul_precision(old)


@torchtpu.eager_mode("strict")
def test_metrics_count_a_hit_as_the_python_path_does():
    x = torch.randn(3, 3, device="tpu")
    x.abs()
    m = torchtpu.metrics()
    x.abs()
    n = torchtpu.metrics()
    assert n["cache_hits"] == m["cache_hits"] + 1
    assert n["executions"] == m["executions"] + 1
    assert n["compiles"] == m["compiles"]
    assert n["native_hits"] == m.get("native_hits", 0) + 1



@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_planned_call_runs_no_python_of_ours(mode, gate_open):
    # the op's registered kernel is csrc/kernel.h's, calling fast() itself: a planned strict hit
    # or defer_and_fuse record runs no torchtpu Python function (alpha's check is one: add
    # runs it, as CPU checks alpha; mul has none)
    import sys

    x, y = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
    ran = []

    def profile(frame, event, arg):
        if event == "call" and "torchtpu" in frame.f_code.co_filename:
            ran.append(frame.f_code.co_name)

    with torchtpu.eager_mode(mode):
        for _ in range(3):  # planned by now
            z = x * y
        sys.setprofile(profile)
        try:
            z = x * y
        finally:
            sys.setprofile(None)
        assert ran == []
        assert_same(z, x.cpu() * y.cpu())
        with pytest.raises(RuntimeError, match="alpha must not be a floating point"):
            torch.add(x.int(), y.int(), alpha=1.5)  # the op's check, run from C++

def test_random_and_own_path_ops_take_the_python_path():
    from torchtpu.ops.registry import LOWERINGS
    assert executor.fast_path(LOWERINGS["add.Tensor"]) is not None
    for name in ("cat", "arange", "index_select", "embedding"):
        low = LOWERINGS.get(name) or next(v for k, v in LOWERINGS.items() if k.startswith(name + "."))
        assert executor.fast_path(low) is None, name
    random = next(v for v in LOWERINGS.values() if v.random)
    assert executor.fast_path(random) is None


# ---- compiled graphs -----------------------------------------------------------------------

def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu", dynamic=False)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_compiled_graph_calls_served_in_cpp_match_cpu(dtype):
    x, y = _inputs(dtype)
    # a bool result, a transposed (strided) one, a slice of an intermediate, an input view
    # (handed out by the Python path's plan: the graph then is not native, still right)
    fn = _compiled(lambda a, b: ((a == b) | (a != a), a.t() + b.t(), (a + b)[1:3]))
    want = ((x == y) | (x != x), x.t() + y.t(), (x + y)[1:3])
    tx, ty = to_tpu((x, y))
    before = _native_hits()
    for _ in range(3):
        assert_same(fn(tx, ty), want, rtol=0, atol=0, check_stride=True)
    assert _native_hits() >= before + 2
    view = _compiled(lambda a, b: (a.t(), a + b))
    for _ in range(3):
        assert_same(view(tx, ty), (x.t(), x + y), rtol=0, atol=0, check_stride=True)


def test_compiled_graph_hits_on_views_at_offsets_and_repeated_outputs():
    x = torch.randn(6, 5)
    fn = _compiled(lambda a, b: (a * 2, b + 1, a * 2))
    tx = x.to("tpu")
    before = _native_hits()
    for i in range(3):
        a, b = tx[1:4], tx[2]  # views at nonzero offsets: runtime values of the program
        got = fn(a, b)
        assert_same(got, (x[1:4] * 2, x[2] + 1, x[1:4] * 2), rtol=0, atol=0)
    assert _native_hits() >= before + 2


def test_compiled_graph_that_writes_its_input_keeps_the_python_path():
    x = torch.randn(4, 4)
    fn = _compiled(lambda a: a.add_(1))
    tx = x.clone().to("tpu")
    before = _native_hits()
    for _ in range(3):
        out = fn(tx)
        x.add_(1)
        assert_same(tx, x, rtol=0, atol=0)
        assert_same(out, x, rtol=0, atol=0)
    assert _native_hits() == before


def test_compiled_graph_training_step_with_native_forward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    model.to("tpu")
    step = _compiled(lambda inp: model(inp).square().mean())
    data = torch.randn(5, 8)
    for _ in range(3):
        model.zero_grad()
        ref.zero_grad()
        loss = step(data.to("tpu"))
        loss.backward()
        want = ref(data).square().mean()
        want.backward()
        assert_same(loss, want, rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-6)


@torchtpu.eager_mode("strict")
def test_dropped_results_are_let_go_once_finished():
    from torchtpu.runtime import inflight
    x = torch.randn(8, 8, device="tpu")
    (x + x).sum()
    torch.tpu.synchronize()
    for _ in range(300):
        y = x + x
        torchtpu.to_jax(y).block_until_ready()
        del y  # parked when dropped (finished here); the next new storage lets it go
    assert len(inflight.parked_buffers) <= 2


@torchtpu.eager_mode("strict")
@pytest.mark.parametrize("mask", [[True, True, True], [True, False, True], [False, True, False]], ids=str)
def test_masked_outputs_on_a_hit_are_none_as_on_cpu(mask):
    g = torch.Generator().manual_seed(3)
    x, gy = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    w, b = torch.randn(6, generator=g), torch.randn(6, generator=g)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [6], w, b, 1e-5)
    args = (gy, x, [6], mean, rstd, w, b, mask)
    want = torch.ops.aten.native_layer_norm_backward(*args)
    before = _native_hits()
    for _ in range(3):
        got = torch.ops.aten.native_layer_norm_backward(*to_tpu(args))
        assert [r is None for r in got] == [r is None for r in want]
        assert_same([r for r in got if r is not None], [r for r in want if r is not None], rtol=1e-5, atol=1e-6)
    assert _native_hits() >= before + 2


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_calls_beside_a_dynamic_tensor_stay_native(mode, monkeypatch, gate_open):
    """While a dynamic tensor lives, calls over other tensors are served in C++ as before;
    only calls over the dynamic one reach the interceptor, which runs them in its bucket."""
    from torchtpu.eager import executor

    _beside_a_dynamic_tensor(mode, monkeypatch, executor)


def _beside_a_dynamic_tensor(mode, monkeypatch, executor):
    x, y = _inputs(torch.float32)
    d = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    tx, ty = to_tpu((x, y))
    with torchtpu.eager_mode(mode):
        td = torchtpu.mark_dynamic(d.to("tpu"), 0)
        tx + ty, td * 2  # (compiled, planned)
        seen = []
        inner = executor.dynamic
        monkeypatch.setattr(executor, "dynamic", lambda low, *a: seen.append(low.name) or inner(low, *a))
        for _ in range(3):
            assert_same(tx + ty, x + y, rtol=0, atol=0)
            assert_same(td * 2, d * 2, rtol=0, atol=0)
    assert seen == ["mul.Tensor"] * 3, seen


def _backend_compiles():
    from jax import monitoring

    seen = []

    def listen(event, secs, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(secs)

    monitoring.register_event_duration_secs_listener(listen)
    return seen, listen


@torchtpu.eager_mode("strict")
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_hits_call_the_executable_and_compile_nothing_more(dtype, gate_open):
    """A planned hit runs the executable jax.jit compiled at the first call (runtime/direct.py):
    planning it asks JAX's caches, never XLA, and its results are CPU's."""
    from jax._src import monitoring as _monitoring

    x, y = _inputs(dtype)
    x, y = x[:, :3].contiguous(), y[:, :3].contiguous()  # (a shape no other test here compiles)
    tx, ty = to_tpu((x, y))
    seen, listen = _backend_compiles()
    try:
        before = _native_hits()
        for _ in range(4):
            assert_same(tx - ty if dtype != torch.bool else tx ^ ty, x - y if dtype != torch.bool else x ^ y,
                        rtol=0, atol=0)
        assert _native_hits() >= before + 3
        assert len(seen) <= 1  # the first call's compile (none when an earlier test compiled it)
    finally:
        _monitoring.unregister_event_duration_listener(listen)
    name = "bitwise_xor" if dtype == torch.bool else "sub"
    plans = [c.hit for k, c in executor._quick.items() if str(k[0][0]).startswith(name) and c.hit]
    assert any(p[6] is not None for p in plans)


@torchtpu.eager_mode("strict")
@pytest.mark.parametrize("value", [0.5, 0.0, float("nan"), -0.0, 2.0, float("inf")])
def test_hits_with_scalars_packed_on_the_host_match_cpu(value, gate_open):
    """A float scalar of zero or NaN is packed per call as a host array (scalars.pack_cached
    keeps no device copy of it): the hit hands that call to the jitted function, which takes
    host arrays, and the others to the executable."""
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    tx = x.to("tpu")
    for _ in range(3):
        assert_same(tx.mul(value).add(value), x.mul(value).add(value), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int64], ids=str)
def test_compiled_graph_hits_call_the_planned_executable(dtype, monkeypatch, gate_open):
    from torchtpu.runtime import direct

    made = []
    real = direct.plan

    def plan(fn, args):
        made.append(real(fn, args))
        return made[-1]

    monkeypatch.setattr(direct, "plan", plan)
    x, y = _inputs(dtype)
    x, y = x[:3], y[:3]  # (a shape of its own: this graph compiles here)
    f = torch.compile(lambda a, b: a * b - a, backend="tpu")
    tx, ty = to_tpu((x, y))
    for _ in range(3):
        assert_same(f(tx, ty), x * y - x)  # (XLA may fuse a * b - a: an ulp from CPU's)
    assert any(p is not None for p in made)
