"""Bounded memory for compiled programs: the executable caches are LRUs whose evictions
really release the compiled code (JAX's own compile cache, weak-keyed on our jit
wrappers, shrinks with ours; resident memory stays flat once the bound is reached)."""
import pytest
import torch
from jax._src.interpreters import pxla

import torchtpu
from conftest import assert_same
from torchtpu.eager import executor
from torchtpu.runtime import cache, executables, lowerings


def _heap_mb() -> float:
    return cache.heap_in_use() / 2**20


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.fixture
def bound():
    old = torchtpu.executable_limit()

    def set_(**kw):
        torchtpu.set_executable_limit(**kw)

    yield set_
    torchtpu.set_executable_limit(**old)


def _live_jax_executables() -> int:
    return pxla._cached_compilation.cache_info().currsize


def _shapes(n_shapes, start=1):
    """One op (x * 2) over `n_shapes` distinct shapes; returns (resident MB after the
    first tenth, peak resident MB after it)."""
    x0 = torch.ones(1, device="tpu")
    base = peak = None
    for n in range(start, start + n_shapes):
        y = x0.expand(n) * 2
        if n - start == n_shapes // 10:
            y.cpu()
            base = peak = _rss_mb()
        elif base is not None and n % 16 == 0:
            peak = max(peak, _rss_mb())
    y.cpu()
    return base, max(peak, _rss_mb())


def test_op_cache_is_an_lru_whose_evictions_release_code(bound):
    torchtpu.clear_caches()
    # a bound of 16 evicts two at a time (an eighth): each eviction is a full gc in this big
    # process, so fewer rounds keep the test short
    bound(per_op=16, total=64)
    torchtpu.reset_metrics()
    _shapes(40)
    assert torchtpu.metrics()["executables_evicted"] >= 40 - 16
    mul = [k for k in executor._cache if k.op == "mul.Tensor"]
    assert len(mul) <= 16 and len(executor._cache) <= 64
    # the compiled code is gone too, not only our reference to it
    assert _live_jax_executables() <= 64 + 8
    # an evicted shape compiles again and computes the right thing
    x = torch.arange(3.0, device="tpu")
    assert_same(x * 2, torch.arange(3.0) * 2)
    # the most recently used entries survive: a hot op is not evicted by a shape storm
    hot = torch.ones(5, device="tpu")
    (hot + 1).cpu()
    torchtpu.reset_metrics()
    for n in range(100, 116):
        (hot + 1).cpu()  # used between the storm's shapes
        torch.ones(1, device="tpu").expand(n) * 2
    assert torchtpu.metrics()["compiles"] <= 16 + 2  # the storm's shapes, not the hot op again


def test_fused_region_cache_is_bounded(bound):
    torchtpu.clear_caches()
    bound(regions=4)
    torchtpu.reset_metrics()
    x = torch.randn(8, device="tpu")
    with torchtpu.eager_mode("defer_and_fuse"):
        for k in range(1, 11):  # ten different regions
            y = x
            for _ in range(k):
                y = y * 1.5 + 1
            y.cpu()  # read back: each its own region
    ref = x.cpu()
    for _ in range(10):
        ref = ref * 1.5 + 1
    assert_same(y, ref)
    assert len(executables.regions) <= 4
    assert torchtpu.metrics()["executables_evicted"] >= 6


def test_clear_caches_and_limit_api(bound):
    (torch.ones(3, device="tpu") * 3).cpu()
    torchtpu.clear_caches()
    assert executor.cache_size() == 0 and len(executables.regions) == 0
    assert_same(torch.ones(3, device="tpu") * 3, torch.full((3,), 3.0))
    with pytest.raises(ValueError, match="per_op"):
        torchtpu.set_executable_limit(per_op=0)
    with pytest.raises(ValueError, match="total_bytes"):
        torchtpu.set_executable_limit(total_bytes=0)
    bound(total=100, per_op=10, regions=7, total_bytes=3 << 20)
    assert torchtpu.executable_limit() == {"total": 100, "per_op": 10, "regions": 7, "total_bytes": 3 << 20}


@pytest.mark.slow
@pytest.mark.parametrize("n_shapes", [3000, 10000])
def test_many_shapes_of_one_op_keep_memory_flat(bound, n_shapes):
    """3,000 shapes grew the process by 3.2 GB with no bound; bounded, resident memory grows
    by < 400 MB and stays flat once the bound is reached."""
    torchtpu.clear_caches()
    bound(per_op=100, total=400)
    start_rss = _rss_mb()
    base, peak = _shapes(n_shapes)
    assert peak - start_rss < 400, (start_rss, base, peak)
    assert peak - base < 150, (base, peak)  # flat after the bound was reached
    assert _live_jax_executables() <= 400 + 8


def _sizes_of_one_op(n, start=1):
    """x * 2 over n sizes, each its own program."""
    x0 = torch.full((1,), 3.0, device="tpu")
    for k in range(start, start + n):
        y = x0.expand(k) * 2
    return y


def test_a_compiled_op_keeps_its_executable_not_jax_lowering():
    """JAX keeps every jit's lowering (its MLIR module and HLO) beside the executable: 1.2 of
    the 1.55 MB a one-op program held. Once compiled it is let go; later calls compile nothing."""
    from jax._src.pjit import _pjit_lower

    torchtpu.clear_caches()
    _sizes_of_one_op(2)
    before = _heap_mb()
    torchtpu.reset_metrics()
    _sizes_of_one_op(60, start=3)
    grown = _heap_mb() - before
    m = torchtpu.metrics()
    assert m["compiles"] >= 60 and m["lowerings_shed"] >= 60
    assert _pjit_lower.cache_info().currsize == 0
    # about 0.23 MB per program here (1.5 MB with the lowerings kept)
    assert grown < 60 * 0.6, grown
    torchtpu.reset_metrics()
    y = _sizes_of_one_op(60, start=3)
    assert torchtpu.metrics()["compiles"] == 0  # the C++ dispatch cache serves them all
    assert_same(y, torch.full((62,), 6.0))


def test_a_program_with_host_callbacks_keeps_its_lowering():
    """JAX runs a program with an ordered host callback from Python on every call: its
    lowering must stay, or each call would compile it again."""
    import jax
    import jax.numpy as jnp
    from jax import monitoring
    from jax._src import monitoring as _monitoring
    from jax.experimental import io_callback

    compiles = []

    def listen(event, secs, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(secs)

    monitoring.register_event_duration_secs_listener(listen)
    try:
        f = jax.jit(lambda x: io_callback(lambda v: v + 1, jax.ShapeDtypeStruct((3,), jnp.float32), x,
                                          ordered=True) * 2)
        x = jnp.zeros(3, jnp.float32)
        f(x)
        lowerings.shed()
        n = len(compiles)
        for _ in range(3):
            out = f(x)
            lowerings.shed()
        assert len(compiles) == n
        assert list(out) == [2.0, 2.0, 2.0]
    finally:
        _monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def strict():
    with torchtpu.eager_mode("strict"):  # each size its own op executable, run at once
        yield


def test_executables_are_bounded_in_bytes(bound, strict):
    """Past set_executable_limit(total_bytes=) the least recently used go, whatever their
    count; the bytes are measured at each compile, and the heap stays within the bound."""
    import weakref

    torchtpu.clear_caches()
    _sizes_of_one_op(2)
    bound(total_bytes=8 << 20)
    start = _heap_mb()
    torchtpu.reset_metrics()
    x0 = torch.full((1,), 3.0, device="tpu")
    first = None
    for k in range(3, 160):
        y = x0.expand(k) * 2
        if first is None:
            first = [weakref.ref(c) for k_, c in executor._cache.items() if k_.op == "mul.Tensor"]
    held = torchtpu.executable_memory()
    assert 0 < held <= 8 << 20
    assert torchtpu.metrics()["executables_evicted_for_bytes"] > 0
    assert len(executor._cache) < 150
    assert _heap_mb() - start < 2 * 8, (start, _heap_mb())
    assert first and all(r() is None for r in first)  # the oldest went, its executable with it
    assert_same(y, torch.full((159,), 6.0))
    torchtpu.clear_caches()
    assert torchtpu.executable_memory() == 0
