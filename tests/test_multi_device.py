"""Several tpu devices in one process, and torchrun's CUDA idioms on a host with several.

XLA:CPU stands in for a multi-chip host: `--xla_force_host_platform_device_count=N` gives a
process N local devices. The count is fixed when JAX starts, so each scenario runs this file
as a script in a fresh process (`python tests/test_multi_device.py SCENARIO MODE`) and reports
one `RESULT {json}` line; CPU PyTorch in the same process is the oracle.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

import multiproc
import pytest
from conftest import EAGER_MODES

HERE = os.path.abspath(__file__)
FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


def _run(scenario: str, mode: str, env_extra: dict) -> dict:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYTEST_CURRENT_TEST"):
        env.pop(k, None)
    env.update(env_extra, TORCHTPU_EAGER_MODE=mode, TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, HERE, scenario, mode], env=env, capture_output=True, text=True,
                       timeout=multiproc.HANG_GUARD_S, cwd=multiproc.ROOT)
    return multiproc.result((p.returncode, p.stdout, p.stderr))


@pytest.fixture(scope="module", params=EAGER_MODES)
def four(request):
    return _run("four_devices", request.param, FOUR)


def test_every_local_device_is_a_tpu_device(four):
    assert four["count"] == 4
    assert four["factories"] == {"ok": True}, four["factories"]


def test_moves_to_and_between_devices_keep_values(four):
    assert four["moves"] == "ok", four["moves"]


def test_current_device_set_and_scoped(four):
    assert four["current"] == [0, 2, 2, 3, 2, 1], four["current"]


def test_ops_across_devices_raise_cudas_error(four):
    for msg in four["cross"]:
        assert "Expected all tensors to be on the same device" in msg and "tpu:1" in msg and "tpu:0" in msg, msg


def test_index_out_of_range_raises(four):
    for what, msg in four["out_of_range"].items():
        assert msg is not None and ("invalid device" in msg or "Invalid device" in msg), (what, msg)


def test_device_apis_take_a_device(four):
    assert four["memory"] == {"on_2": 4096, "on_3": 0, "others": 0}, four["memory"]
    assert four["generators"] == {"count": 4, "devices": [0, 1, 2, 3], "repeat": True,
                                  "per_device": True, "state": True}, four["generators"]
    assert four["streams"] == [3, 3, 1], four["streams"]
    assert four["accelerator"] == {"memory": [4096, 4096, 0], "streams": [3, 1, 3]}, four["accelerator"]
    assert four["properties"] == [True, True, True, True], four["properties"]


def test_compiled_graphs_on_another_device(four):
    assert four["compiled"] == {"device": "tpu:2", "match": True, "factory": "tpu:3", "grad": "tpu:2"}, four["compiled"]


def test_jax_interop_and_cpu_fallback_keep_the_device(four):
    assert four["interop"] == ["tpu:2", True, "tpu:1", True], four["interop"]


def test_save_load_keeps_the_device(four):
    assert four["save_load"] == ["tpu:2", "tpu:1", True], four["save_load"]


def test_two_stage_model_trains_as_cpu(four):
    r = four["two_stage"]
    assert r["devices"] == ["tpu:0", "tpu:1"]
    assert r["max_param_diff"] < 1e-5, r
    assert r["max_loss_rel"] < 1e-5, r


@pytest.mark.slow  # Transformers' import and two model loads: ~40 s
def test_big_model_dispatch_across_devices():
    """Accelerate's device_map="balanced" / "auto" (a max_memory per index) spreads a model's
    layers over tpu:0..3; logits and greedy tokens equal the model's on CPU."""
    r = _run("big_model", "strict", FOUR)
    assert r["balanced"]["devices"] == ["tpu:0", "tpu:1", "tpu:2"], r
    assert len(r["auto"]["devices"]) > 1, r
    for kind in ("balanced", "auto"):
        assert r[kind]["logits_diff"] < 1e-5 and r[kind]["tokens_equal"], r


TPU_HOST = ("tpu", 4)


@pytest.mark.parametrize("env, host, want_env, want_cfg", [
    # one host of 4 TPU chips, 4 processes: each gets its own chip, libtpu told the grid
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"}, TPU_HOST,
     {"TPU_VISIBLE_CHIPS": "2", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "2,2,1",
      "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477,localhost:8478,localhost:8479",
      "TPU_PROCESS_PORT": "8478", "CLOUD_TPU_TASK_ID": "2", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}, {}),
    # GPU host: JAX opens only the local rank's GPU
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16"}, ("gpu", 8), {},
     {"jax_cuda_visible_devices": "1"}),
    # nothing to do: one process per host, XLA:CPU, the user's own settings, opted out, no torchrun,
    # a multi-host TPU job (the other hosts' addresses are the TPU VM's metadata)
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "4"}, TPU_HOST, {}, {}),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "JAX_PLATFORMS": "cpu"}, TPU_HOST, {}, {}),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "TPU_VISIBLE_CHIPS": "0,1"}, TPU_HOST, {}, {}),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "3,4"}, ("gpu", 8), {}, {}),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "TORCHTPU_CHIP_PER_PROCESS": "0"}, TPU_HOST, {}, {}),
    ({}, TPU_HOST, {}, {}),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}, TPU_HOST, {}, {}),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, ("", 0), {}, {}),
])
def test_torchrun_gives_each_process_its_own_chip(env, host, want_env, want_cfg):
    from torchtpu.runtime import chips

    assert chips.plan(env, host) == (want_env, want_cfg)


def test_a_process_given_one_chip_numbers_it_by_its_local_rank():
    """Under torchrun on a shared host a process sees one XLA device; it is tpu:<local rank> of
    LOCAL_WORLD_SIZE devices, and its neighbours' indices are refused naming them (simulated: the
    GPU plan on XLA:CPU, where JAX's visible-GPU setting has nothing to restrict)."""
    r = _run("one_chip", "strict", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHTPU_HOST_CHIPS": "gpu:2",
                                    "JAX_PLATFORMS": ""})  # (XLA:CPU named outright keeps every device)
    assert r["count"] == 2 and r["current"] == 1, r
    assert r["devices"] == ["tpu:1", "tpu:1", "tpu:1"], r
    assert r["value"] == [2.0, 2.0, 2.0], r
    assert "local rank 0" in r["neighbour"], r


def _torchrun(scenario: str, nnodes: int, nproc: int, mode: str = "strict") -> list[dict]:
    """`torchrun --nnodes N --nproc-per-node P` on localhost, one torchrun per simulated node
    (c10d rendezvous), each process seeing the 2 devices of a simulated host; the workers'
    RESULT lines, by rank."""
    env = dict(os.environ)
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               TORCHTPU_EAGER_MODE=mode, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTEST_CURRENT_TEST"):
        env.pop(k, None)
    outdir = tempfile.mkdtemp(prefix="torchtpu-torchrun-")
    env["MULTI_DEVICE_RESULTS"] = outdir  # workers' stdout lines interleave: each writes a file
    port = multiproc.free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=multi-device-test",
           "--max-restarts=0", HERE, scenario, mode]
    nodes = [subprocess.Popen(cmd, env=env, cwd=multiproc.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(nnodes)]
    found, logs = {}, []
    for p in nodes:
        try:
            so, se = p.communicate(timeout=multiproc.HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        logs.append((p.returncode, so, se))
    for name in os.listdir(outdir):
        with open(os.path.join(outdir, name)) as f:
            r = json.load(f)
        found[r["rank"]] = r
    shutil.rmtree(outdir, ignore_errors=True)
    if len(found) != nnodes * nproc:
        raise AssertionError("torchrun job failed:\n" + "\n".join(
            f"rc={rc}\n{so[-2000:]}\n{multiproc.clean(se)[-4000:]}" for rc, so, se in logs))
    return [found[r] for r in sorted(found)]


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_torchrun_cuda_ddp_idiom_each_process_on_its_device(mode):
    """The standard CUDA DDP script with "cuda" replaced by "tpu" (`torch.tpu.set_device(local_rank)`,
    `torch.device("tpu", local_rank)`, DDP(device_ids=[local_rank])) under torchrun, 2 processes
    that each see both devices of a simulated host."""
    res = _torchrun("ddp_idiom", 1, 2, mode)
    for rank, r in enumerate(res):
        assert r["count"] == 2 and r["current"] == rank
        assert r["devices"] == [f"tpu:{rank}"]
        assert r["max_param_diff"] < 1e-5, r


@pytest.mark.slow  # two torchruns of two processes: ~40 s
def test_two_nodes_of_two_processes_ddp_and_hsdp_match_cpu():
    """`torchrun --nnodes 2 --nproc-per-node 2` on localhost: 4 processes, each on its
    LOCAL_RANK's device of a simulated 2-device host; DDP over all four and HSDP (FSDP2 on a 2-D
    mesh: replicate across nodes, shard within) give a single-process CPU run's losses."""
    res = _torchrun("two_nodes", 2, 2)
    for rank, r in enumerate(res):
        assert r["device"] == f"tpu:{rank % 2}", r
        for kind in ("ddp", "hsdp"):
            for a, b in zip(r[kind], r["ref"]):
                assert abs(a - b) <= 1e-5 * abs(b), (kind, r[kind], r["ref"])


# ----------------------------------------------------------------------------- scenarios


def _err(fn):
    try:
        fn()
    except (RuntimeError, AssertionError, ValueError) as e:
        return str(e)
    return None


def four_devices(mode: str) -> dict:
    import torch

    import torchtpu

    torchtpu.set_eager_mode(mode)
    out = {"count": torch.tpu.device_count()}

    # factories on tpu:N
    bad = {}
    makers = {
        "ones": lambda d: torch.ones(2, 3, device=d), "zeros": lambda d: torch.zeros(4, device=d),
        "arange": lambda d: torch.arange(5, device=d), "full": lambda d: torch.full((2,), 7.0, device=d),
        "eye": lambda d: torch.eye(3, device=d), "tensor": lambda d: torch.tensor([1.5, 2.5], device=d),
        "linspace": lambda d: torch.linspace(0, 1, 5, device=d), "empty": lambda d: torch.empty(3, device=d).fill_(2),
    }
    for name, make in makers.items():
        for i in range(4):
            t = make(f"tpu:{i}")
            if t.device != torch.device("tpu", i) or not torch.equal(t.cpu(), make("cpu")):
                bad[f"{name}@{i}"] = str(t.device)
    out["factories"] = bad or {"ok": True}

    # moves: host -> tpu:N, tpu:N -> tpu:M, views and ops stay on their device
    x = torch.randn(4, 5)
    moved = []
    a = x.to("tpu:1")
    b = a.to("tpu:3")
    c = b.t().contiguous().to(torch.device("tpu", 2))
    moved += [a.device.index == 1, b.device.index == 3, c.device.index == 2, torch.equal(c.cpu(), x.t())]
    d = (b * 2 + 1).sum(0)
    moved += [d.device.index == 3, torch.allclose(d.cpu(), (x * 2 + 1).sum(0))]
    e = torch.empty(4, 5, device="tpu:0")
    e.copy_(b)
    moved += [torch.equal(e.cpu(), x), b[1:3].device.index == 3, torch.equal(b[1:3].cpu(), x[1:3])]
    out["moves"] = "ok" if all(moved) else moved

    # current device
    cur = [torch.tpu.current_device()]
    torch.tpu.set_device(2)
    cur.append(torch.tpu.current_device())
    cur.append(torch.ones(1, device="tpu").device.index)
    with torch.tpu.device(3):
        cur.append(torch.zeros(1, device="tpu").device.index)
    cur.append(torch.tpu.current_device())
    with torch.tpu.device_of(a):
        cur.append(torch.tpu.current_device())
    torch.tpu.set_device(0)
    out["current"] = cur

    # ops across devices
    z0 = torch.ones(3, device="tpu:0")
    z1 = torch.ones(3, device="tpu:1")
    out["cross"] = [_err(lambda: z0 + z1), _err(lambda: torch.cat([z1, z0])), _err(lambda: z0.add_(z1))]

    out["out_of_range"] = {
        "factory": _err(lambda: torch.ones(2, device="tpu:4")), "to": _err(lambda: torch.ones(2).to("tpu:7")),
        "set_device": _err(lambda: torch.tpu.set_device(4)), "memory": _err(lambda: torch.tpu.memory_allocated(5)),
    }

    # per-device APIs
    torch.tpu.synchronize()
    base = {i: torch.tpu.memory_allocated(i) for i in range(4)}
    big = torch.zeros(1024, device="tpu:2")
    torch.tpu.synchronize(2)
    out["memory"] = {"on_2": torch.tpu.memory_allocated(2) - base[2],
                     "on_3": torch.tpu.memory_allocated("tpu:3") - base[3],
                     "others": sum(torch.tpu.memory_allocated(i) - base[i] for i in (0, 1))}
    # torch.accelerator's functions answer for the device they are asked about, not the current one
    torch.accelerator.synchronize("tpu:2")
    out["accelerator"] = {
        "memory": [torch.accelerator.memory_allocated(2) - base[2],
                   torch.accelerator.memory_allocated(torch.device("tpu", 2)) - base[2],
                   torch.accelerator.memory.memory_stats(3)["allocated_bytes.all.current"] - base[3]],
        "streams": [torch.accelerator.current_stream(torch.device("tpu", i)).device_index for i in (3, 1, 3)],
    }
    del big
    torch.manual_seed(5)
    r1 = torch.randn(3, device="tpu:1").cpu()
    torch.manual_seed(5)
    r1b = torch.randn(3, device="tpu:1").cpu()
    torch.tpu.manual_seed_all(5)
    torch.randn(3, device="tpu:0")  # draws on tpu:0 leave tpu:1's generator where it was
    r1c = torch.randn(3, device="tpu:1").cpu()
    state = torch.tpu.get_rng_state(2)
    s1 = torch.rand(4, device="tpu:2").cpu()
    torch.tpu.set_rng_state(state, 2)
    s2 = torch.rand(4, device="tpu:2").cpu()
    gens = torch.tpu.default_generators
    out["generators"] = {"count": len(gens), "devices": [g.device.index for g in gens],
                         "repeat": torch.equal(r1, r1b), "per_device": torch.equal(r1, r1c),
                         "state": torch.equal(s1, s2)}
    ev = torch.Event(device="tpu:3")
    ev.record()
    ev.synchronize()
    with torch.tpu.device(3):
        s_cur = torch.tpu.current_stream().device_index
    out["streams"] = [torch.tpu.Stream(device="tpu:3").device_index, s_cur,
                      torch.tpu.default_stream(1).device_index]
    props = torch.tpu.get_device_properties(3)
    out["properties"] = [props.name == torch.tpu.get_device_name("tpu:3"), props.total_memory > 0,
                         torch.tpu.get_device_capability(2) == torch.tpu.get_device_capability(0),
                         torch.tpu.mem_get_info(1)[1] > 0]

    # compiled graphs
    lin = torch.nn.Linear(4, 3)
    xin = torch.randn(2, 4)
    want = lin(xin)
    lin2 = torch.nn.Linear(4, 3)
    lin2.load_state_dict(lin.state_dict())
    lin2.to("tpu:2")
    got = torch.compile(lin2, backend="tpu")(xin.to("tpu:2"))
    got.sum().backward()
    fac = torch.compile(lambda: torch.ones(3, device="tpu:3") * 2, backend="tpu")()
    out["compiled"] = {"device": str(got.device), "match": torch.allclose(got.detach().cpu(), want, atol=1e-6),
                       "factory": str(fac.device), "grad": str(lin2.weight.grad.device)}

    # save / load
    buf = io.BytesIO()
    torch.save({"c": c}, buf)
    buf.seek(0)
    back = torch.load(buf)["c"]
    buf.seek(0)
    mapped = torch.load(buf, map_location="tpu:1")["c"]
    out["save_load"] = [str(back.device), str(mapped.device), torch.equal(mapped.cpu(), x.t())]

    # JAX interop and the CPU fallback keep the device
    import jax
    import jax.numpy as jnp

    ja = jax.device_put(jnp.arange(4.0), jax.local_devices()[2])
    from_j = torchtpu.from_jax(ja)
    back_j = torchtpu.to_jax(from_j * 2)
    torch.library.define("multi_device_test::dbl", "(Tensor x) -> Tensor")
    torch.library.impl("multi_device_test::dbl", "CPU")(lambda t: t * 2)
    fb = torch.ops.multi_device_test.dbl(a)  # no tpu lowering: runs on the CPU, comes back to tpu:1
    out["interop"] = [str(from_j.device), back_j.devices() == {jax.local_devices()[2]},
                      str(fb.device), torch.equal(fb.cpu(), x * 2)]

    out["two_stage"] = _two_stage()
    return out


def _two_stage() -> dict:
    import torch

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 16)
            self.b = torch.nn.Linear(16, 4)

        def forward(self, x, d0, d1):
            return self.b(torch.relu(self.a(x.to(d0))).to(d1))

    torch.manual_seed(0)
    m, ref = Two(), Two()
    ref.load_state_dict(m.state_dict())
    m.a.to("tpu:0")
    m.b.to("tpu:1")
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    rel = 0.0
    for _ in range(3):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        loss = ((m(x, "tpu:0", "tpu:1") - y.to("tpu:1")) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        rl = ((ref(x, "cpu", "cpu") - y) ** 2).mean()
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        rel = max(rel, abs(loss.item() - rl.item()) / abs(rl.item()))
    diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in zip(m.parameters(), ref.parameters()))
    return {"devices": [str(m.a.weight.device), str(m.b.weight.device)], "max_param_diff": diff, "max_loss_rel": rel}


def big_model(mode: str) -> dict:
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    path = tempfile.mkdtemp()
    m.save_pretrained(path)
    ids = torch.randint(0, 128, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ref = m(ids).logits
    ref_tokens = m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    out = {}
    for kind, kw in (("balanced", {}), ("auto", {"max_memory": {0: "120KB", 1: "120KB", 2: "120KB", 3: "1GB"}})):
        mm = LlamaForCausalLM.from_pretrained(path, device_map="balanced" if kind == "balanced" else "auto", **kw)
        with torch.no_grad():
            logits = mm(ids.to("tpu:0")).logits
        tokens = mm.generate(ids.to("tpu:0"), attention_mask=mask.to("tpu:0"), max_new_tokens=4, do_sample=False,
                             pad_token_id=0)
        out[kind] = {"devices": sorted({str(p.device) for p in mm.parameters()}),
                     "logits_diff": (logits.cpu() - ref).abs().max().item(),
                     "tokens_equal": torch.equal(tokens.cpu(), ref_tokens)}
    shutil.rmtree(path, ignore_errors=True)
    return out


def one_chip(mode: str) -> dict:
    import torch

    a = torch.ones(3, device="tpu")
    b = a.to("tpu:1") * 2
    c = torch.zeros(3, device=torch.device("tpu", 1)) + b
    return {"count": torch.tpu.device_count(), "current": torch.tpu.current_device(),
            "devices": [str(t.device) for t in (a, b, c)], "value": c.cpu().tolist(),
            "neighbour": _err(lambda: torch.ones(2, device="tpu:0"))}


def ddp_idiom(mode: str = "strict") -> dict:
    """The standard CUDA DDP script with "cuda" replaced by "tpu"."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(local_rank)
    dist.init_process_group("tpu", timeout=__import__("datetime").timedelta(seconds=multiproc.PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", local_rank)
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    model = model.to(device)
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        X, Y = torch.randn(world * 4, 8, generator=g), torch.randn(world * 4, 4, generator=g)
        x, y = X[rank * 4:(rank + 1) * 4].to(device), Y[rank * 4:(rank + 1) * 4].to(device)
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        rl = ((ref(X) - Y) ** 2).mean()
        rl.backward()
        ropt.step()
        ropt.zero_grad()
    diff = max((p.detach().cpu() - q.detach()).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    out = {"rank": rank, "devices": sorted({str(p.device) for p in model.parameters()}),
           "count": torch.tpu.device_count(), "current": torch.tpu.current_device(), "max_param_diff": diff}
    dist.destroy_process_group()
    return out


def two_nodes(mode: str = "strict") -> dict:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(local_rank)
    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", local_rank)

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def data():
        g = torch.Generator().manual_seed(1)
        return [(torch.randn(world * 2, 8, generator=g), torch.randn(world * 2, 4, generator=g)) for _ in range(3)]

    def train(model, shard: bool) -> list:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for X, Y in data():
            if shard:
                x, y = X[rank * 2:(rank + 1) * 2].to(device), Y[rank * 2:(rank + 1) * 2].to(device)
            else:
                x, y = X, Y
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if shard:  # the mean over ranks of equal shards' losses is the whole batch's
                loss = loss.detach().clone()
                dist.all_reduce(loss)
                loss = loss / world
            losses.append(loss.item())
        return losses

    ref = train(make(), False)
    ddp = train(DDP(make().to(device), device_ids=[local_rank]), True)
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = make().to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    hsdp = train(model, True)
    out = {"rank": rank, "device": str(device), "ref": ref, "ddp": ddp, "hsdp": hsdp}
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    scenario = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("TORCHTPU_EAGER_MODE", "strict")
    res = globals()[scenario](mode)
    if os.environ.get("MULTI_DEVICE_RESULTS"):
        with open(os.path.join(os.environ["MULTI_DEVICE_RESULTS"], f"{res['rank']}.json"), "w") as f:
            json.dump(res, f)
    print("RESULT " + json.dumps(res), flush=True)
