"""torch.amp.GradScaler("tpu"): the AMP kernels on the device, checked against CPU PyTorch."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same, assert_values


def _grads(dev):
    torch.manual_seed(0)
    gs = [torch.randn(3, 4), torch.randn(5).half(), torch.randn(2, 2).bfloat16(), torch.randn(4)]
    gs[3][1] = float("nan")
    return [g.to(dev) for g in gs]


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("with_inf", [False, True])
def test_unscale_kernel_matches_cpu(mode, with_inf):
    results = {}
    for dev in ("cpu", "tpu"):
        gs = _grads(dev)
        if not with_inf:
            gs = gs[:3]
        found = torch.zeros(1, device=dev)
        inv = torch.full((1,), 0.25, device=dev)
        with torchtpu.eager_mode(mode):
            torch._amp_foreach_non_finite_check_and_unscale_(gs, found, inv)
            results[dev] = gs + [found]
            if dev == "tpu":  # read back in the mode
                assert_same(results["tpu"], results["cpu"], equal_nan=True, rtol=0, atol=0)
    assert results["tpu"][-1].item() == float(with_inf)


def test_update_scale_kernel_matches_cpu():
    # growth every 2 clean steps, back-off on inf, an overflowing growth keeps the scale
    seq = [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    out = {}
    for dev in ("cpu", "tpu"):
        scale = torch.full((1,), 1024.0, device=dev)
        tracker = torch.zeros(1, dtype=torch.int32, device=dev)
        trace = []
        for f in seq:
            found = torch.full((1,), f, device=dev)
            r = torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 2)
            assert r is scale
            trace.append((scale.item(), tracker.item()))
        big = torch.full((1,), 3.0e38, device=dev)
        t2 = torch.ones(1, dtype=torch.int32, device=dev)
        torch._amp_update_scale_(big, t2, torch.zeros(1, device=dev), 2.0, 0.5, 2)
        trace.append((big.item(), t2.item()))
        out[dev] = trace
    assert out["tpu"] == out["cpu"]


@pytest.mark.parametrize("call", [
    lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(2, device=d)], torch.zeros(1, device=d, dtype=torch.float64), torch.ones(1, device=d)),
    lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(2, device=d)], torch.zeros(2, device=d), torch.ones(1, device=d)),
    lambda d: torch._amp_update_scale_(
        torch.ones(1, device=d), torch.zeros(1, device=d), torch.zeros(1, device=d), 2.0, 0.5, 2),
    lambda d: torch._amp_update_scale_(
        torch.ones(1, device=d, dtype=torch.float64), torch.zeros(1, dtype=torch.int32, device=d),
        torch.zeros(1, device=d), 2.0, 0.5, 2),
])
def test_bad_arguments_raise_like_cpu(call):
    with pytest.raises(RuntimeError) as cpu_err:
        call("cpu")
    with pytest.raises(type(cpu_err.value), match=str(cpu_err.value).split(".")[0]):
        call("tpu")


def _train(dev, steps=5, inject_at=2, compiled=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**10, growth_interval=2)
    x, y = torch.randn(6, 8).to(dev), torch.randn(6, 4).to(dev)
    trace = []

    def forward(x, y):
        with torch.autocast(dev, dtype=torch.float16):
            return F.mse_loss(model(x), y)

    fwd = torch.compile(forward, backend="tpu") if compiled else forward
    for step in range(steps):
        loss = fwd(x, y)
        scaler.scale(loss).backward()
        if step == inject_at:
            model[0].weight.grad[0, 0] = float("inf")
        before = model[2].weight.detach().cpu().clone()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        skipped = torch.equal(before, model[2].weight.detach().cpu())
        trace.append((loss.item(), scaler.get_scale(), skipped))
    return trace, model


@pytest.mark.parametrize("mode,compiled", [
    ("strict", False), ("defer_and_fuse", False), pytest.param("strict", True, marks=pytest.mark.slow)])
def test_fp16_autocast_with_injected_inf_matches_cpu(mode, compiled):
    want, m_cpu = _train("cpu")
    with torchtpu.eager_mode(mode):
        got, m_tpu = _train("tpu", compiled=compiled)
    assert [s for _, s, _ in got] == [s for _, s, _ in want]
    assert [k for _, _, k in got] == [k for _, _, k in want] == [False, False, True, False, False]
    assert got[2][1] == want[1][1] / 2  # the inf step halves the scale
    assert_values([l for l, _, _ in got], [l for l, _, _ in want], rtol=2e-2, atol=1e-3)  # losses read back
    assert_same([p.detach() for p in m_tpu.parameters()], [p.detach() for p in m_cpu.parameters()],
                rtol=2e-2, atol=2e-3)


def test_scaler_step_reads_no_host_value_per_parameter():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)]).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("tpu")
    x = torch.randn(2, 4, device="tpu")
    for _ in range(2):  # the second step runs compiled executables only
        with torch.autocast("tpu", dtype=torch.float16):
            loss = model(x).float().sum()
        scaler.scale(loss).backward()
        torchtpu.reset_metrics()
        scaler.step(opt)
        scaler.update()
        m = torchtpu.metrics()
        opt.zero_grad()
    # 12 parameters: GradScaler.step reads its one found_inf, as on CUDA; nothing else
    assert m["transfers_to_host"] <= 1, m
    assert m["cpu_fallbacks"] == 0


# --- the acceptance: the small GPT, 20 steps of float16 autocast + GradScaler -------


def _gpt_scaled(dev, mode="strict", compiled=False, steps=20, inject_at=7):
    from torchtpu.bench.models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=32, layers=1, heads=2, max_len=16).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**12, growth_interval=100)
    data = torch.randint(0, 64, (4, 4, 17), generator=torch.Generator().manual_seed(0))
    probe = model.head.weight if hasattr(model, "head") else list(model.parameters())[-1]

    def forward(x, y):
        with torch.autocast(dev, dtype=torch.float16):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    fwd = torch.compile(forward, backend="tpu") if compiled else forward
    trace = []
    with torchtpu.eager_mode(mode):
        for i in range(steps):
            batch = data[i % 4].to(dev)
            loss = fwd(batch[:, :-1], batch[:, 1:])
            scaler.scale(loss).backward()
            if i == inject_at:
                next(model.parameters()).grad.view(-1)[0] = float("inf")
            before = probe.detach().cpu().clone()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            trace.append((loss.item(), scaler.get_scale(), torch.equal(before, probe.detach().cpu())))
    return trace


@pytest.mark.slow  # about 20 s each; the MLP test above keeps the mechanism in the fast suite
@pytest.mark.parametrize("mode,compiled", [("strict", False), ("defer_and_fuse", False), ("strict", True)])
def test_gpt_fp16_autocast_grad_scaler_skips_the_inf_step_as_cpu(mode, compiled):
    want = _gpt_scaled("cpu")
    got = _gpt_scaled("tpu", mode, compiled)
    skipped = [k for _, _, k in got]
    assert skipped == [k for _, _, k in want]
    assert skipped == [i == 7 for i in range(20)]  # exactly the step with the injected inf
    assert [s for _, s, _ in got] == [s for _, s, _ in want]
    assert got[7][1] == got[6][1] / 2  # and its scale backed off by half
    assert_values([l for l, _, _ in got], [l for l, _, _ in want], rtol=2e-2, atol=0)  # losses read back
