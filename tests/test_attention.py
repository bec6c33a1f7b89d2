"""F.scaled_dot_product_attention on tpu: one fused op forward and one backward, against
CPU PyTorch, and the calls the fused pair cannot serve still matching through the composite."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same, check

F32 = dict(atol=1e-5, rtol=1e-4)
F64 = dict(atol=1e-12, rtol=1e-10)  # double's backward rebuilds probabilities from a double log-sum-exp
LOW = dict(atol=2e-2, rtol=2e-2)


def _mask(kind, B, L, S, dtype):
    if kind == "bool":
        m = torch.rand(L, S) > 0.3
        m[:, 0] = True
        return m
    if kind == "bool_rows_masked":  # some rows see no key at all: PyTorch gives them zeros
        m = torch.rand(B, 1, L, S) > 0.5
        m[0, 0, 0] = False
        return m
    if kind == "float":
        return torch.randn(B, 1, 1, S).to(dtype)
    return None


def _compare(B, H, L, S, E, *, Ev=None, Hk=None, dtype=torch.float32, mask=None, **kw):
    """CPU vs tpu output and q/k/v gradients (conftest.check; the mask needs none); returns the
    tpu executions forward+backward."""
    Hk = Hk or H
    q = torch.randn(B, H, L, E).to(dtype)
    k = torch.randn(B, Hk, S, E).to(dtype)
    v = torch.randn(B, Hk, S, Ev or E).to(dtype)
    m = _mask(mask, B, L, S, dtype)
    tol = {torch.float32: F32, torch.float64: F64}.get(dtype, LOW)
    torchtpu.reset_metrics()
    check(F.scaled_dot_product_attention, q, k, v, attn_mask=m, grad=(0, 1, 2), **tol, **kw)
    torch.tpu.synchronize()
    return _ops_run()


def _ops_run() -> int:
    """Ops run on tpu since the last reset: executables in strict, recorded ops in defer_and_fuse."""
    m = torchtpu.metrics()
    return m["region_ops"] if torchtpu.get_eager_mode() == "defer_and_fuse" else m["executions"]


@pytest.mark.parametrize("case", [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, L=3, S=7),  # causal masks are top-left aligned, as PyTorch's
    dict(is_causal=True, L=7, S=3),
    dict(mask="bool"),
    dict(mask="bool_rows_masked"),
    dict(mask="float"),
    dict(Ev=8),
    dict(scale=0.3),
    dict(dtype=torch.bfloat16, is_causal=True),
    dict(dtype=torch.float16, mask="float"),
    dict(dtype=torch.float64, mask="float"),
    dict(Hk=2, enable_gqa=True),  # grouped-query heads, no mask: queries packed per key head
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_sdpa_is_one_fused_op_each_way_and_matches_cpu(no_fallback, case):
    case = dict(case)
    shape = dict(B=2, H=4, L=case.pop("L", 8), S=case.pop("S", 6), E=16)
    # forward and backward are one executable each (the math path ran 16)
    assert _compare(**shape, **case) == 2


@pytest.mark.parametrize("case", [
    dict(Hk=2, enable_gqa=True, mask="bool"),  # grouped-query heads with a mask
    dict(Hk=2, enable_gqa=True, is_causal=True),  # a causal prefill or training step
    dict(Hk=1, enable_gqa=True, is_causal=True, L=7, S=3),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_sdpa_grouped_query_heads_repeat_keys_for_the_fused_op(no_fallback, case):
    """Grouped-query heads the packing cannot serve: the key/value heads repeated for their
    queries (PyTorch's composite does the same) and the fused pair after them; the math path
    ran 20 and more executables."""
    case = dict(case)
    shape = dict(B=2, H=4, L=case.pop("L", 8), S=case.pop("S", 6), E=16)
    assert _compare(**shape, **case) == 6  # two repeats, the fused pair, two sums of the repeats


@pytest.mark.parametrize("case", [
    dict(dropout_p=0.0, mask="float", mask_grad=True),
])
def test_sdpa_calls_the_fused_op_cannot_serve_take_the_composite(no_fallback, case):
    case = dict(case)
    if case.pop("mask_grad", False):
        # a mask that needs a gradient: the fused pair has no mask gradient
        q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
        check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v,
              torch.randn(1, 1, 4, 4), grad=(3,), **F32)
        return
    assert _compare(2, 4, 8, 6, 16, **case) > 2


def test_sdpa_dropout_trains_through_the_composite(no_fallback):
    q = torch.randn(2, 2, 8, 8, device="tpu", requires_grad=True)
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    out.sum().backward()
    assert q.grad.shape == q.shape and torch.isfinite(q.grad.cpu()).all()


def test_sdpa_with_a_growing_kv_cache_compiles_one_attention_per_length(no_fallback):
    q = torch.randn(1, 4, 1, 16, device="tpu")
    k = torch.randn(1, 4, 1, 16, device="tpu")
    torchtpu.reset_metrics()
    for _ in range(6):
        k = torch.cat([k, torch.randn(1, 4, 1, 16).to("tpu")], dim=2)
        out = F.scaled_dot_product_attention(q, k, k)
    ref = F.scaled_dot_product_attention(q.cpu(), k.cpu(), k.cpu())
    assert_same(out, ref, **F32)
    # per length: the cat and one attention (the math path compiled five ops per length)
    assert torchtpu.metrics()["compiles"] <= 2 * 6 + 1


@pytest.mark.parametrize("ctx", [torch.inference_mode, torch.no_grad])
def test_sdpa_is_fused_without_autograd_too(no_fallback, ctx):
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    ref = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    with ctx():
        torchtpu.reset_metrics()
        out = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), k.to("tpu"), is_causal=True)
        assert_same(out, ref, **F32)
        assert _ops_run() == 1


def test_sdpa_mask_dtypes_follow_pytorchs_rules():
    q = torch.randn(2, 4, 8, 16).to(torch.bfloat16)
    tq = q.to("tpu")
    m = torch.randn(8, 8)  # a float32 mask with a bf16 query: allowed (the composite)
    ref = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    assert_same(F.scaled_dot_product_attention(tq, tq, tq, attn_mask=m.to("tpu")), ref, **LOW)
    for bad in (m.half(), m.long()):
        with pytest.raises(RuntimeError, match="Expected attn_mask dtype to be bool or float"):
            F.scaled_dot_product_attention(tq, tq, tq, attn_mask=bad.to("tpu"))


@pytest.mark.slow
def test_compiled_sdpa_is_one_op_and_keeps_a_narrower_value_head():
    """torch.compile traces sdpa into the fused op (one attention op in the graph), except
    where PyTorch's fake kernel would give the output the query's head dim: an MLA value
    narrower than query and key takes the composite, so the shape the next traced op sees
    is right (sarvam_mla's o_proj)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 5, 64, generator=g), torch.randn(1, 4, 5, 64, generator=g)
    w = torch.randn(256, 3, generator=g)
    for v in (torch.randn(1, 4, 5, 64, generator=g), torch.randn(1, 4, 5, 32, generator=g)):
        def f(q, k, v, w):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return out.transpose(1, 2).reshape(1, 5, -1) @ w[:out.shape[1] * out.shape[-1]]

        torch._dynamo.reset()
        got = torch.compile(f, backend="tpu")(*(t.to("tpu") for t in (q, k, v, w)))
        assert_same(got, f(q, k, v, w), atol=1e-5, rtol=1e-5)
