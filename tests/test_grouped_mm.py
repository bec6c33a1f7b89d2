"""torch._grouped_mm (F.grouped_mm, the MoE expert matmul) on tpu vs CPU.

Every layout (2D x 3D and 3D x 2D with offs, 2D x 2D with offs, 3D x 3D), float32 and the
half types, CPU's errors, PyTorch's derivative formula, in strict, defer_and_fuse and
torch.compile (where PyTorch's meta kernel accepts bfloat16 only and ours follows CPU).
Rows no group covers are uninitialized memory on CPU: only covered rows are compared.
"""
import re

import pytest
import torch

from torch._dynamo.utils import counters

from conftest import assert_same, check
from torchtpu.ops.registry import LOWERINGS

I32 = torch.int32


def _offs(*v):
    return torch.tensor(v, dtype=I32)


def _cases():
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g)

    return {
        # name: (mat_a, mat_b, offs, rows of the result CPU defines (None: all))
        "2d3d": (r(10, 8), r(3, 8, 16), _offs(2, 5, 10), None),
        "2d3d_empty_group": (r(10, 8), r(4, 8, 4), _offs(3, 3, 7, 10), None),
        "2d3d_tail_uncovered": (r(10, 8), r(3, 8, 4), _offs(2, 5, 8), slice(0, 8)),
        "2d3d_decreasing": (r(10, 8), r(3, 8, 4), _offs(5, 2, 10), None),
        "2d3d_negative_and_past_end": (r(10, 8), r(3, 8, 4), _offs(-8, 5, 40), None),
        "2d3d_b_col_major": (r(10, 8), r(3, 12, 8).transpose(-2, -1), _offs(2, 5, 10), None),
        "3d3d": (r(3, 6, 8), r(3, 8, 8), None, None),
        "2d2d": (r(6, 16), r(16, 8), _offs(3, 3, 9), None),
        "2d2d_a_col_major": (r(12, 8).t(), r(12, 4), _offs(4, 12), None),
        "3d2d": (r(3, 6, 8), r(8, 16), _offs(2, 7, 16), None),
    }


CASES = _cases()


def _covered(t, rows):
    """The rows of a result CPU defines."""
    return t if rows is None else t[rows]


@pytest.mark.parametrize("name,dtype", [(n, torch.float32) for n in sorted(CASES)] + [
    (n, torch.bfloat16) for n in ("2d3d", "3d3d", "2d2d", "3d2d")] + [("2d3d", torch.float16)])
def test_layouts_match_cpu(name, dtype, no_fallback):
    a, b, offs, rows = CASES[name]
    a, b = a.to(dtype), b.to(dtype)
    want = torch._grouped_mm(a, b, offs)
    ta, tb = a.to("tpu"), b.to("tpu")
    if a.stride() != ta.stride():  # keep a column-major operand column-major on tpu
        ta = a.t().contiguous().to("tpu").t()
    if b.stride() != tb.stride():
        tb = b.transpose(-2, -1).contiguous().to("tpu").transpose(-2, -1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    got = torch._grouped_mm(ta, tb, None if offs is None else offs.to("tpu"))
    assert got.shape == want.shape
    assert_same(_covered(got, rows), _covered(want, rows), **tol)
    # the functional API routes here too
    got = torch.nn.functional.grouped_mm(ta, tb, offs=None if offs is None else offs.to("tpu"))
    assert got.shape == want.shape
    assert_same(_covered(got, rows), _covered(want, rows), **tol)


def _bad_cases():
    a, b, offs = torch.randn(10, 8), torch.randn(3, 8, 4), _offs(2, 5, 10)
    return {
        "double": (a.double(), b.double(), offs, {}),
        "int": (a.long(), b, offs, {}),
        "mixed_dtypes": (a, b.bfloat16(), offs, {}),
        "mixed_dtypes_3d": (torch.randn(3, 4, 8), b.bfloat16(), None, {}),
        "1d": (torch.randn(8), b, offs, {}),
        "4d": (a, b[None], offs, {}),
        "contraction": (torch.randn(10, 4), b, offs, {}),
        "no_offs": (a, b, None, {}),
        "offs_for_3d3d": (torch.randn(3, 4, 8), b, offs, {}),
        "offs_int64": (a, b, offs.long(), {}),
        "offs_2d": (a, b, offs[None], {}),
        "offs_len": (a, b, _offs(2, 10), {}),
        "batch_3d3d": (torch.randn(2, 4, 8), b, None, {}),
        "batch_3d2d": (torch.randn(2, 4, 8), torch.randn(8, 12), offs, {}),
        "bias": (a, b, offs, {"bias": torch.randn(3, 4)}),
        "out_dtype": (a, b, offs, {"out_dtype": torch.bfloat16}),
        "stride_not_16_bytes": (torch.randn(10, 6), torch.randn(3, 6, 4), offs, {}),
        "stride_zero": (torch.randn(1, 8).expand(10, 8), b, offs, {}),
    }


BAD = _bad_cases()
# the ones also checked under torch.compile (each compile costs ~1 s)
COMPILED = ("double", "offs_int64", "stride_not_16_bytes", "batch_3d3d", "out_dtype")


def _cpu_error(a, b, offs, kw):
    with pytest.raises(RuntimeError) as cpu:
        torch._grouped_mm(a, b, offs, **kw)
    return str(cpu.value).split("\n")[0]


def _tpu(t):
    if t is None:
        return None
    if not t.is_contiguous():
        if t.stride(0) == 0:
            return t[:1].to("tpu").expand(t.shape)
        return torch.empty(t.untyped_storage().size() // t.element_size(), dtype=t.dtype).copy_(
            torch.as_strided(t, (t.untyped_storage().size() // t.element_size(),), (1,), 0)
        ).to("tpu").as_strided(t.shape, t.stride(), t.storage_offset())
    if t.storage_offset():
        base = torch.as_strided(t, (t.untyped_storage().size() // t.element_size(),), (1,), 0)
        return base.to("tpu").as_strided(t.shape, t.stride(), t.storage_offset())
    return t.to("tpu")


@pytest.mark.parametrize("name", sorted(BAD))
def test_errors_match_cpu(name, no_fallback):
    a, b, offs, kw = BAD[name]
    msg = _cpu_error(a, b, offs, kw)
    ta, tb = _tpu(a), _tpu(b)
    assert ta.stride() == a.stride() and ta.storage_offset() == a.storage_offset()
    tkw = {k: _tpu(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        torch._grouped_mm(ta, tb, _tpu(offs), **tkw).cpu()
    if name not in COMPILED:
        return
    # torch.compile: the fake rule raises CPU's error too (Dynamo wraps it)
    f = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, o, **tkw), backend="tpu", fullgraph=True)
    with pytest.raises(Exception, match=re.escape(msg)):
        f(ta, tb, _tpu(offs))
    torch._dynamo.reset()


def test_2d2d_slice_lengths_checked_on_device(no_fallback):
    """2D x 2D with different contraction sizes: CPU multiplies while every group's slices
    have one length in both operands and raises mm's error otherwise (data-dependent)."""
    a, b = torch.randn(8, 12), torch.randn(16, 8)
    ok = _offs(4, 8, 12)
    check(torch._grouped_mm, a, b, ok, atol=1e-5, rtol=1e-5)
    bad = _offs(4, 8, 16)
    msg = _cpu_error(a, b, bad, {})
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        torch._grouped_mm(a.to("tpu"), b.to("tpu"), bad.to("tpu")).cpu()


def _moe(x, w1, w2, offs):
    """Two grouped matmuls with an activation between, as an MoE expert layer does."""
    h = torch.nn.functional.silu(torch._grouped_mm(x, w1, offs))
    return torch._grouped_mm(h, w2.transpose(-2, -1), offs)


def _moe_inputs():
    """x, w1, w2 (the gradients checked) and offs of _moe."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 8, generator=g)
    w1 = torch.randn(3, 8, 16, generator=g)
    w2 = torch.randn(3, 8, 16, generator=g)
    return x, w1, w2, _offs(3, 3, 12)


def test_backward_strict(no_fallback):
    check(_moe, *_moe_inputs(), grad=True, tpu_mode="strict", atol=1e-4, rtol=1e-4)


def test_backward_defer_and_fuse(no_fallback):
    check(_moe, *_moe_inputs(), grad=True, tpu_mode="defer_and_fuse", atol=1e-4, rtol=1e-4)


def test_backward_3d3d(no_fallback):
    check(torch._grouped_mm, torch.randn(3, 6, 8), torch.randn(3, 8, 4), grad=True, atol=1e-5, rtol=1e-5)


def test_compile_fullgraph_float32(no_fallback, monkeypatch):
    """The case PyTorch's bfloat16-only meta kernel rejects: float32 under torch.compile,
    forward and backward, every layout reached (the backward uses 2D x 2D)."""
    low = LOWERINGS["_grouped_mm"]
    seen = []
    fn = low.fn
    monkeypatch.setattr(low, "fn", lambda a, b, *r, **k: seen.append((a.ndim, b.ndim)) or fn(a, b, *r, **k))
    counters.clear()
    check(_moe, *_moe_inputs(), grad=True, tpu_mode="compile", atol=1e-4, rtol=1e-4)
    assert {(2, 3), (2, 2)} <= set(seen), seen
    check(lambda a, b: torch._grouped_mm(a, b), torch.randn(3, 6, 8), torch.randn(3, 8, 4), tpu_mode="compile",
          atol=1e-5, rtol=1e-5)
    check(lambda a, b, o: torch._grouped_mm(a, b, o), torch.randn(3, 6, 8), torch.randn(8, 12), _offs(2, 7, 12),
          tpu_mode="compile", atol=1e-5, rtol=1e-5)
    assert not counters["graph_break"], dict(counters["graph_break"])  # each one graph, as fullgraph=True
    torch._dynamo.reset()


def test_meta_kernel_unchanged_off_tpu():
    """Our fake rule serves tpu tensors only: PyTorch's meta kernel still decides elsewhere."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(10, 8), torch.empty(3, 8, 8)
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            torch._grouped_mm(a, b, torch.empty(3, dtype=I32))
        r = torch._grouped_mm(a.bfloat16(), b.bfloat16(), torch.empty(3, dtype=I32))
        assert r.shape == (10, 8) and r.dtype == torch.bfloat16


def test_hf_moe_compiled_matches_cpu(no_fallback, monkeypatch):
    """A one-layer float32 Mixtral (experts_implementation "grouped_mm", Transformers' default)
    compiled on tpu vs CPU eager: the experts reach _grouped_mm inside the compiled graph."""
    transformers = pytest.importorskip("transformers")
    low = LOWERINGS["_grouped_mm"]
    seen = []
    fn = low.fn
    monkeypatch.setattr(low, "fn", lambda a, b, *r, **k: seen.append((a.ndim, b.ndim)) or fn(a, b, *r, **k))
    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM._from_config(cfg, dtype=torch.float32).eval()
    assert model.config._experts_implementation == "grouped_mm"
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        tmodel = model.to("tpu")
        torch._dynamo.reset()
        got = torch.compile(tmodel, backend="tpu")(input_ids=ids.to("tpu")).logits
    assert_same(got, want, atol=1e-4, rtol=1e-4)
    assert (2, 3) in seen, seen
    torch._dynamo.reset()
