"""The strict executor finds a signature seen before by a quick key read off the tensors'
metadata (eager/op_args.scan) instead of building its Signature. Calls that differ only in
what the quick key must tell apart (aliasing, offsets, a number's type, the default dtype,
lists, modes) are interleaved, each served twice, against CPU."""
import pytest
import torch

import torchtpu
from conftest import assert_same, to_tpu
from torchtpu.eager import executor


def _served_twice(calls):
    """Run each (fn, args) on CPU and on tpu, the whole list twice over (the second pass is
    found by quick keys), comparing every tpu result with CPU's."""
    for _ in range(2):
        for fn, args in calls:
            assert_same(fn(*to_tpu(args)), fn(*args), rtol=0, atol=0)


@torchtpu.eager_mode("strict")
def test_aliasing_offsets_and_strides_are_told_apart():
    a = torch.randn(6, 4)
    b = torch.randn(6, 4)
    row = torch.randn(1, 4)
    calls = [
        (lambda x, y: x + y, (a, b)),
        (lambda x, y: x + x, (a, b)),                   # one storage read twice
        (lambda x, y: x[1:] + x[:-1], (a, b)),          # two views of one storage, one offset
        (lambda x, y: x[2:4] + y[3:5], (a, b)),         # both offsets nonzero (runtime values)
        (lambda x, y: x[0:2] + y[0:2], (a, b)),         # the same views at offset 0
        (lambda x, y: x[0:2] + y[4:6], (a, b)),
        (lambda x, y: x.t() + y.t(), (a, b)),           # transposed
        (lambda x, y: x[:, :2] + y[:, 2:], (a, b)),     # strided, offset
        (lambda x, y: x + y, (row, row.expand(3, 4).contiguous()[:1])),  # size-1 dims
    ]
    hits = torchtpu.metrics()["cache_hits"]
    _served_twice(calls)
    assert torchtpu.metrics()["cache_hits"] > hits


@torchtpu.eager_mode("strict")
def test_numbers_by_type_and_default_dtype():
    i = torch.arange(6).reshape(2, 3)
    f = torch.randn(2, 3)
    calls = [
        (lambda x: x * 2, (i,)),
        (lambda x: x * 2.5, (i,)),          # int tensor * float: a float result
        (lambda x: x * True, (i,)),
        (lambda x: x + 1j, (f,)),           # a complex number: a complex result
        (lambda x: x * (2 + 0j), (f,)),
        (lambda x: x.sum(0), (f,)),         # a static dim
        (lambda x: x.sum(1), (f,)),
        (lambda x: x.sum([0, 1]), (f,)),    # a static list
        (lambda x: x.sum(1, keepdim=True), (f,)),
        (lambda x: x.to(torch.float64) + x.to(torch.float64), (f,)),
    ]
    _served_twice(calls)
    old = torch.get_default_dtype()
    try:
        for dtype in (torch.float64, torch.float32, torch.float64):
            torch.set_default_dtype(dtype)
            # int / int and int * float take the default dtype: part of the key
            assert_same(to_tpu(i) / to_tpu(i + 1), i / (i + 1), rtol=0, atol=0)
            assert_same(to_tpu(i) * 1.5, i * 1.5, rtol=0, atol=0)
    finally:
        torch.set_default_dtype(old)


@torchtpu.eager_mode("strict")
def test_lists_of_tensors_and_in_place():
    a, b, c = torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4)
    calls = [
        (lambda x, y, z: torch.cat([x, y]), (a, b, c)),
        (lambda x, y, z: torch.cat([x, x]), (a, b, c)),
        (lambda x, y, z: torch.cat([x, z]), (a, b, c)),
        (lambda x, y, z: torch.stack([y, x]), (a, b, c)),
        (lambda x, y, z: torch._foreach_add([x, y], [y, x]), (a, b, c)),
        (lambda x, y, z: torch._foreach_mul([x, x], 3.0), (a, b, c)),
        (lambda x, y, z: x.clone().add_(y, alpha=2), (a, b, c)),
        (lambda x, y, z: x.clone().mul_(2), (a, b, c)),
        (lambda x, y, z: torch.add(x, y, out=torch.empty_like(x)), (a, b, c)),
    ]
    _served_twice(calls)


@torchtpu.eager_mode("strict")
def test_in_place_into_views_of_varying_extent_still_buckets():
    # partial-view in-place writes stay on the full path, which keeps their size history
    buf_cpu, buf = torch.zeros(64, 8), torch.zeros(64, 8, device="tpu")
    for n in (3, 5, 9, 17, 3, 5, 33, 9):
        buf_cpu[:n].fill_(float(n))
        buf[:n].fill_(float(n))
        assert_same(buf, buf_cpu, rtol=0, atol=0)


def test_modes_and_evictions_between_hits():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    at, bt = to_tpu(a), to_tpu(b)
    for mode in ("strict", "defer_and_fuse", "strict", "debug", "defer_and_fuse"):
        with torchtpu.eager_mode(mode):
            for _ in range(2):
                assert_same(at * bt - at, a * b - a)  # (a fused region may contract to an fma)
        torchtpu.clear_caches()  # every executable goes: the quick keys with them
        assert executor._cache.by_quick_key == {}


@torchtpu.eager_mode("strict")
def test_device_checks_still_fire_on_a_hit():
    x = torch.randn(5, 3, device="tpu")
    good = torch.tensor([0, 4], device="tpu")
    for _ in range(3):
        x.index_select(0, good).cpu()
    bad = torch.tensor([0, 7], device="tpu")
    with pytest.raises((IndexError, RuntimeError)):
        x.index_select(0, bad).cpu()
    # and the errors of a tensor on another device are still CPU's words
    with pytest.raises(RuntimeError, match="device"):
        x + torch.randn(5, 3)


def test_compiled_graph_calls_told_apart():
    """A compiled graph's calls are found by a quick key too (compile/runtime._quick_scan)."""
    def f(x, y, k):
        return x * y + k

    g = torch.compile(f, backend="tpu", dynamic=False)
    a, b = torch.randn(6, 4), torch.randn(6, 4)
    at, bt = to_tpu(a), to_tpu(b)
    for _ in range(2):
        for x, y, xt, yt in [(a, b, at, bt), (a[2:4], b[0:2], at[2:4], bt[0:2]),
                             (a[0:2], b[0:2], at[0:2], bt[0:2]), (a, a, at, at),
                             (a.t(), b.t(), at.t(), bt.t())]:
            for k in (2, 3.5):
                assert_same(g(xt, yt, k), f(x, y, k))  # (x * y + k may contract to an fma)
        # a CPU input beside tpu ones
        assert_same(g(at, bt, torch.tensor(2.0)), f(a, b, torch.tensor(2.0)))


def test_compiled_graph_mutating_its_input():
    """The quick path keeps donation as the full one decides it: a buffer someone else holds
    (here a view's base read later) is not overwritten."""
    def step(p, grad):
        p.sub_(grad * 0.5)
        return p.sum()

    g = torch.compile(step, backend="tpu")
    p_cpu, grad = torch.randn(8), torch.randn(8)
    p = to_tpu(p_cpu.clone())
    gt = to_tpu(grad)
    for i in range(4):
        kept = p.clone() if i == 2 else None
        got = g(p, gt)
        want = step(p_cpu, grad)
        assert_same(got, want, rtol=1e-6, atol=1e-6)
        assert_same(p, p_cpu, rtol=0, atol=0)
        if kept is not None:
            assert_same(kept, p_cpu + grad * 0.5, rtol=1e-6, atol=1e-6)


def test_the_cpp_walk_keys_as_the_python_rules_say():
    """csrc/scan.cpp and op_args.scan_python (the rules in Python) give one key per call."""
    from torchtpu.eager import op_args
    from torchtpu.ops.registry import LOWERINGS

    a = torch.randn(4, 4, device="tpu")
    v = a[1:3]
    cases = [
        ("add.Tensor", (a, v[:1]), {}),
        ("add.Tensor", (a, a), {"alpha": 2}),
        ("add.Tensor", (v.t(), v.t().conj()), {}),
        ("mul.Scalar", (a, 1j), {}),
        ("mul.Scalar", (a, 1 + 0j), {}),
        ("mul.Scalar", (a, True), {}),
        ("sum.dim_IntList", (a, [0], True), {}),
        ("sum.dim_IntList", (a, [0, 1], False), {"dtype": torch.float64}),
        ("cat", ([a, v, a], 0), {}),
        ("_foreach_mul.Scalar", ([a, v], 2.5), {}),
        ("_foreach_add.List", ([a, v], [v, a]), {"alpha": 3}),
        ("add.Tensor", (a, torch.ones(4)), {}),                 # a CPU tensor: neither reads it
        ("leaky_relu", (a, float("nan")), {}),
    ]
    for name, args, kwargs in cases:
        low = LOWERINGS[name]
        head = (low.name, low.mode)
        got = op_args.scan(low, args, kwargs, head)
        want = op_args.scan_python(low, args, kwargs, head)
        assert (got is None) == (want is None), name
        if got is None:
            continue
        assert got[0] == want[0] and hash(got[0]) == hash(want[0]), name
        g, w = got[1], want[1]
        assert (g.dyn, g.offsets) == (w.dyn, w.offsets), name
        assert [id(e) for e in g.entries] == [id(e) for e in w.entries], name
        assert [id(t) for t in g.tensors] == [id(t) for t in w.tensors], name


@torchtpu.eager_mode("strict")
def test_repeated_numbers_keep_their_sign_and_nan():
    """Runtime numbers that repeat are passed from a cache (eager/scalars.pack_cached): a float
    zero's sign and a NaN are never taken from it, and each value reaches its own call."""
    from conftest import assert_bits

    x = torch.tensor([-1.5, 2.0, -0.0, 3.0])
    xt = to_tpu(x)
    for v in (0.0, -0.0, 0.0, float("nan"), 1.25, 1.25, -1.25, -0.0, 7, 7, True):
        for _ in range(2):
            assert_bits(xt * v, x * v)
            if type(v) is not bool:  # (CPU refuses a bool alpha for a float result)
                assert_bits(xt.add(xt, alpha=v), x.add(x, alpha=v))
