import os
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

import torchtpu  # noqa: E402


@pytest.fixture
def no_fallback():
    """Run the test with the CPU fallback forbidden, so any missing lowering fails loudly."""
    torchtpu.set_fallback(False)
    try:
        yield
    finally:
        torchtpu.set_fallback(True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# ---- the same program on CPU and on tpu ------------------------------------------------------
#
# One comparison for every test file: `check(fn, *args)` runs fn on the CPU tensors given and
# on the same tensors moved to tpu (args and kwargs, nested lists/tuples/dicts too), then
# `assert_same` compares the results leaf by leaf. Test files import them with
# `from conftest import check` (pytest puts tests/ on sys.path).


def to_tpu(x):
    """`x` with every tensor in it moved to tpu (lists, tuples and dicts walked)."""
    return tree_map(lambda a: a.to("tpu") if isinstance(a, torch.Tensor) else a, x)


def to_cpu(x):
    return tree_map(lambda a: a.cpu() if isinstance(a, torch.Tensor) else a, x)


def assert_same(tpu, cpu, *, atol=None, rtol=None, equal_nan=False, check_dtype=True, check_stride=False):
    """`tpu` matches the CPU result `cpu`: the same structure; each tensor on tpu with CPU's
    shape, dtype (unless check_dtype=False), strides (if check_stride) and values (within
    atol/rtol, assert_close's defaults for the dtype when None; NaN equal to NaN only if
    equal_nan); each non-tensor leaf equal."""
    got, got_spec = tree_flatten(tpu)
    want, want_spec = tree_flatten(cpu)
    assert got_spec == want_spec, f"structure: tpu {got_spec} vs cpu {want_spec}"
    for g, w in zip(got, want):
        if not isinstance(w, (torch.Tensor, int, float, complex)):  # None, str, dtype, ...
            assert g == w, f"tpu {g!r} vs cpu {w!r}"
            continue
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.device.type == "tpu", f"not a tpu tensor: {g!r}"
        torch.testing.assert_close(to_cpu(g), w, atol=atol, rtol=rtol, equal_nan=equal_nan,
                                   check_dtype=check_dtype, check_stride=check_stride)


def check(fn, *args, atol=None, rtol=None, equal_nan=False, check_dtype=True, check_stride=False,
          both=False, **kwargs):
    """Run `fn(*args, **kwargs)` on the CPU tensors given and on them moved to tpu, and
    assert_same the results. Returns the tpu result, or (the tpu result on the CPU, the CPU
    result) with both=True."""
    cpu = fn(*args, **kwargs)
    tpu = fn(*to_tpu(args), **to_tpu(kwargs))
    assert_same(tpu, cpu, atol=atol, rtol=rtol, equal_nan=equal_nan, check_dtype=check_dtype,
                check_stride=check_stride)
    return (to_cpu(tpu), cpu) if both else tpu


def run_in_mode(mode, fn, *args):
    """fn on the tpu copies of args in `mode`; the result back on the CPU
    ("compile": torch.compile(fn, backend="tpu"), eager in strict)."""
    targs = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "compile":
            torch._dynamo.reset()
            with torchtpu.eager_mode("strict"):
                out = torch.compile(fn, backend="tpu")(*targs)
        else:
            with torchtpu.eager_mode(mode):
                out = fn(*targs)
        return out.cpu() if isinstance(out, torch.Tensor) else out
