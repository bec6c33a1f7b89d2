"""FSDP2 with torchao's float8 all-gather on tpu vs the same job on CPU (issue 35).

`convert_to_float8_training(Float8LinearConfig(enable_fsdp_float8_all_gather=True))` makes each
sharded weight cast itself to float8_e4m3fn before FSDP2's all-gather (torchao's
`fsdp_pre_all_gather` / `fsdp_post_all_gather`), so the collective moves one byte a value. The
same script runs as two 2-process jobs launched as torchrun would (env:// variables): one with
the "tpu" process group on XLA:CPU, one with gloo on CPU; each rank's losses over the steps agree
within 1e-2 relative (float8 rounding of the two runs' float32 matmuls may fall on neighbouring
codes; the rest is float32).
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import sys
import traceback
import warnings

import multiproc
import pytest
import torch
import torch.distributed as dist

HERE = os.path.abspath(__file__)
STEPS = 5


def _job(backend: str, mode: str = "strict"):
    return multiproc.launch(HERE, backend, env_extra={"TORCHTPU_EAGER_MODE": mode})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_fsdp2_float8_all_gather_matches_cpu(mode):
    pytest.importorskip("torchao.float8")
    tpu = [multiproc.result(p) for p in _job("tpu", mode)]
    cpu = [multiproc.result(p) for p in _job("gloo")]
    for r in tpu + cpu:
        assert "error" not in r, r["error"]
    for t in tpu:
        assert t["fallbacks"] == {}, t["fallbacks"]
        assert t["float8_gathered"], "the all-gather did not move float8"
    for t, c in zip(tpu, cpu):
        assert len(t["losses"]) == len(c["losses"]) == STEPS
        for a, b in zip(t["losses"], c["losses"]):
            assert abs(a - b) <= 1e-2 * abs(b), (t["losses"], c["losses"])


# ----------------------------------------------------------------------------- worker


def _run(backend: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    import torchtpu

    dev = "tpu" if backend == "tpu" else "cpu"
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 32))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 64, generator=g), torch.randn(16, 32, generator=g)) for _ in range(STEPS)]
    model = copy.deepcopy(base).to(dev)
    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    mesh = init_device_mesh(dev, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    gathered = []
    orig = WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather

    def spy(self, mesh):  # torchao's signature (FSDP2 checks it)
        out = orig(self, mesh)
        gathered.append(out[0][0].dtype)
        return out

    WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather = spy
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torchtpu.reset_metrics()
    losses = []
    for x, y in data:
        xs, ys = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
        loss = torch.nn.functional.mse_loss(model(xs.to(dev)), ys.to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses).cpu().tolist()
    return dict(losses=losses, fallbacks=torchtpu.metrics()["fallback_ops"],
                float8_gathered=bool(gathered) and all(d == torch.float8_e4m3fn for d in gathered))


def _worker(backend: str) -> None:
    import torchtpu  # noqa: F401 - registers "tpu"

    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    try:
        out = _run(backend)
    except Exception:  # noqa: BLE001 - reported to the parent test
        out = dict(error=traceback.format_exc())
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1])
