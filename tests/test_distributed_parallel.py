"""torch.distributed parallelisms on "tpu": FSDP2 (fully_shard) and DTensor tensor parallel.

Each test compares a real 2-process job on XLA:CPU (launched as torchrun would: env:// with
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, this file run as a script in each rank) with
a single-process CPU run of the same model on the combined batch.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import multiproc
import pytest
import torch
import torch.distributed as dist

HERE = os.path.abspath(__file__)

CFG = dict(vocab=64, d=32, layers=1, heads=2, max_len=32)  # as tests/test_distributed.py's DDP test
B, T, STEPS = 4, 16, 5
TOL = 1e-4


# ----------------------------------------------------------------------------- launcher


def _launch(scenario: str, *args: str, **kw):
    return multiproc.launch(HERE, scenario, *args, **kw)


_result = multiproc.result


def _section(job, name: str) -> list[dict]:
    res = [_result(p)[name] for p in job]
    for r in res:
        assert "error" not in r, r["error"]
    return res


def _assert_matches_reference(res: list[dict]) -> None:
    from conftest import assert_values

    for r in res:
        assert r["fallbacks"] == {}, r["fallbacks"]
    # data parallel: the mean of the ranks' losses is the loss of the combined batch;
    # tensor parallel: every rank computes the loss of the whole batch
    losses = [sum(x) / len(x) for x in zip(*(r["losses"] for r in res))]
    ref = res[0]["ref_losses"]
    assert len(losses) == len(ref) == STEPS
    assert_values(losses, ref, rtol=TOL, atol=0)  # values from the job
    for r in res:
        assert r["param_max_rel"] < TOL, r["param_max_rel"]


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module", params=["strict", "defer_and_fuse"])
def job(request):
    # defer_and_fuse: DTensor's and FSDP2's functional collectives join the fused regions
    return _launch("main", env_extra={"TORCHTPU_EAGER_MODE": request.param})


def _fused(job) -> bool:
    return any(_result(p)["mode"] == "defer_and_fuse" for p in job)


def _assert_collectives_fused(job, res) -> None:
    for r in res:
        assert (r["fused_collectives"] > 0) == _fused(job), r["fused_collectives"]


def test_fsdp2_matches_single_process_cpu(job):
    res = _section(job, "fsdp")
    _assert_matches_reference(res)
    _assert_collectives_fused(job, res)
    for r in res:
        # parameters really were sharded, and resharded after forward (storage freed, re-gathered)
        assert r["local_numel"] < r["full_numel"], r
        assert r["resharded"], r


def test_dtensor_direct(job):
    res = _section(job, "dtensor")
    for r in res:
        bad = {k: v for k, v in r["checks"].items() if v != "ok"}
        assert not bad, bad
        assert r["fallbacks"] == {}, r["fallbacks"]
    _assert_collectives_fused(job, res)


def test_tensor_parallel_matches_single_process_cpu(job):
    res = _section(job, "tp")
    _assert_matches_reference(res)
    for r in res:
        assert r["sharded"] == ["blocks.0.fc.bias", "blocks.0.fc.weight", "blocks.0.out.weight",
                                "blocks.0.proj.weight", "blocks.0.qkv.bias", "blocks.0.qkv.weight"], r["sharded"]
        assert r["local_numel"] < r["full_numel"], r
    _assert_collectives_fused(job, res)


@pytest.fixture(scope="module")
def compiled_job():
    return _launch("compiled")


def test_compiled_fsdp2_matches_single_process_cpu(compiled_job):
    # torch.compile of the FSDP2 model: Dynamo leaves FSDP's hooks (its all-gathers and
    # reduce-scatters) to run eagerly around the compiled blocks
    res = _section(compiled_job, "fsdp")
    _assert_matches_reference(res)
    for r in res:
        assert r["graphs"] > 0 and r["resharded"], r


def test_compiled_tensor_parallel_matches_single_process_cpu(compiled_job):
    # torch.compile of the tensor-parallel model: DTensor's collectives are traced into the
    # graphs, which run as SPMD programs with the collectives inside
    res = _section(compiled_job, "tp")
    _assert_matches_reference(res)
    for r in res:
        assert r["in_graph"] > 0, r


def test_ranks_that_fuse_different_regions_fall_back_together():
    # defer_and_fuse: rank 0 reads a value on the host between two all-reduces, rank 1 does
    # not, so their regions around the collectives differ; both must notice, replay, and agree
    job = _launch("asymmetric", env_extra={"TORCHTPU_EAGER_MODE": "defer_and_fuse"})
    res = [_result(p)["asymmetric"] for p in job]
    for r in res:
        assert "error" not in r, r["error"]
        assert r["value"] == r["expected"], r
        assert r["replayed"] >= 1, r
        assert r["skinny_value"] == [v * 5 * 2 for v in range(4)] and r["skinny_fused"] == 0, r
    assert "fused different regions around their collectives" in job[0][2], multiproc.clean(job[0][2])[-3000:]


def test_streams_events_and_storage_identity_in_process():
    # what FSDP2 needs of torch.tpu (device/streams.py) and of tpu storages (device/storage_api.py)
    import torchtpu  # noqa: F401
    from conftest import assert_same

    e = torch.tpu.Event()
    e.record()
    s = torch.tpu.Stream(priority=-1)
    s.wait_stream(torch.tpu.current_stream())
    torch.tpu.current_stream().wait_event(e)
    with torch.tpu.stream(s):
        pass
    e.synchronize()
    assert e.query()
    t = torch.arange(6.0, device="tpu")
    v = t.view(2, 3)[1:]  # a view: its storage's byte count grows, its data pointer stays null
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() != 0
    assert torch.zeros(2, device="tpu").untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    st = t.untyped_storage()
    st.resize_(0)  # FSDP2's free_storage: the device buffer goes
    assert_same(t, torch.zeros(6))
    st.resize_(6 * 4)  # alloc_storage; then written
    t.copy_(torch.ones(6))
    assert_same(v, torch.ones(1, 3))
    c = torch.ones(3)
    assert c.untyped_storage().data_ptr() == c.data_ptr()  # other devices untouched


# ----------------------------------------------------------------------------- workers


def _data(world: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, CFG["vocab"], (B * world, T + 1), generator=g) for _ in range(STEPS)]


def _loss_of(m, batch):
    import torch.nn.functional as F

    return F.cross_entropy(m(batch[:, :-1]).reshape(-1, CFG["vocab"]), batch[:, 1:].reshape(-1))


def _reference(data) -> tuple[list[float], dict]:
    """The single-process CPU run on the combined batches: losses and final parameters."""
    from torchtpu.bench.models import TinyGPT

    torch.manual_seed(0)
    ref = TinyGPT(**CFG)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for batch in data:
        loss = _loss_of(ref, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, init, {k: v.detach() for k, v in ref.named_parameters()}


def _max_rel(params: dict, ref: dict) -> float:
    assert params.keys() == ref.keys(), (sorted(params), sorted(ref))
    return max(((params[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-12)).item() for k in ref)


def _train(model, data, rank: int, world: int, shard_batch: bool, foreach=None, compiled=False) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
    forward = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for batch in data:
        if shard_batch:
            batch = batch[rank * B:(rank + 1) * B]
        loss = _loss_of(forward, batch.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).cpu().tolist()


def _fsdp(rank: int, world: int, compiled: bool = False) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    import torchtpu
    from torchtpu.bench.models import TinyGPT

    data = _data(world)
    ref_losses, init, ref_params = _reference(data)
    mesh = init_device_mesh("tpu", (world,))
    model = TinyGPT(**CFG)
    model.load_state_dict(init)
    model.to("tpu")
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)  # reshard_after_forward=True (the default)
    fully_shard(model, mesh=mesh)
    freed = []
    orig = torch.UntypedStorage.resize_

    def spy(self, size):
        if int(size) == 0 and self.device.type == "tpu":
            freed.append(1)
        return orig(self, size)

    torchtpu.reset_metrics()
    torch.UntypedStorage.resize_ = spy
    try:
        losses = _train(model, data, rank, world, shard_batch=True, compiled=compiled)
    finally:
        torch.UntypedStorage.resize_ = orig
    fallbacks = torchtpu.metrics()["fallback_ops"]
    local = sum(p.to_local().numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())
    assert all(isinstance(p, DTensor) for p in model.parameters())
    params = {k: p.full_tensor().cpu() for k, p in model.named_parameters()}
    return dict(losses=losses, ref_losses=ref_losses, param_max_rel=_max_rel(params, ref_params),
                fallbacks=fallbacks, local_numel=local, full_numel=full, resharded=len(freed) > 0)


def _check(name, fn, results):
    try:
        fn()
        results[name] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the parent test
        results[name] = f"{type(e).__name__}: {e}"


def _asymmetric(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as funcol

    import torchtpu

    x = torch.arange(4.0)
    # skinny collectives stay out of regions
    torchtpu.set_collectives("skinny")
    skinny_value = funcol.all_reduce(x.to("tpu") * 5, "sum", dist.group.WORLD).cpu().tolist()
    skinny_fused = torchtpu.metrics().get("regions_with_collectives", 0)
    torchtpu.set_collectives("in_graph")
    a = x.to("tpu") * 2
    b = funcol.all_reduce(a, "sum", dist.group.WORLD)
    if rank == 0:
        (b + 1).sum().item()  # only rank 0 cuts its region here
    c = funcol.all_reduce(b * 3, "sum", dist.group.WORLD)
    d = funcol.all_reduce(c + 1, "sum", dist.group.WORLD)  # after the fallback: on its own
    expected = ((x * 2 * world * 3 * world) + 1) * world
    return dict(value=d.cpu().tolist(), expected=expected.tolist(), skinny_value=skinny_value,
                skinny_fused=skinny_fused, replayed=torchtpu.metrics().get("regions_replayed", 0))


def _dtensor(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    import torchtpu

    mesh = init_device_mesh("tpu", (world,))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * world, 6, generator=g)  # the same on every rank
    y = torch.randn(6, 3, generator=g)
    res: dict = {}
    torchtpu.reset_metrics()

    from conftest import assert_same

    def shard0():
        d = distribute_tensor(x.to("tpu"), mesh, [Shard(0)])
        assert d.to_local().device.type == "tpu"
        assert_same(d.to_local(), x.chunk(world, 0)[rank])
        assert_same(d.full_tensor(), x)
    _check("distribute_shard0_full_tensor", shard0, res)

    def shard1():
        d = distribute_tensor(x.to("tpu"), mesh, [Shard(1)])
        assert_same(d.to_local(), x.chunk(world, 1)[rank])
        assert_same(d.redistribute(mesh, [Shard(0)]).to_local(), x.chunk(world, 0)[rank])  # all-to-all
    _check("redistribute_shard1_to_shard0", shard1, res)

    def replicate():
        d = distribute_tensor(x.to("tpu"), mesh, [Replicate()])
        assert_same(d.to_local(), x)
        s = d.redistribute(mesh, [Shard(0)])  # a local chunk
        assert_same(s.to_local(), x.chunk(world, 0)[rank])
        assert_same(s.redistribute(mesh, [Replicate()]).to_local(), x)  # all-gather
    _check("redistribute_shard_to_replicate", replicate, res)

    def partial():
        # every rank holds a different addend; Partial -> Replicate all-reduces, -> Shard(0) reduce-scatters
        local = (x * (rank + 1)).to("tpu")
        p = DTensor.from_local(local, mesh, [Partial()])
        total = x * sum(r + 1 for r in range(world))
        assert_same(p.redistribute(mesh, [Replicate()]).to_local(), total)
        assert_same(p.redistribute(mesh, [Shard(0)]).to_local(), total.chunk(world, 0)[rank])
    _check("redistribute_partial", partial, res)

    def ops():
        a = distribute_tensor(x.to("tpu"), mesh, [Shard(0)])
        b = distribute_tensor(y.to("tpu"), mesh, [Replicate()])
        c = a @ b  # row-sharded matmul: no communication
        assert c.placements == (Shard(0),), c.placements
        assert_same(c.full_tensor(), x @ y)
        s = (a * 2 + 1).sum()  # a sharded reduction: Partial, then all-reduce
        assert_same(s.full_tensor(), (x * 2 + 1).sum())
    _check("dtensor_ops", ops, res)

    def backward():
        w = distribute_tensor(y.to("tpu"), mesh, [Shard(1)]).requires_grad_()
        a = distribute_tensor(x.to("tpu"), mesh, [Replicate()])
        (a @ w).sum().backward()
        yc = y.clone().requires_grad_()
        (x @ yc).sum().backward()
        assert_same(w.grad.full_tensor(), yc.grad)
    _check("dtensor_backward", backward, res)

    return dict(checks=res, fallbacks=torchtpu.metrics()["fallback_ops"])


def _tp(rank: int, world: int, compiled: bool = False) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import torchtpu
    from torchtpu.bench.models import TinyGPT

    data = _data(world)
    ref_losses, init, ref_params = _reference(data)
    mesh = init_device_mesh("tpu", (world,))
    model = TinyGPT(**CFG)
    model.load_state_dict(init)
    model.to("tpu")
    for blk in model.blocks:
        # Megatron-style MLP: fc column-sharded, out row-sharded (one all-reduce after out).
        # Attention projections: the fused qkv's output columns are [q | k | v], so a column
        # shard does not hold whole heads and the model splits by the full width: qkv is
        # column-sharded and its output all-gathered (Replicate), attention runs on whole
        # tensors, proj is row-sharded (its replicated input cut locally, output all-reduced).
        parallelize_module(blk, mesh, {
            "qkv": ColwiseParallel(output_layouts=Replicate()),
            "proj": RowwiseParallel(input_layouts=Replicate()),
            "fc": ColwiseParallel(),
            "out": RowwiseParallel(),
        })
    torchtpu.reset_metrics()
    # every rank sees the whole batch; the optimizer's foreach kernels refuse a mix of DTensor
    # (sharded) and plain (replicated: embeddings, norms, head) parameters, as on any device
    losses = _train(model, data, rank, world, shard_batch=False, foreach=False, compiled=compiled)
    fallbacks = torchtpu.metrics()["fallback_ops"]
    sharded = sorted(k for k, p in model.named_parameters() if isinstance(p, DTensor) and p.placements[0].is_shard())
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())
    params = {k: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for k, p in model.named_parameters()}
    return dict(losses=losses, ref_losses=ref_losses, param_max_rel=_max_rel(params, ref_params),
                fallbacks=fallbacks, sharded=sharded, local_numel=local, full_numel=full)


def _run_section(fn, rank, world) -> dict:
    try:
        return fn(rank, world)
    except Exception:  # noqa: BLE001 - reported to the parent test
        return dict(error=traceback.format_exc())


def _worker(sections):
    import torchtpu  # noqa: F401 - registers "tpu"

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = dict(rank=rank, mode=torchtpu.get_eager_mode())
    for name, fn in sections:
        t0 = time.perf_counter()
        torchtpu.reset_metrics()
        out[name] = _run_section(fn, rank, world)
        out[name]["seconds"] = time.perf_counter() - t0
        m = torchtpu.metrics()
        out[name]["fused_collectives"] = m.get("regions_with_collectives", 0)
        out[name]["in_graph"] = m.get("in_graph_collective_graphs", 0)
        out[name]["graphs"] = m.get("compile_graphs", 0)
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "main":
        _worker((("fsdp", _fsdp), ("dtensor", _dtensor), ("tp", _tp)))
    elif scenario == "compiled":
        _worker((("fsdp", lambda r, w: _fsdp(r, w, compiled=True)), ("tp", lambda r, w: _tp(r, w, compiled=True))))
    elif scenario == "asymmetric":
        _worker((("asymmetric", _asymmetric),))
    else:
        raise SystemExit(f"unknown scenario {scenario}")
