"""torch.set_float32_matmul_precision reaches the XLA programs tpu runs (eager and compiled).

On XLA:CPU the precision config has no numeric effect, so the tests read the programs'
StableHLO and check that a changed setting compiles anew instead of reusing a stale program.
"""
import re

import jax
import pytest
import torch

import torchtpu
from conftest import assert_same
from torchtpu.eager import executor

EXPECTED = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


def _precisions(text):
    """The operand precisions of every dot_general / convolution in a StableHLO module."""
    found = re.findall(r"precision = \[(\w+), (\w+)\]", text)
    found += re.findall(r"#stablehlo<precision (\w+)>, #stablehlo<precision (\w+)>", text)
    return {p for pair in found for p in pair}


@pytest.fixture(autouse=True)
def _restore_precision():
    old = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(old)


def _eager_program(name):
    """The jitted program strict eager keeps for op `name` (its newest signature), and the
    avals of a call."""
    compiled = [c for k, c in list(executor._cache.items()) if k.op == name][-1]  # the newest
    store_specs, inited = compiled.key[5], compiled.key[6]
    bufs = tuple(jax.ShapeDtypeStruct((n,), dt) if i else None for (n, dt), i in zip(store_specs, inited))
    counts = [0, 0, 0, 0]
    for c in compiled.fn.codes:
        counts[c] += 1
    packed = tuple(jax.ShapeDtypeStruct((n,), executor._PACKED_DTYPES[k]) if n else None
                   for k, n in enumerate(counts)) if any(counts) else None
    return compiled.fn, (bufs, packed, ())


def test_default_is_pytorchs_highest():
    assert torch.get_float32_matmul_precision() == "highest"
    a = torch.randn(3, 4, device="tpu")
    a @ a.T
    assert jax.config.jax_default_matmul_precision == "highest"


def test_eager_programs_follow_the_setting_and_recompile():
    a, b = torch.randn(3, 11), torch.randn(11, 6)  # shapes no other test uses: a fresh executable
    at, bt = a.to("tpu"), b.to("tpu")
    traces = []
    for p in ("highest", "high", "medium", "highest"):
        torch.set_float32_matmul_precision(p)
        with torchtpu.eager_mode("strict"):  # the op's own executable (defer_and_fuse fuses it instead)
            out = torch.mm(at, bt)
        assert_same(out, a @ b)
        fn, avals = _eager_program("mm")
        text = fn.trace(*avals).lower().as_text()
        assert _precisions(text) == {EXPECTED[p]}, text
        traces.append(fn._cache_size())
    # one executable per setting, the first reused when it comes back
    assert traces == [1, 2, 3, 3]


def test_allow_tf32_is_high():
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        assert torch.get_float32_matmul_precision() == "high"
        x = torch.randn(2, 3, 4, 4, device="tpu")
        w = torch.randn(5, 3, 3, 3, device="tpu")
        torch.nn.functional.conv2d(x, w)
        fn, avals = _eager_program("convolution")
        assert _precisions(fn.trace(*avals).lower().as_text()) == {"HIGH"}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_compiled_programs_follow_the_setting():
    def f(a, b):
        return torch.relu(a @ b)

    a, b = torch.randn(3, 4, device="tpu"), torch.randn(4, 5, device="tpu")
    for p in ("medium", "high", "highest"):
        torch.set_float32_matmul_precision(p)
        texts = torchtpu.dump_stablehlo(f, a, b)
        assert set().union(*map(_precisions, texts)) == {EXPECTED[p]}, texts
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu")
    torch.set_float32_matmul_precision("medium")
    compiled(a, b)
    before = torchtpu.metrics()["compile_graphs"]
    torch.set_float32_matmul_precision("high")
    out = compiled(a, b)
    assert torchtpu.metrics()["compile_graphs"] == before + 1  # not the "medium" program
    assert_same(out, torch.relu(a.cpu() @ b.cpu()))
