"""Kernel libraries through torchtpu.jax_op (the `kernels` extra): Tokamax's attention,
normalization and gated linear unit against the PyTorch functions they replace, forward and
backward on CPU; a Helion kernel (Pallas backend) running on tpu tensors."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same, atol_by_scale, check_against

TOL = dict(rtol=1e-5, atol=atol_by_scale(1e-5))  # float32, against the reference's scale


def test_tokamax_attention_matches_sdpa(no_fallback):
    pytest.importorskip("tokamax", reason="tokamax is not installed (pip install torchtpu[kernels])")
    from torchtpu.kernels import tokamax as tk

    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    torchtpu.reset_metrics()
    check_against(lambda q, k, v: tk.attention(q, k, v, is_causal=True),
                  lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v,
                  grad=True, **TOL)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    check_against(lambda q, k, v, m: tk.attention(q, k, v, m, scale=0.3),
                  lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.3), q, k, v, mask,
                  grad=True, **TOL)
    assert torchtpu.metrics()["cpu_fallbacks"] == 0


def test_tokamax_norms_and_swiglu_match_pytorch(no_fallback):
    pytest.importorskip("tokamax", reason="tokamax is not installed (pip install torchtpu[kernels])")
    from torchtpu.kernels import tokamax as tk

    x, w, b = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    check_against(lambda x, w, b: tk.layer_norm(x, w, b, eps=1e-5),
                  lambda x, w, b: F.layer_norm(x, (16,), w, b, 1e-5), x, w, b, grad=True, **TOL)
    check_against(lambda x, w: tk.rms_norm(x, w, eps=1e-6), lambda x, w: F.rms_norm(x, (16,), w, 1e-6), x, w,
                  grad=True, **TOL)
    wg, wu = torch.randn(16, 6), torch.randn(16, 6)
    check_against(tk.swiglu, lambda x, wg, wu: F.silu(x @ wg) * (x @ wu), x, wg, wu, grad=True, **TOL)


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
            assert_same(out, x * 2 + y + 1, **TOL)
