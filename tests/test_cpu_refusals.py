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
