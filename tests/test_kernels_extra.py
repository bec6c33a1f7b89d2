"""Kernel libraries through torchtpu.jax_op (the `kernels` extra): Tokamax's attention,
normalization and gated linear unit against the PyTorch functions they replace, forward and
backward on CPU; a Helion kernel (Pallas backend) running on tpu tensors."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))


def _check(fn, ref, *inputs, grad=True):
    dev = [None if t is None else t.to("tpu").requires_grad_(grad and t.is_floating_point()) for t in inputs]
    cpu = [None if t is None else t.clone().requires_grad_(grad and t.is_floating_point()) for t in inputs]
    y, yc = fn(*dev), ref(*cpu)
    assert y.device.type == "tpu" and y.dtype == yc.dtype and y.shape == yc.shape
    _close(y.cpu(), yc.detach())
    if grad:
        g = torch.randn(yc.shape)
        y.backward(g.to("tpu"))
        yc.backward(g)
        for d, c in zip(dev, cpu):
            if c is not None and c.requires_grad:
                _close(d.grad.cpu(), c.grad)


def test_tokamax_attention_matches_sdpa(no_fallback):
    pytest.importorskip("tokamax", reason="tokamax is not installed (pip install torchtpu[kernels])")
    from torchtpu.kernels import tokamax as tk

    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    torchtpu.reset_metrics()
    _check(lambda q, k, v: tk.attention(q, k, v, is_causal=True),
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    _check(lambda q, k, v, m: tk.attention(q, k, v, m, scale=0.3),
           lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.3), q, k, v, mask)
    assert torchtpu.metrics()["cpu_fallbacks"] == 0


def test_tokamax_norms_and_swiglu_match_pytorch(no_fallback):
    pytest.importorskip("tokamax", reason="tokamax is not installed (pip install torchtpu[kernels])")
    from torchtpu.kernels import tokamax as tk

    x, w, b = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    _check(lambda x, w, b: tk.layer_norm(x, w, b, eps=1e-5), lambda x, w, b: F.layer_norm(x, (16,), w, b, 1e-5),
           x, w, b)
    _check(lambda x, w: tk.rms_norm(x, w, eps=1e-6), lambda x, w: F.rms_norm(x, (16,), w, 1e-6), x, w)
    wg, wu = torch.randn(16, 6), torch.randn(16, 6)
    _check(tk.swiglu, lambda x, wg, wu: F.silu(x @ wg) * (x @ wu), x, wg, wu)


try:  # a Helion kernel lives at module level: Helion refuses closures
    import helion
    import helion.language as hl
except ImportError:
    helion = None
else:
    @helion.kernel(backend="pallas", pallas_interpret=True, static_shapes=True,
                   config=helion.Config(block_sizes=[8, 8]))
    def _scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(out.size()):
            out[tile] = x[tile] * 2.0 + y[tile]
        return out


@pytest.mark.skipif(helion is None, reason="helion is not installed (pip install torchtpu[kernels])")
def test_helion_kernel_runs_on_tpu_tensors(no_fallback):
    from torchtpu.kernels.helion import helion_op

    op = helion_op("helion_test::scaled_add", _scaled_add)
    x, y = torch.randn(16, 16), torch.randn(16, 16)
    for mode in ("strict", "defer_and_fuse"):
        with torchtpu.eager_mode(mode):
            out = op(x.to("tpu"), y.to("tpu")) + 1
            _close(out.cpu(), x * 2 + y + 1)
