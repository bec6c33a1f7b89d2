"""torch.autocast("tpu"): CUDA's op policy, checked op by op against CPU PyTorch.

The oracle for an op under autocast is what CUDA autocast does: run the op on CPU, without
autocast, on inputs cast the way the policy says; values, dtype and exception class must match.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same, assert_values
from torchtpu.device import autocast as policy

aten = torch.ops.aten
BF16 = torch.bfloat16


def _g(*shape, lo=None):
    t = torch.randn(*shape)
    return t.abs() + 0.5 if lo == "pos" else (t.clamp(-0.9, 0.9) if lo == "unit" else t)


def _i(hi, *shape):
    return torch.randint(0, hi, shape)


# op name in the policy table -> (the overload's call, its CPU sample args)
SAMPLES = {
    "_convolution.deprecated": lambda: (_g(1, 2, 5, 5), _g(3, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                        False, False, True),
    "_convolution": lambda: (_g(1, 2, 5, 5), _g(3, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, False,
                             False, True, True),
    "conv1d": lambda: (_g(1, 2, 6), _g(3, 2, 3)),
    "conv2d": lambda: (_g(1, 2, 5, 5), _g(3, 2, 3, 3), _g(3)),
    "conv3d": lambda: (_g(1, 2, 4, 4, 4), _g(3, 2, 2, 2, 2)),
    "conv_tbc": lambda: (_g(5, 1, 2), _g(3, 2, 4), _g(4)),
    "conv_transpose1d": lambda: (_g(1, 2, 5), _g(2, 3, 3)),
    "conv_transpose2d.input": lambda: (_g(1, 2, 4, 4), _g(2, 3, 3, 3)),
    "conv_transpose3d.input": lambda: (_g(1, 2, 3, 3, 3), _g(2, 3, 2, 2, 2)),
    "convolution": lambda: (_g(1, 2, 5, 5), _g(3, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    "prelu": lambda: (_g(2, 3, 4), _g(3)),
    "addmm": lambda: (_g(3, 5), _g(3, 4), _g(4, 5)),
    "addmv": lambda: (_g(3), _g(3, 4), _g(4)),
    "addr": lambda: (_g(3, 4), _g(3), _g(4)),
    "matmul": lambda: (_g(2, 3, 4), _g(4, 5)),
    "einsum": lambda: ("ij,jk->ik", [_g(3, 4), _g(4, 5)]),
    "mm": lambda: (_g(3, 4), _g(4, 5)),
    "mv": lambda: (_g(3, 4), _g(4)),
    "linalg_vecdot": lambda: (_g(3, 4), _g(3, 4)),
    "linear": lambda: (_g(3, 4), _g(5, 4), _g(5)),
    "addbmm": lambda: (_g(3, 5), _g(2, 3, 4), _g(2, 4, 5)),
    "baddbmm": lambda: (_g(2, 3, 5), _g(2, 3, 4), _g(2, 4, 5)),
    "bmm": lambda: (_g(2, 3, 4), _g(2, 4, 5)),
    "chain_matmul": lambda: ([_g(3, 4), _g(4, 5), _g(5, 2)],),
    "linalg_multi_dot": lambda: ([_g(3, 4), _g(4, 5), _g(5, 2)],),
    "_thnn_fused_lstm_cell": lambda: (_g(2, 12), _g(2, 12), _g(2, 3)),
    "_thnn_fused_gru_cell": lambda: (_g(2, 9), _g(2, 9), _g(2, 3)),
    "lstm_cell": lambda: (_g(2, 4), [_g(2, 3), _g(2, 3)], _g(12, 4), _g(12, 3), _g(12), _g(12)),
    "gru_cell": lambda: (_g(2, 4), _g(2, 3), _g(9, 4), _g(9, 3), _g(9), _g(9)),
    "rnn_tanh_cell": lambda: (_g(2, 4), _g(2, 3), _g(3, 4), _g(3, 3), _g(3), _g(3)),
    "rnn_relu_cell": lambda: (_g(2, 4), _g(2, 3), _g(3, 4), _g(3, 3), _g(3), _g(3)),
    "_scaled_dot_product_flash_attention": lambda: (_g(1, 2, 4, 8), _g(1, 2, 4, 8), _g(1, 2, 4, 8)),
    "scaled_dot_product_attention": lambda: (_g(1, 2, 4, 8), _g(1, 2, 4, 8), _g(1, 2, 4, 8)),
    # fp32
    "acos": lambda: (_g(3, 4, lo="unit"),),
    "asin": lambda: (_g(3, 4, lo="unit"),),
    "cosh": lambda: (_g(3, 4),),
    "erfinv": lambda: (_g(3, 4, lo="unit"),),
    "exp": lambda: (_g(3, 4),),
    "expm1": lambda: (_g(3, 4),),
    "log": lambda: (_g(3, 4, lo="pos"),),
    "log10": lambda: (_g(3, 4, lo="pos"),),
    "log2": lambda: (_g(3, 4, lo="pos"),),
    "log1p": lambda: (_g(3, 4, lo="pos"),),
    "reciprocal": lambda: (_g(3, 4, lo="pos"),),
    "rsqrt": lambda: (_g(3, 4, lo="pos"),),
    "sinh": lambda: (_g(3, 4),),
    "tan": lambda: (_g(3, 4, lo="unit"),),
    "pow.Tensor_Scalar": lambda: (_g(3, 4, lo="pos"), 2.5),
    "pow.Tensor_Tensor": lambda: (_g(3, 4, lo="pos"), _g(3, 4)),
    "pow.Scalar": lambda: (2.0, _g(3, 4)),
    "softplus": lambda: (_g(3, 4),),
    "layer_norm": lambda: (_g(3, 4), [4], _g(4), _g(4)),
    "native_layer_norm": lambda: (_g(3, 4), [4], _g(4), _g(4), 1e-5),
    "rms_norm": lambda: (_g(3, 4), [4], _g(4)),
    "group_norm": lambda: (_g(2, 4, 3), 2, _g(4), _g(4)),
    "frobenius_norm.dim": lambda: (_g(3, 4), [1]),
    "nuclear_norm": lambda: (_g(3, 4),),
    "nuclear_norm.dim": lambda: (_g(3, 4), [0, 1]),
    "cosine_similarity": lambda: (_g(3, 4), _g(3, 4)),
    "poisson_nll_loss": lambda: (_g(3, 4), _g(3, 4, lo="pos"), True, False, 1e-8, 1),
    "cosine_embedding_loss": lambda: (_g(3, 4), _g(3, 4), torch.tensor([1.0, -1.0, 1.0])),
    "nll_loss": lambda: (_g(3, 4).log_softmax(-1), _i(4, 3)),
    "nll_loss2d": lambda: (_g(2, 4, 3, 3).log_softmax(1), _i(4, 2, 3, 3)),
    "hinge_embedding_loss": lambda: (_g(3, 4), torch.ones(3, 4)),
    "kl_div": lambda: (_g(3, 4).log_softmax(-1), _g(3, 4).softmax(-1)),
    "l1_loss": lambda: (_g(3, 4), _g(3, 4)),
    "smooth_l1_loss": lambda: (_g(3, 4), _g(3, 4)),
    "huber_loss": lambda: (_g(3, 4), _g(3, 4)),
    "mse_loss": lambda: (_g(3, 4), _g(3, 4)),
    "margin_ranking_loss": lambda: (_g(3), _g(3), torch.tensor([1.0, -1.0, 1.0])),
    "multilabel_margin_loss": lambda: (_g(3, 4), torch.tensor([[1, 0, -1, 0], [2, -1, 0, 0], [3, 1, -1, 0]])),
    "soft_margin_loss": lambda: (_g(3, 4), torch.ones(3, 4)),
    "triplet_margin_loss": lambda: (_g(3, 4), _g(3, 4), _g(3, 4)),
    "multi_margin_loss": lambda: (_g(3, 4), _i(4, 3)),
    "binary_cross_entropy_with_logits": lambda: (_g(3, 4), _g(3, 4).sigmoid()),
    "dist": lambda: (_g(3, 4), _g(3, 4)),
    "pdist": lambda: (_g(3, 4),),
    "cdist": lambda: (_g(3, 4), _g(2, 4)),
    "renorm": lambda: (_g(3, 4), 2, 0, 1.0),
    "logsumexp": lambda: (_g(3, 4), [1]),
    "upsample_nearest1d": lambda: (_g(1, 2, 3), [6]),
    "_upsample_nearest_exact1d": lambda: (_g(1, 2, 3), [6]),
    "upsample_nearest2d": lambda: (_g(1, 2, 3, 3), [6, 6]),
    "_upsample_nearest_exact2d": lambda: (_g(1, 2, 3, 3), [6, 6]),
    "upsample_nearest3d": lambda: (_g(1, 1, 2, 2, 2), [4, 4, 4]),
    "_upsample_nearest_exact3d": lambda: (_g(1, 1, 2, 2, 2), [4, 4, 4]),
    "upsample_linear1d": lambda: (_g(1, 2, 3), [6], False),
    "upsample_bilinear2d": lambda: (_g(1, 2, 3, 3), [6, 6], False),
    "_upsample_bilinear2d_aa": lambda: (_g(1, 2, 3, 3), [6, 6], False),
    "upsample_trilinear3d": lambda: (_g(1, 1, 2, 2, 2), [4, 4, 4], False),
    "upsample_bicubic2d": lambda: (_g(1, 2, 3, 3), [6, 6], False),
    "_upsample_bicubic2d_aa": lambda: (_g(1, 2, 3, 3), [6, 6], False),
    # fp32_set_opt_dtype
    "prod": lambda: (_g(3, 4, lo="pos"),),
    "prod.dim_int": lambda: (_g(3, 4, lo="pos"), 1),
    "softmax.int": lambda: (_g(3, 4), 1),
    "log_softmax.int": lambda: (_g(3, 4), 1),
    "cumprod": lambda: (_g(3, 4, lo="pos"), 1),
    "cumsum": lambda: (_g(3, 4), 1),
    "linalg_vector_norm": lambda: (_g(3, 4),),
    "linalg_matrix_norm": lambda: (_g(3, 4), 1),
    "linalg_matrix_norm.str_ord": lambda: (_g(3, 4),),
    "sum": lambda: (_g(3, 4),),
    "sum.dim_IntList": lambda: (_g(3, 4), [1]),
    # fp32_append_dtype
    "norm.Scalar": lambda: (_g(3, 4),),
    "norm.ScalarOpt_dim": lambda: (_g(3, 4), 2, [1]),
    # promote (mixed bf16 / float32 inputs)
    "addcdiv": lambda: (_g(3, 4), _g(3, 4).to(BF16), _g(3, 4, lo="pos")),
    "addcmul": lambda: (_g(3, 4), _g(3, 4).to(BF16), _g(3, 4)),
    "atan2": lambda: (_g(3, 4).to(BF16), _g(3, 4)),
    "bilinear": lambda: (_g(2, 3).to(BF16), _g(2, 4), _g(5, 3, 4), _g(5)),
    "cross": lambda: (_g(2, 3).to(BF16), _g(2, 3)),
    "dot": lambda: (_g(4).to(BF16), _g(4)),
    "vdot": lambda: (_g(4).to(BF16), _g(4)),
    "grid_sampler": lambda: (_g(1, 2, 3, 3).to(BF16), _g(1, 2, 2, 2, lo="unit"), 0, 0, False),
    "index_put": lambda: (_g(4, 3).to(BF16), [torch.tensor([0, 2])], _g(2, 3)),
    "tensordot": lambda: (_g(3, 4).to(BF16), _g(4, 5), [1], [0]),
    "scatter_add": lambda: (_g(3, 4).to(BF16), 1, torch.tensor([[0, 1], [1, 2], [3, 0]]), _g(3, 2)),
}


def _call(name):
    return policy._overload(name)


def _cast(v, dtype):
    if isinstance(v, torch.Tensor):
        return v.to(dtype) if v.is_floating_point() and v.dtype != torch.float64 else v
    if isinstance(v, list):
        return [_cast(x, dtype) for x in v]
    return v


def _tpu(v):
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, list):
        return [_tpu(x) for x in v]
    return v


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _oracle(name, args):
    """What CUDA autocast runs: the op on inputs cast per the policy, with autocast off."""
    op, kind = _call(name), policy.POLICY[name]
    if kind == policy.LOWER:
        return op(*_cast(list(args), BF16))
    if kind == policy.FP32:
        return op(*_cast(list(args), torch.float32))
    if kind == policy.FP32_SET_OPT_DTYPE:
        return op(*args, dtype=torch.float32)
    if kind == policy.FP32_APPEND_DTYPE:
        full = list(args) + [a.default_value for a in _call(name)._schema.arguments[len(args):]]
        return policy._overload(policy._APPEND_DTYPE[name])(*full, dtype=torch.float32)
    return op(*_cast(list(args), torch.float32))  # promote: the samples mix bf16 and float32


def test_samples_cover_the_policy_table():
    assert set(SAMPLES) == set(policy.POLICY)


@pytest.mark.parametrize("kind", [policy.LOWER, policy.FP32, policy.FP32_SET_OPT_DTYPE,
                                  policy.FP32_APPEND_DTYPE, policy.PROMOTE])
def test_policy_op_by_op(kind):
    expected_dtype = BF16 if kind == policy.LOWER else torch.float32
    checked = 0
    for name, make in SAMPLES.items():
        if policy.POLICY[name] != kind:
            continue
        torch.manual_seed(0)
        args = make()
        try:
            want = _oracle(name, args)
        except NotImplementedError as err:
            if "from the 'CPU' backend" not in str(err):
                raise
            # a CUDA-only op: where tpu serves it (_thnn_fused_lstm_cell) there are no CPU
            # values to compare but the dtype follows the policy; else tpu raises as CPU does
            try:
                with torch.autocast("tpu", dtype=BF16):
                    out = _call(name)(*_tpu(list(args)))
            except NotImplementedError:
                continue
            assert _flat(out)[0].dtype == expected_dtype, name
            continue
        except RuntimeError as err:
            with pytest.raises(type(err)):
                with torch.autocast("tpu", dtype=BF16):
                    _call(name)(*_tpu(list(args)))
            continue
        with torch.autocast("tpu", dtype=BF16):
            got = _call(name)(*_tpu(list(args)))
        assert _flat(got)[0].dtype == expected_dtype, (name, _flat(got)[0].dtype)
        for w, g in zip(_flat(want), _flat(got)):
            if not isinstance(w, torch.Tensor):
                continue
            assert_same(g, w, atol=2e-2, rtol=2e-2, msg=name, equal_nan=True)
        checked += 1
    assert checked


def test_promote_all_lower_precision_stays_bf16():
    a, b = torch.randn(4, dtype=BF16, device="tpu"), torch.randn(4, dtype=BF16, device="tpu")
    with torch.autocast("tpu", dtype=BF16):
        assert torch.dot(a, b).dtype == BF16
        assert torch.dot(a, b.float()).dtype == torch.float32


def test_state_queries_nesting_and_disabled_regions():
    x, w = torch.randn(3, 4, device="tpu"), torch.randn(5, 4, device="tpu")
    assert not torch.is_autocast_enabled("tpu")
    with torch.autocast("tpu", dtype=BF16):
        assert torch.is_autocast_enabled("tpu") and torch.get_autocast_dtype("tpu") == BF16
        assert F.linear(x, w).dtype == BF16
        with torch.autocast("tpu", dtype=torch.float16):
            assert F.linear(x, w).dtype == torch.float16
        with torch.autocast("tpu", enabled=False):
            assert not torch.is_autocast_enabled("tpu")
            assert F.linear(x, w).dtype == torch.float32
        assert F.linear(x, w).dtype == BF16
        # ops off the lists keep their input dtype; float64 is never cast
        assert (x + 1).dtype == torch.float32
        assert F.linear(x.double(), w.double()).dtype == torch.float64
        # CPU tensors are not touched by tpu autocast
        assert F.linear(x.cpu(), w.cpu()).dtype == torch.float32
    assert F.linear(x, w).dtype == torch.float32
    assert not torch.is_autocast_enabled("tpu")


def test_banned_binary_cross_entropy():
    p, t = torch.rand(3, device="tpu"), torch.rand(3, device="tpu")
    with torch.autocast("tpu", dtype=BF16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, t)


@pytest.mark.parametrize("cache", [True, False])
def test_cache_enabled_gradients_match_cpu(cache):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)

    def run(m, x, dev):
        with torch.autocast(dev, dtype=BF16, cache_enabled=cache):
            y = m(m(x))  # the weight is used twice: one cached cast serves both
            assert torch.is_autocast_cache_enabled() == cache
        y.float().sum().backward()
        return y, m.weight.grad

    mt = copy.deepcopy(lin).to("tpu")
    y_cpu, g_cpu = run(lin, x, "cpu")
    y_tpu, g_tpu = run(mt, x.to("tpu"), "tpu")
    assert y_tpu.dtype == y_cpu.dtype == BF16
    assert_same(y_tpu, y_cpu, atol=2e-2, rtol=2e-2)
    assert g_tpu.dtype == torch.float32
    assert_same(g_tpu, g_cpu, atol=3e-2, rtol=3e-2)


def test_cache_sees_in_place_updates():
    w = torch.nn.Parameter(torch.ones(2, 2, device="tpu"))
    x = torch.ones(1, 2, device="tpu")
    with torch.autocast("tpu", dtype=BF16):
        a = F.linear(x, w)
        with torch.no_grad():
            w.mul_(2)
        b = F.linear(x, w)
    assert a.cpu().tolist() == [[2.0, 2.0]] and b.cpu().tolist() == [[4.0, 4.0]]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def _forward(m, x):
    with torch.autocast(x.device.type, dtype=BF16):
        y = m(x)
        return y, y.float().log_softmax(-1)


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_eager_modes(mode):
    m, x = _mlp(), torch.randn(5, 8)
    want = _forward(m, x)
    mt = copy.deepcopy(m).to("tpu")
    with torchtpu.eager_mode(mode):
        got = _forward(mt, x.to("tpu"))
        got[1].sum().backward()
    assert_same(got, want, atol=2e-2, rtol=2e-2)
    assert all(p.grad.dtype == torch.float32 for p in mt.parameters())


def test_compiled_inside_and_around():
    m, x = _mlp(), torch.randn(5, 8)
    want = _forward(m, x)
    mt, xt = copy.deepcopy(m).to("tpu"), x.to("tpu")
    inside = torch.compile(_forward, backend="tpu")(mt, xt)

    def plain(m, x):
        y = m(x)
        return y, y.float().log_softmax(-1)

    compiled = torch.compile(plain, backend="tpu")
    with torch.autocast("tpu", dtype=BF16):
        around = compiled(mt, xt)
    for got in (inside, around):
        assert_same(got, want, atol=2e-2, rtol=2e-2)


# --- a small GPT trained under autocast, against CPU autocast -------------------------------


def _gpt_losses(dev, mode=None, compiled=False, dtype=BF16, weights=None, steps=20):
    from torchtpu.bench.models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=32, layers=1, heads=2, max_len=16)
    if weights is not None:
        model = model.to(weights)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 64, (4, 4, 17), generator=g)

    def step(x, y):
        with torch.autocast(dev, dtype=dtype, enabled=weights is None):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        return loss

    fn = torch.compile(step, backend="tpu") if compiled else step
    losses = []
    with torchtpu.eager_mode(mode or "strict"):
        for i in range(steps):
            batch = data[i % 4].to(dev)
            loss = fn(batch[:, :-1], batch[:, 1:])
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        return [float(v) for v in torch.stack(losses).cpu()]


@pytest.fixture(scope="module")
def cpu_bf16_autocast_losses():
    return _gpt_losses("cpu")


@pytest.mark.parametrize("mode,compiled", [
    ("strict", False), pytest.param("defer_and_fuse", False, marks=pytest.mark.slow),
    pytest.param("debug", False, marks=pytest.mark.slow), pytest.param("strict", True, marks=pytest.mark.slow),
])
def test_gpt_20_steps_bf16_autocast_matches_cpu(cpu_bf16_autocast_losses, mode, compiled):
    got = _gpt_losses("tpu", mode, compiled)
    want = cpu_bf16_autocast_losses
    assert_values(got, want, rtol=2e-2, atol=0)  # the losses read back
    assert got[-1] < got[0]


def test_gpt_bf16_weights_with_adamw_match_cpu():
    want = _gpt_losses("cpu", weights=BF16, steps=10)
    got = _gpt_losses("tpu", weights=BF16, steps=10)
    assert_values(got, want, rtol=2e-2, atol=0)
    assert got[-1] < got[0]
