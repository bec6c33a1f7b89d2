"""FlexAttention on tpu, forward and backward, in strict, defer_and_fuse and compiled modes,
against F.scaled_dot_product_attention on CPU with the equivalent mask (CPU's own
flex_attention has no backward), and against CPU flex_attention's forward."""
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torchtpu
from conftest import assert_same

B, H, S, E = 2, 2, 16, 8
WINDOW = 4


def _alibi_slopes():
    return torch.tensor([2.0 ** -(i + 1) for i in range(H)])


def _docs():
    return torch.tensor([0] * 5 + [1] * 7 + [2] * 4)


# (mask_mod or None, score_mod or None, dense CPU mask for SDPA): each case builds its
# mods over tensors on `dev`
def causal_case(dev):
    def mask(b, h, q, kv):
        return q >= kv

    return mask, None, torch.ones(S, S, dtype=torch.bool).tril()


def sliding_window_case(dev):
    def mask(b, h, q, kv):
        return (q >= kv) & (q - kv < WINDOW)

    q = torch.arange(S)[:, None]
    kv = torch.arange(S)[None, :]
    return mask, None, (q >= kv) & (q - kv < WINDOW)


def document_case(dev):
    docs = _docs().to(dev)  # closed over by mask_mod: a captured buffer

    def mask(b, h, q, kv):
        return (docs[q] == docs[kv]) & (q >= kv)

    d = _docs()
    return mask, None, (d[:, None] == d[None, :]) & torch.ones(S, S, dtype=torch.bool).tril()


def alibi_case(dev):
    slopes = _alibi_slopes().to(dev)

    def score(s, b, h, q, kv):
        return s + slopes[h] * (kv - q)

    def mask(b, h, q, kv):
        return q >= kv

    q = torch.arange(S)[:, None]
    kv = torch.arange(S)[None, :]
    bias = _alibi_slopes()[:, None, None] * (kv - q)[None].float()
    dense = torch.where(q >= kv, bias, torch.tensor(-float("inf")))
    return mask, score, dense


CASES = {"causal": causal_case, "sliding_window": sliding_window_case, "document": document_case,
         "alibi": alibi_case}


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, E, generator=g) for _ in range(3)]


def _reference(case):
    q, k, v = [t.requires_grad_() for t in _inputs()]
    _, _, dense = CASES[case]("cpu")
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    (out * _weights(out)).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]


def _weights(out):
    return torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)


def _flex(q, k, v, block_mask, score_mod):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)


# every mask compiled; the eager modes run PyTorch's own dense path op by op (slower to
# compile), two masks of them in the fast suite
_SLOW = pytest.mark.slow
PARAMS = [("causal", "strict"), ("causal", "defer_and_fuse"), ("document", "defer_and_fuse")] + [
    (c, "compile") for c in CASES] + [
    pytest.param(c, m, marks=_SLOW) for c, m in [("sliding_window", "strict"), ("document", "strict"),
                                                 ("alibi", "strict"), ("sliding_window", "defer_and_fuse"),
                                                 ("alibi", "defer_and_fuse")]]


@pytest.mark.parametrize("case,mode", PARAMS)
def test_flex_attention_matches_sdpa(case, mode):
    want, want_grads = _reference(case)
    mask, score, _ = CASES[case]("tpu")
    q, k, v = [t.to("tpu").requires_grad_() for t in _inputs()]
    fn = _flex
    if mode == "compile":
        torch._dynamo.reset()
        counters.clear()
        fn = torch.compile(_flex, backend="tpu", fullgraph=True)
    before = torchtpu.metrics()["cpu_fallbacks"]
    with torchtpu.eager_mode("strict" if mode == "compile" else mode):
        block_mask = create_block_mask(mask, None, None, S, S, device="tpu")
        out = fn(q, k, v, block_mask, score)
        (out * _weights(out)).sum().backward()
    assert out.device.type == "tpu" and out.dtype == torch.float32
    assert_same(out, want, atol=1e-5, rtol=1e-5)
    for t, g in zip((q, k, v), want_grads):
        assert_same(t.grad, g, atol=1e-5, rtol=1e-5)
    assert torchtpu.metrics()["cpu_fallbacks"] == before
    if mode == "compile":
        assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("mode", [pytest.param("strict", marks=pytest.mark.slow), "compile"])
def test_flex_attention_forward_matches_cpu_flex(mode):
    """The same call on CPU (inference: CPU flex has no backward) and on tpu."""
    def run(dev, compiled):
        mask, score, _ = CASES["alibi"](dev)
        q, k, v = [t.to(dev) for t in _inputs()]
        bm = create_block_mask(mask, None, None, S, S, device=dev)
        fn = torch.compile(_flex, backend="tpu", fullgraph=True) if compiled else _flex
        with torch.no_grad():
            return fn(q, k, v, bm, score)

    want = run("cpu", False)
    torch._dynamo.reset()
    got = run("tpu", mode == "compile")
    assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
    assert_same(got, want, atol=1e-5, rtol=1e-5)


def test_flex_attention_gqa_and_buffer_gradient_compiled():
    """Grouped-query heads, and a learnable bias table read by score_mod gets its gradient."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, S, E, generator=g)
    k, v = torch.randn(1, 2, S, E, generator=g), torch.randn(1, 2, S, E, generator=g)
    bias = torch.randn(4, generator=g)

    def reference(q, k, v, bias):
        kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        qi, ki = torch.arange(S)[:, None], torch.arange(S)[None, :]
        m = torch.where(qi >= ki, bias[:, None, None] * 0.1 * (qi - ki), torch.tensor(-float("inf")))
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=m)

    def flex(q, k, v, bias, bm):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + bias[h] * 0.1 * (qi - ki),
                              block_mask=bm, enable_gqa=True)

    cpu = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    want = reference(*cpu)
    (want * _weights(want)).sum().backward()
    tpu = [t.to("tpu").requires_grad_() for t in (q, k, v, bias)]
    bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="tpu")
    torch._dynamo.reset()
    got = torch.compile(flex, backend="tpu", fullgraph=True)(*tpu, bm)
    (got * _weights(got)).sum().backward()
    assert_same(got, want.detach(), atol=1e-5, rtol=1e-5)
    for a, b in zip(tpu, cpu):
        assert_same(a.grad, b.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_transformers_llama_flex_attention_compiled(monkeypatch):
    """A tiny Llama with attn_implementation="flex_attention" under torch.compile(backend="tpu"):
    logits, loss and gradients match the same weights with SDPA on CPU. Transformers 5.24 turns
    its flex path off when the host accelerator is "tpu" (torch's flex_attention used to refuse
    tpu tensors; import_utils.is_torch_flex_attn_available), so the test lifts that gate."""
    transformers = pytest.importorskip("transformers")
    import torch.nn.attention.flex_attention as fa
    import transformers.integrations.flex_attention as tfa
    import transformers.masking_utils as mu
    import transformers.modeling_utils as mdu

    for mod in (mu, mdu, tfa):
        monkeypatch.setattr(mod, "is_torch_flex_attn_available", lambda: True, raising=False)
    for name in ("BlockMask", "create_block_mask", "flex_attention", "AuxRequest"):
        for mod in (mu, tfa):
            monkeypatch.setattr(mod, name, getattr(fa, name), raising=False)
    monkeypatch.setattr(tfa, "flex_default_block_size", fa._DEFAULT_SPARSE_BLOCK_SIZE, raising=False)

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ref = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(0, 64, (2, 12))
    want = ref(ids, labels=ids)
    want.loss.backward()
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="flex_attention")
    model.load_state_dict(ref.state_dict())
    model = model.to("tpu").eval()
    assert model.config._attn_implementation == "flex_attention"
    before = torchtpu.metrics()["cpu_fallbacks"]
    torch._dynamo.reset()
    got = torch.compile(model, backend="tpu")(ids.to("tpu"), labels=ids.to("tpu"))
    got.loss.backward()
    assert_same(got.logits, want.logits.detach(), atol=1e-5, rtol=1e-5)
    assert_same(got.loss, want.loss.detach(), atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_same(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert torchtpu.metrics()["cpu_fallbacks"] == before
