"""`module.to("tpu")` keeps Parameter objects, their gradients and hooks, as `.to("cuda")` does
(and as a CPU dtype conversion does): a reference held across the move stays live."""
import pytest
import torch
from torch import nn

import torchtpu
from conftest import EAGER_MODES, assert_same, assert_values


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_parameters_and_grads_keep_their_identity_across_moves(mode):
    m = _model()
    params = list(m.parameters())
    with torchtpu.eager_mode(mode):
        m.to("tpu")
        assert all(p is q for p, q in zip(params, m.parameters()))
        assert all(p.device.type == "tpu" and isinstance(p, nn.Parameter) for p in params)
        m(torch.randn(3, 4, device="tpu")).sum().backward()
        grads = [p.grad for p in params]
        assert all(g is not None and g.device.type == "tpu" for g in grads)
        m.to("cpu")
    assert all(p is q for p, q in zip(params, m.parameters()))
    assert all(p.grad is g and g.device.type == "cpu" for p, g in zip(params, grads))


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_optimizer_built_before_the_move_trains_the_model(mode):
    # the order many scripts use: the optimizer holds the parameters, then the model moves
    ref, m = _model(), _model()
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    with torchtpu.eager_mode(mode):
        m.to("tpu")
        xt, yt = x.to("tpu"), y.to("tpu")
        for _ in range(3):
            opt_ref.zero_grad()
            nn.functional.mse_loss(ref(x), y).backward()
            opt_ref.step()
            opt.zero_grad()
            nn.functional.mse_loss(m(xt), yt).backward()
            opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert_same(p.detach(), q.detach())
    assert all(s["exp_avg"].device.type == "tpu" for s in opt.state.values())


def test_hooks_and_held_references_survive_the_move():
    m = _model()
    w = m[0].weight
    seen = []
    w.register_hook(lambda g: seen.append(g.device.type))
    m.to("tpu")
    m(torch.randn(2, 4, device="tpu")).sum().backward()
    assert seen == ["tpu"]
    assert w.grad is m[0].weight.grad
    with torch.no_grad():
        m[0].weight.add_(1.0)
    assert_values(w.detach(), m[0].weight.detach())  # the same tpu tensor's values


def test_what_cpu_and_cuda_replace_is_still_replaced():
    # buffers are reassigned by Module._apply on every device; the overwrite flag still makes
    # new Parameters; a meta model's to_empty gets new ones (meta is not a dense backend)
    m = nn.BatchNorm1d(3)
    buf, w = m.running_mean, m.weight
    m.to("tpu")
    assert m.running_mean is not buf and m.weight is w
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        m.to("cpu")
        assert m.weight is not w
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    with torch.device("meta"):
        lin = nn.Linear(2, 2)
    mw = lin.weight
    lin.to_empty(device="tpu")
    assert lin.weight is not mw and lin.weight.device.type == "tpu"


def test_data_assignment_between_cpu_and_tpu():
    p = nn.Parameter(torch.zeros(3))
    p.data = torch.arange(3.0, device="tpu")
    assert p.device.type == "tpu" and p.requires_grad
    assert_same(p.detach(), torch.arange(3.0))
    assert torch._has_compatible_shallow_copy_type(p, torch.zeros(1))
    assert not torch._has_compatible_shallow_copy_type(p, torch.zeros(1, device="meta"))
    # as on CPU: a tensor that requires grad cannot take integer data
    with pytest.raises(RuntimeError, match="floating point or complex"):
        p.data = torch.arange(3, device="tpu")


@pytest.mark.parametrize("mode", EAGER_MODES)
@pytest.mark.parametrize("cls,args,shape", [
    (nn.LazyLinear, (3,), (2, 5)),
    (nn.LazyConv2d, (4, 3), (2, 3, 8, 8)),
    (nn.LazyBatchNorm1d, (), (4, 6)),
])
def test_lazy_module_moved_before_its_first_forward(mode, cls, args, shape):
    # CUDA's documented order: build a lazy module, move it, let the first forward size it.
    # The move copies an UninitializedParameter, whose `shape` raises until then.
    m = cls(*args)
    with torchtpu.eager_mode(mode):
        m.to("tpu")
        assert isinstance(m.weight, nn.UninitializedParameter) and m.weight.device.type == "tpu"
        x = torch.randn(shape)
        y = m(x.to("tpu"))
        assert type(m.weight) is nn.Parameter and m.weight.device.type == "tpu"
        ref = cls(*args)
        ref(x)  # sizes it on CPU; then the tpu module's values, to compare the computation
        ref.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
        if isinstance(ref, nn.modules.batchnorm._BatchNorm):  # its running stats moved once already
            ref.running_mean.zero_(), ref.running_var.fill_(1), ref.num_batches_tracked.zero_()
        assert_same(y, ref(x), atol=1e-5, rtol=1e-5)
