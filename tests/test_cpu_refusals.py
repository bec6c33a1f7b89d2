"""Calls CPU PyTorch rejects never come back from tpu as a number: by their dtype (its
kernels dispatch on dtype where its meta kernels do not look: eager/argcheck.dtype_refusal)
and by their data (device-side checks in the lowerings), with CPU's exception class and
message, in strict, defer_and_fuse and torch.compile."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu

C = torch.tensor([1 + 2j, 3 - 1j, 0.5j])
I = torch.tensor([[1, 2], [3, 4]])

BY_DTYPE = {
    "max": (lambda x: x.max(), C), "min dim": (lambda x: x.min(0), C), "amax": (lambda x: x.amax(), C),
    "maximum": (lambda x: torch.maximum(x, x), C), "clamp": (lambda x: x.clamp(0, 1), C),
    "relu": (lambda x: torch.relu(x), C), "argmax": (lambda x: x.argmax(), C), "cummax": (lambda x: x.cummax(0), C),
    "lt": (lambda x: x < 1, C), "sign": (lambda x: x.sign(), C), "atan2": (lambda x: torch.atan2(x, x), C),
    "unique": (lambda x: torch.unique(x), C), "searchsorted": (lambda x: torch.searchsorted(x, x), C),
    "softmax of int": (lambda x: torch.softmax(x, 0), I), "log_softmax of int": (lambda x: torch.log_softmax(x, 1), I),
    "gelu of int": (lambda x: F.gelu(x), I), "bincount of bool": (lambda x: torch.bincount(x), torch.tensor([True])),
    "bincount of float": (lambda x: torch.bincount(x), torch.tensor([1.0])),
    "abs of bool": (lambda x: x.abs(), torch.tensor([True, False])),
    "lerp of int": (lambda x: torch.lerp(x, x * 2, 0.5), I),
    "bool minus a number": (lambda x: x - 1, torch.tensor([True, False])),
    "a number minus bool": (lambda x: 1 - x, torch.tensor([True, False])),
    "minus a Python bool": (lambda x: x.sub(True), torch.ones(2)),
    "float minus bool": (lambda x: x.float() - x, torch.tensor([True, False])),
}
ACCEPTED = {
    "complex add": (lambda x: x * 2 + x, C), "complex abs": (lambda x: x.abs(), C), "int sum": (lambda x: x.sum(1), I),
    "int max": (lambda x: x.max(), I), "softmax of int as float": (lambda x: torch.softmax(x, 0, dtype=torch.float32), I),
    "bool any": (lambda x: x.any(), I > 2), "complex matmul": (lambda x: x[:, None] @ x[None, :], C),
    "abs of int": (lambda x: x.abs(), -I), "int minus a number": (lambda x: x - 1, I),
}
BY_DATA = {
    "bce input": (lambda x, t: F.binary_cross_entropy(x, t), torch.tensor([0.5, 1.5]), torch.tensor([1.0, 0.5])),
    "bce target": (lambda x, t: F.binary_cross_entropy(x, t), torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.5])),
    "bce nan": (lambda x, t: F.binary_cross_entropy(x, t), torch.tensor([float("nan")]), torch.tensor([1.0])),
    "masked_scatter": (lambda m, s: torch.zeros(3).to(s.device).masked_scatter(m, s),
                       torch.tensor([True, False, True]), torch.ones(1)),
    "embedding_bag first offset": (lambda i, o: F.embedding_bag(i, torch.ones(5, 2, device=i.device), o),
                                   torch.tensor([1, 2]), torch.tensor([1, 1])),
    "embedding_bag last offset": (lambda i, o: F.embedding_bag(i, torch.ones(5, 2, device=i.device), o,
                                                               include_last_offset=True),
                                  torch.tensor([1, 2]), torch.tensor([0, 3])),
}


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001
        return type(err), str(err).splitlines()[0]
    return None


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(BY_DTYPE))
def test_a_dtype_cpu_refuses_is_refused(mode, name):
    fn, x = BY_DTYPE[name]
    want = _error(fn, x)
    assert want is not None
    with torchtpu.eager_mode(mode):
        got = _error(lambda t: [r.cpu() for r in torch.utils._pytree.tree_leaves(fn(t))], x.to("tpu"))
    assert got is not None and got[0] is want[0] and got[1].startswith(want[1]), (got, want)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_what_cpu_accepts_still_runs(mode, name):
    fn, x = ACCEPTED[name]
    with torchtpu.eager_mode(mode):
        got = fn(x.to("tpu"))
    assert torch.allclose(got.cpu(), fn(x))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(BY_DATA))
def test_data_cpu_refuses_is_refused(mode, name):
    fn, *args = BY_DATA[name]
    want = _error(fn, *args)
    assert want is not None
    with torchtpu.eager_mode(mode):
        got = _error(lambda *a: fn(*a).cpu(), *[a.to("tpu") for a in args])
    assert got is not None and got[0] is want[0] and got[1].startswith(want[1]), (got, want)


@pytest.mark.parametrize("name", ["max", "clamp", "softmax of int", "bool minus a number"])
def test_compiled_graphs_refuse_the_same_dtypes(name):
    fn, x = BY_DTYPE[name]
    want = _error(fn, x)
    torch._dynamo.reset()
    got = _error(lambda t: torch.compile(fn, backend="tpu")(t).cpu(), x.to("tpu"))
    assert got is not None and got[0] is want[0] and got[1].startswith(want[1]), (got, want)


U8, I8, I64, F16, F32 = torch.uint8, torch.int8, torch.int64, torch.float16, torch.float32
# a number the dtype it is written in cannot hold (c10::checked_convert: ops/scalar_range.py),
# and pow of integers by a negative integer: (call on a tpu or CPU tensor x, x's dtype)
BY_VALUE = {
    "full uint8 300": (lambda x: torch.full((2,), 300, dtype=U8, device=x.device), U8),
    "full int8 -129": (lambda x: torch.full((2,), -129, dtype=I8, device=x.device), I8),
    "full int64 nan": (lambda x: torch.full((2,), float("nan"), dtype=I64, device=x.device), I64),
    "full uint8 -1.0": (lambda x: torch.full((2,), -1.0, dtype=U8, device=x.device), U8),
    "full float16 1e6": (lambda x: torch.full((2,), 1e6, dtype=F16, device=x.device), F16),
    "full float16 2**62 int": (lambda x: torch.full((2,), 2 ** 62, dtype=F16, device=x.device), F16),
    "full default 1e39": (lambda x: torch.full((2,), 1e39, device=x.device), F32),
    "fill_ uint8 300": (lambda x: x.fill_(300), U8),
    "fill_ int64 nan": (lambda x: x.fill_(float("nan")), I64),
    "fill_ 0-d int8 200": (lambda x: x[0].fill_(200), I8),
    "new_full uint8 256": (lambda x: x.new_full((3,), 256), U8),
    "full_like int8 128": (lambda x: torch.full_like(x, 128), I8),
    "masked_fill uint8 300": (lambda x: x.masked_fill(x == 0, 300), U8),
    "index_fill int8 -200": (lambda x: x.index_fill(0, torch.tensor([0], device=x.device), -200), I8),
    "scatter value uint8 -256": (lambda x: x.scatter(0, torch.tensor([0], device=x.device), -256), U8),
    "clamp float32 1e39": (lambda x: x.clamp(min=1e39), F32),
    "clamp_max int8 300": (lambda x: x.clamp_max(300), I8),
    "clamp_ uint8 -300": (lambda x: x.clamp_(min=-300), U8),
    "pow int negative": (lambda x: x ** -1, I64),
    "pow_ uint8 negative": (lambda x: x.pow_(-2), U8),
    "pow bool negative": (lambda x: (x > 0) ** -1, I64),
}
VALUE_ACCEPTED = {
    "full uint8 -1 wraps": (lambda x: torch.full((2,), -1, dtype=U8, device=x.device), U8),
    "fill_ uint8 -255": (lambda x: x.fill_(-255), U8),
    "fill_ float16 inf": (lambda x: x.fill_(float("inf")), F16),
    "fill_ float16 nan": (lambda x: x.fill_(float("nan")), F16),
    "full bool 2": (lambda x: torch.full((2,), 2, dtype=torch.bool, device=x.device), U8),
    "full float16 60000": (lambda x: torch.full((2,), 60000, dtype=F16, device=x.device), F16),
    "clamp int32 to a float": (lambda x: x.clamp(max=2.5), torch.int32),
    "add_ int8 1000 wraps": (lambda x: x.add_(1000), I8),
    "pow int by a negative tensor": (lambda x: x ** torch.tensor([-1, 2, 1], device=x.device), I64),
    "pow int by a negative float": (lambda x: x ** -1.0, I64),
    "fill_ uint8 255": (lambda x: x.fill_(255), U8),
}


def _x(dtype):
    return torch.tensor([0, 1, 2]).to(dtype)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(BY_VALUE))
def test_a_number_the_dtype_cannot_hold_is_refused(mode, name):
    fn, dt = BY_VALUE[name]
    want = _error(fn, _x(dt))
    assert want is not None
    with torchtpu.eager_mode(mode):
        got = _error(lambda t: fn(t).cpu(), _x(dt).to("tpu"))
    assert got is not None and got[0] is want[0] and got[1] == want[1], (got, want)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(VALUE_ACCEPTED))
def test_numbers_cpu_converts_still_run(mode, name):
    fn, dt = VALUE_ACCEPTED[name]
    want = fn(_x(dt))
    with torchtpu.eager_mode(mode):
        got = fn(_x(dt).to("tpu")).cpu()
    assert got.dtype == want.dtype
    assert torch.equal(got, want) or (got.is_floating_point() and torch.equal(got.isnan(), want.isnan())), (got, want)


@pytest.mark.parametrize("name", ["fill_ uint8 300", "full float16 1e6", "clamp float32 1e39", "pow int negative",
                                  "masked_fill uint8 300"])
def test_compiled_graphs_refuse_the_same_numbers(name):
    fn, dt = BY_VALUE[name]
    want = _error(fn, _x(dt))
    torch._dynamo.reset()
    got = _error(lambda t: torch.compile(fn, backend="tpu")(t).cpu(), _x(dt).to("tpu"))
    assert got is not None and got[0] is want[0] and got[1].startswith(want[1]), (got, want)
