"""The tpu device: creation, transfers, dtypes, torch.tpu, memory, errors, fallback."""
import gc
import warnings

import pytest
import torch

import torchtpu
from conftest import assert_same, check

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


def test_device_identity():
    t = torch.ones(2, device="tpu")
    assert type(t) is torch.Tensor
    assert t.device == torch.device("tpu", 0)
    assert t.is_leaf and not t.requires_grad
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_dtypes(dtype):
    x = (torch.randn(3, 5) * 10).to(dtype)
    t = x.to("tpu")
    assert t.dtype == dtype
    back = t.cpu()
    assert back.dtype == dtype
    assert torch.equal(back, x)


def test_tpu_method_and_item_tolist_numpy():
    x = torch.tensor([[1.5, 2.0], [3.0, 4.0]])
    t = x.tpu()
    assert t.device.type == "tpu"
    assert t[1, 0].item() == 3.0
    assert t.tolist() == x.tolist()
    assert (t.cpu().numpy() == x.numpy()).all()


def test_repr_prints_values():
    t = torch.tensor([1.0, 2.5], device="tpu")
    s = repr(t)
    assert "1.0000" in s and "2.5000" in s and "device='tpu:0'" in s


def test_factories():
    assert torch.zeros(2, 3, device="tpu").cpu().eq(0).all()
    assert torch.ones(2, 3, device="tpu", dtype=torch.int64).cpu().eq(1).all()
    assert_same(torch.full((2,), 3.5, device="tpu"), torch.full((2,), 3.5))
    assert_same(torch.arange(5, device="tpu"), torch.arange(5))
    assert_same(torch.arange(0, 1, 0.25, device="tpu"), torch.arange(0, 1, 0.25))
    e = torch.empty(4, 2, device="tpu")
    assert e.shape == (4, 2) and e.device.type == "tpu"
    r = torch.randn(100, device="tpu")
    assert r.shape == (100,) and r.dtype == torch.float32
    i = torch.randint(0, 5, (50,), device="tpu")
    assert i.dtype == torch.int64 and int(i.min()) >= 0 and int(i.max()) < 5
    u = torch.rand(50, device="tpu")
    assert 0 <= float(u.min()) and float(u.max()) < 1


def test_module_to_tpu():
    m = torch.nn.Linear(3, 2).to("tpu")
    assert isinstance(m.weight, torch.nn.Parameter)
    assert m.weight.device.type == "tpu" and type(m.weight.data) is torch.Tensor
    m2 = m.to("cpu")
    assert m2.weight.device.type == "cpu"


def test_memory_freed_on_del():
    gc.collect()
    before = torch.tpu.memory_allocated()
    x = torch.ones(1024, 256, device="tpu")
    y = x.t()[3:]
    assert torch.tpu.memory_allocated() >= before + 1024 * 256 * 4
    del x
    assert torch.tpu.memory_allocated() >= before + 1024 * 256 * 4  # the view keeps the storage
    del y
    gc.collect()
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 1024 * 256 * 4


def test_device_mismatch_raises_like_cuda():
    a = torch.ones(3, device="tpu")
    b = torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + b
    # 0-dim CPU tensors are scalars, as with cuda
    assert_same(a + torch.tensor(2.0), torch.full((3,), 3.0))


# An op with only a CPU kernel: the tpu can serve it only through the fallback.
_lib = torch.library.Library("torchtpu_test", "DEF")
_lib.define("double_it(Tensor x) -> Tensor")
_lib.impl("double_it", lambda x: x * 2, "CPU")


@pytest.mark.parametrize("make", [
    lambda d: torch.ones(3, device=d), lambda d: torch.zeros(2, 2, device=d), lambda d: torch.full((2,), 1.0, device=d),
    lambda d: torch.arange(3, device=d), lambda d: torch.eye(2, device=d), lambda d: torch.linspace(0, 1, 3, device=d),
    lambda d: torch.empty(2, device=d), lambda d: torch.randn(2, device=d), lambda d: torch.ones(2).to(d),
    lambda d: torch.ones(2, device="tpu").new_full((2,), 1.0, device=d),
], ids=["ones", "zeros", "full", "arange", "eye", "linspace", "empty", "randn", "to", "new_full"])
def test_a_device_index_this_process_lacks_is_refused(make):
    """As CUDA refuses an ordinal it lacks; a factory used to return a tensor on tpu:0 instead."""
    for d in ("tpu:3", torch.device("tpu", 1)):
        with pytest.raises(RuntimeError, match="invalid device|tpu:0"):
            make(d)
    assert make("tpu:0").device == torch.device("tpu", 0)


@pytest.mark.parametrize("make", [
    lambda d: torch.ones(3, device=d), lambda d: torch.ones(2).to(d), lambda d: torch.arange(3, device=d),
], ids=["ones", "to", "arange"])
def test_a_device_index_this_process_lacks_is_refused_compiled(make):
    """The same in a compiled graph, where the factory used to run on tpu:0; the error names the op
    and the user's line."""
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"invalid device tpu:3(.|\n)*test_device.py"):
        torch.compile(lambda: make("tpu:3"), backend="tpu")()
    assert torch.compile(lambda: make("tpu:0"), backend="tpu")().device == torch.device("tpu", 0)


def test_no_lowering_raises_when_fallback_disabled(no_fallback):
    x = torch.ones(3, device="tpu")
    with pytest.raises(NotImplementedError, match=r"torchtpu_test::double_it\.default"):
        torch.ops.torchtpu_test.double_it(x)


def test_fallback_counts_and_warns_once():
    x = torch.randn(4, 3)
    t = x.to("tpu")
    torchtpu.reset_metrics()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r1 = torch.ops.torchtpu_test.double_it(t)
        r2 = torch.ops.torchtpu_test.double_it(t)
    m = torchtpu.metrics()
    assert m["fallback_ops"].get("torchtpu_test.double_it.default") == 2
    assert sum("no tpu lowering" in str(x.message) for x in w) == 1
    assert_same(r1, x * 2)
    assert r2.device.type == "tpu"


@torchtpu.eager_mode("strict")
def test_metrics_counts_compiles_and_hits():
    x = torch.randn(8, 8, device="tpu")
    torchtpu.reset_metrics()
    for _ in range(5):
        x = x * 0.5
    m = torchtpu.metrics()
    assert m["executions"] == 5
    assert m["compiles"] <= 1 and m["cache_hits"] >= 4


def test_scalar_value_change_does_not_recompile():
    x = torch.randn(8, device="tpu")
    x.mul_(0.9)
    torchtpu.reset_metrics()
    for i in range(5):
        x.mul_(0.9 + i * 0.01)
    assert torchtpu.metrics()["compiles"] == 0


def test_manual_seed_reproducible():
    torch.manual_seed(123)
    a = torch.randn(16, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.randn(16, device="tpu").cpu()
    c = torch.randn(16, device="tpu").cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)
    torch.tpu.manual_seed(7)
    s = torch.tpu.get_rng_state()
    d = torch.rand(4, device="tpu").cpu()
    torch.tpu.set_rng_state(s)
    assert torch.equal(torch.rand(4, device="tpu").cpu(), d)


def test_synchronize_and_platform():
    torch.ones(2, device="tpu") * 2
    torch.tpu.synchronize()
    assert torchtpu.platform() in ("cpu", "gpu", "tpu")


def test_inplace_dtype_error_names_op():
    x = torch.ones(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast"):
        x.add_(1.5)


def test_autograd_basic():
    check(lambda t: (t * t).sum(), torch.randn(4, 3), grad=True)


def test_module_to_keeps_tied_parameters():
    import copy

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight
    ref = copy.deepcopy(m)
    m.to("tpu")
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "tpu"
    x = torch.tensor([[1, 2, 3]])
    m(x.to("tpu")).square().sum().backward()
    ref(x).square().sum().backward()
    # the shared weight's gradient holds both uses, as on CPU
    assert_same(m[0].weight.grad, ref[0].weight.grad)
    m.to("cpu")
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "cpu"


def test_static_numbers_of_equal_value_and_other_type_are_other_programs():
    # 3 == 3.0 == True hash alike: as a static argument each is its own program (arange(3.0)
    # ran first made arange(3) come back float32 in a full run)
    for a, b in ((3.0, 3), (1, True)):
        for v in (a, b):
            assert_same(torch.full((2,), v, device="tpu"), torch.full((2,), v))
    assert_same(torch.arange(3.0, device="tpu"), torch.arange(3.0))
    assert_same(torch.arange(3, device="tpu"), torch.arange(3))


def test_integer_arange_with_a_moving_start_compiles_once(no_fallback):
    torchtpu.reset_metrics()
    for t in range(8):
        assert_same(torch.arange(t, t + 3, device="tpu"), torch.arange(t, t + 3))
    assert torchtpu.metrics()["compiles"] <= 2  # arange(3) and the add of a runtime start
    assert_same(torch.arange(-4, 3, dtype=torch.int32, device="tpu"),
                torch.arange(-4, 3, dtype=torch.int32))
    assert_same(torch.arange(3, 10, dtype=torch.float32, device="tpu"),
                torch.arange(3, 10, dtype=torch.float32))
    assert torch.arange(5, 5, device="tpu").shape == (0,)
    with pytest.raises(RuntimeError, match="bound"):
        torch.arange(7, 2, device="tpu")
