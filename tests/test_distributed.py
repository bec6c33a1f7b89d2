"""torch.distributed on "tpu": the c10d backend, its collectives, DDP, and faults.

Multi-process tests launch real 2-process jobs the way torchrun does (env:// with
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT), running this file as a script:
`python tests/test_distributed.py SCENARIO` in each rank, on XLA:CPU.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

import multiproc
import pytest
import torch
import torch.distributed as dist

HERE = os.path.abspath(__file__)


# ----------------------------------------------------------------------------- launcher


def _launch(scenario: str, *args: str, **kw):
    return multiproc.launch(HERE, scenario, *args, **kw)


_result = multiproc.result
_clean = multiproc.clean


# ----------------------------------------------------------------------------- in-process


def test_backend_registered():
    import torchtpu  # noqa: F401

    assert "tpu" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu"
    assert dist.Backend.backend_capability["tpu"] == ["tpu"]


def test_world_of_one_in_process(tmp_path):
    # one process: no multi-process runtime, every collective is the identity;
    # init_process_group(device_id=tpu) picks the "tpu" backend by itself
    import torchtpu  # noqa: F401
    from conftest import assert_same

    dist.init_process_group(device_id=torch.device("tpu", 0), init_method=f"file://{tmp_path / 'store'}",
                            rank=0, world_size=1)
    try:
        assert dist.get_backend() == "tpu"
        x = torch.arange(6.0).reshape(2, 3).to("tpu")
        dist.all_reduce(x[:, 1])
        dist.broadcast(x, src=0)
        out = torch.empty(2, 3, device="tpu")
        dist.all_gather_into_tensor(out, x)
        assert_same(out, torch.arange(6.0).reshape(2, 3))
        dist.reduce_scatter_tensor(out, x * 2, op=dist.ReduceOp.MAX)
        assert_same(out, torch.arange(6.0).reshape(2, 3) * 2)
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _CountingRunner:
    """The installed runner of regions with collectives, with its calls counted."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def agree(self, ctx, fkey, nodes):
        self.calls.append("agree")
        return self.inner.agree(ctx, fkey, nodes)

    def run(self, ctx, fkey, nodes, fn, args):
        self.calls.append("run")
        return self.inner.run(ctx, fkey, nodes, fn, args)


def test_region_with_a_collective_runs_through_the_installed_runner(tmp_path):
    # eager/deferred never imports distributed/: creating a group installs the runner it
    # calls for regions holding collectives. A group of one records nothing by itself, so
    # the all-reduce (the identity over one rank) is recorded the way the group records
    # DDP's bucket all-reduce in defer_and_fuse.
    import torchtpu
    from conftest import assert_same
    from torchtpu.distributed import fused
    from torchtpu.eager import deferred
    from torchtpu.spmd.bodies import body_allreduce

    dist.init_process_group("tpu", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    installed = deferred._collective_runner
    try:
        assert installed is not None
        pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("tpu"))
        counting = _CountingRunner(installed)
        deferred.set_collective_region_runner(counting)
        with torchtpu.eager_mode("defer_and_fuse"):
            x = torch.arange(6.0).reshape(2, 3).to("tpu")
            y = x * 2
            assert fused.record_written(pg, "ALLREDUCE", ("allreduce", "sum", 1),
                                        lambda: body_allreduce("sum", 1), [y], [y])
            z = y + 1
            assert counting.calls == []  # recorded, not run
            assert_same(z, torch.arange(6.0).reshape(2, 3) * 2 + 1)
        assert counting.calls == ["agree", "run"]

        deferred.set_collective_region_runner(None)
        with torchtpu.eager_mode("defer_and_fuse"):
            y = torch.ones(3).to("tpu")
            with pytest.raises(RuntimeError, match="no runner for regions with collectives is installed"):
                fused.record_written(pg, "ALLREDUCE", ("allreduce", "sum", 1),
                                     lambda: body_allreduce("sum", 1), [y], [y])
            assert_same(y + 1, torch.full((3,), 2.0))  # nothing half-recorded
    finally:
        deferred.set_collective_region_runner(installed)
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- 2 processes

CFG = dict(vocab=64, d=32, layers=1, heads=2, max_len=32)
B, T, STEPS = 4, 16, 5


@pytest.fixture(scope="module", params=["strict", "defer_and_fuse"])
def job(request):
    # defer_and_fuse: the collectives (DDP's bucket all-reduces too) join the fused regions
    return _launch("main", env_extra={"TORCHTPU_EAGER_MODE": request.param})


def test_collectives_two_processes(job):
    for rank, proc in enumerate(job):
        res = _result(proc)
        assert res["rank"] == rank
        assert res["import_left_xla_unstarted"]
        assert res["backend"] == "tpu"
        bad = {k: v for k, v in res["collectives"].items() if v != "ok"}
        assert not bad, bad


def test_ddp_matches_single_process_cpu(job):
    res = [_result(p) for p in job]
    for r in res:
        assert r["ddp_fallbacks"] == {}, r["ddp_fallbacks"]
        # the mean of the ranks' losses is the loss of the combined batch
    ddp = [sum(x) / len(x) for x in zip(*(r["ddp_losses"] for r in res))]
    ref = res[0]["ref_losses"]
    for a, b in zip(ddp, ref):
        assert abs(a - b) <= 1e-4 * abs(b), (ddp, ref)
    for r in res:
        assert r["param_max_rel"] < 1e-4, r["param_max_rel"]
        # in defer_and_fuse a step is one SPMD program: forward, backward, the bucket
        # all-reduce and the optimizer
        assert (r["ddp_fused"] > 0) == (r["mode"] == "defer_and_fuse"), r["ddp_fused"]


# The failure tests below check the per-collective (strict-mode) error paths, so their
# jobs run in strict mode whatever mode the suite runs in; defer_and_fuse's own path (the
# ranks compare a region's collectives before it runs) has its test after them.
STRICT = {"TORCHTPU_EAGER_MODE": "strict"}


def test_dead_rank_fails_fast_naming_the_collective():
    timeout = 20
    procs = _launch("die", str(timeout), timeout=120, env_extra=STRICT)
    (rc0, so0, se0, end0), (rc1, so1, _, _) = procs
    assert rc1 == 7, so1  # the rank that was killed
    assert rc0 != 0, so0
    assert "finished" not in so0
    err = _clean(se0)
    assert "torchtpu.distributed: collective ALLREDUCE" in err, err[-4000:]
    assert "failed" in err or "timed out" in err
    # the survivor ended well within the process-group timeout after its peer died
    died = float(next(line.split()[-1] for line in so1.splitlines() if line.startswith("leaving")))
    assert end0 - died < timeout, (end0, died)


@pytest.mark.parametrize("variant,expect", [
    # rank 0 all-reduces while rank 1 broadcasts
    ("op", ["rank 0 issued ALLREDUCE(sum) on [(4,):float32]", "rank 1 issued BROADCAST(src 0) on [(4,):float32]"]),
    # the same collective on different shapes
    ("shape", ["rank 0 issued ALLREDUCE(sum) on [(4,):float32]",
               "rank 1 issued ALLREDUCE(sum) on [(2, 3):float32]"]),
    # the same shapes, different reductions: would otherwise run two different programs silently
    ("reduce_op", ["rank 0 issued ALLREDUCE(sum) on [(4,):float32]",
                   "rank 1 issued ALLREDUCE(max) on [(4,):float32]"]),
])
def test_mismatched_collectives_fail_naming_both(variant, expect):
    procs = _launch("mismatch", variant, timeout=120, env_extra=STRICT)
    for rank, (rc, so, se, _) in enumerate(procs):
        err = _clean(se)
        assert rc != 0, (so, err[-3000:])
        assert "finished" not in so
        # every rank names every rank's collective, at once (not after the 30 s group timeout)
        assert "issued different collectives at collective #1" in err, err[-3000:]
        for e in expect:
            assert e in err, err[-3000:]
        name = "BROADCAST" if (rank, variant) == (1, "op") else "ALLREDUCE"
        assert f"torchtpu.distributed: collective {name} (rank {rank} of 2" in err, err[-3000:]
        # found by the signature check, not by the 30 s group timeout (no wall-clock limit:
        # a loaded machine slows the job, and must not fail it)
        assert "timed out" not in err, err[-3000:]


def test_rank_skipping_a_collective_times_out_naming_it():
    # rank 1 never issues the all-reduce: rank 0 waits the grace period, launches, and its
    # timeout error says what rank 1 last issued (nothing, here)
    (rc0, so0, se0, _), _ = _launch("mismatch", "skip", timeout=120, env_extra=STRICT)
    err = _clean(se0)
    assert rc0 != 0 and "finished" not in so0, (so0, err[-3000:])
    assert "torchtpu.distributed: collective ALLREDUCE (rank 0 of 2" in err, err[-3000:]
    assert "timed out after 4.0 s" in err, err[-3000:]
    assert "rank 1 has not issued collective #1" in err, err[-3000:]
    # (rank 1 is then ended by the XLA runtime, whose coordinator lived in rank 0)


def test_mismatch_without_the_check_fails_within_timeout():
    # TORCHTPU_DIST_CHECK=0: only the watchdog's timeout (4 s) is left to catch it
    procs = _launch("mismatch", "op", timeout=120, env_extra=dict(STRICT, TORCHTPU_DIST_CHECK="0"))
    for rank, (rc, so, se, _) in enumerate(procs):
        err = _clean(se)
        assert rc != 0, (so, err[-3000:])
        name = "ALLREDUCE" if rank == 0 else "BROADCAST"
        assert f"torchtpu.distributed: collective {name} (rank {rank} of 2" in err, err[-3000:]
        # the first to time out ends; its peer's collective then fails on the closed connection
        assert "timed out after 4.0 s" in err or "failed" in err
        assert "finished" not in so


def test_mismatched_collectives_in_fused_regions_fail_naming_both():
    # defer_and_fuse: each rank's collective is recorded into a region; the region check
    # names both ranks' regions, then the region runs op by op and its collective's own
    # check fails on every rank, naming both collectives
    procs = _launch("mismatch", "op", timeout=120, env_extra={"TORCHTPU_EAGER_MODE": "defer_and_fuse"})
    for rank, (rc, so, se, _) in enumerate(procs):
        err = _clean(se)
        assert rc != 0 and "finished" not in so, (so, err[-3000:])
        assert "fused different regions around their collectives" in err, err[-3000:]
        assert "rank 0 a fused region of 2 ops with ALLREDUCE" in err, err[-3000:]
        assert "rank 1 a fused region of 2 ops with BROADCAST" in err, err[-3000:]
        assert "rank 0 issued ALLREDUCE(sum) on [(4,):float32]; rank 1 issued BROADCAST(src 0)" in err, err[-3000:]
        assert "timed out" not in err, err[-3000:]  # the checks found it, not the group timeout


# ----------------------------------------------------------------------------- workers


def _check(name, fn, results):
    try:
        fn()
        results[name] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the parent test
        results[name] = f"{type(e).__name__}: {e}"


def _collectives(rank: int, world: int) -> dict:
    res: dict = {}
    dev = "tpu"

    from conftest import assert_same, assert_values

    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    per_rank = [base + 10 * r + 1 for r in range(world)]

    def all_reduce(op, combine, dtype=torch.float32):
        def f():
            x = per_rank[rank].to(dtype).to(dev)
            dist.all_reduce(x, op=op)
            stacked = torch.stack([p.to(dtype) for p in per_rank])
            assert_same(x, combine(stacked))
        return f

    _check("all_reduce_sum", all_reduce(dist.ReduceOp.SUM, lambda s: s.sum(0)), res)
    _check("all_reduce_avg", all_reduce(dist.ReduceOp.AVG, lambda s: s.mean(0)), res)
    _check("all_reduce_max", all_reduce(dist.ReduceOp.MAX, lambda s: s.amax(0)), res)
    _check("all_reduce_min", all_reduce(dist.ReduceOp.MIN, lambda s: s.amin(0)), res)
    _check("all_reduce_product", all_reduce(dist.ReduceOp.PRODUCT, lambda s: s.prod(0)), res)
    _check("all_reduce_sum_int64", all_reduce(dist.ReduceOp.SUM, lambda s: s.sum(0), torch.int64), res)
    _check("all_reduce_max_int32", all_reduce(dist.ReduceOp.MAX, lambda s: s.amax(0), torch.int32), res)
    _check("all_reduce_sum_bf16", all_reduce(dist.ReduceOp.SUM, lambda s: s.sum(0), torch.bfloat16), res)

    def all_reduce_bool():
        x = torch.tensor([rank == 0, False, True], device=dev)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        assert_same(x, torch.tensor([True, False, True]))
    _check("all_reduce_bool", all_reduce_bool, res)

    def all_reduce_view():
        # a non-contiguous view: only its elements change, the rest of the storage stays
        full = torch.zeros(4, 3, device=dev) + rank
        col = full[:, 1]
        dist.all_reduce(col)
        expect = torch.zeros(4, 3) + rank
        expect[:, 1] = sum(range(world))
        assert_same(full, expect)
    _check("all_reduce_view", all_reduce_view, res)

    def all_reduce_async():
        x = per_rank[rank].to(dev)
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        y = x * 2  # ordered after the collective
        assert_same(y, 2 * sum(per_rank))
        assert w.is_completed()
    _check("all_reduce_async", all_reduce_async, res)

    def all_reduce_cpu_tensor():
        x = per_rank[rank].clone()
        dist.all_reduce(x)
        assert x.device.type == "cpu"
        assert_values(x, sum(per_rank))  # a CPU tensor reduced in place
    _check("all_reduce_cpu_tensor", all_reduce_cpu_tensor, res)

    def broadcast():
        for src in range(world):
            x = per_rank[rank].to(dev)
            dist.broadcast(x, src=src)
            assert_same(x, per_rank[src])
    _check("broadcast", broadcast, res)

    def all_gather():
        outs = [torch.empty(2, 3, device=dev) for _ in range(world)]
        dist.all_gather(outs, per_rank[rank].to(dev))
        for o, p in zip(outs, per_rank):
            assert_same(o, p)
    _check("all_gather", all_gather, res)

    def all_gather_into_tensor():
        out = torch.empty(2 * world, 3, device=dev)
        dist.all_gather_into_tensor(out, per_rank[rank].to(dev))
        assert_same(out, torch.cat(per_rank))
        out = torch.empty(world, 2, 3, device=dev)  # the stacked form
        dist.all_gather_into_tensor(out, per_rank[rank].to(dev))
        assert_same(out, torch.stack(per_rank))
    _check("all_gather_into_tensor", all_gather_into_tensor, res)

    big = [torch.arange(world * 4, dtype=torch.float32).reshape(world * 2, 2) * (r + 1) for r in range(world)]

    def reduce_scatter():
        out = torch.empty(2, 2, device=dev)
        dist.reduce_scatter(out, [c.to(dev) for c in big[rank].chunk(world)])
        assert_same(out, sum(big).chunk(world)[rank])
        out = torch.empty(2, 2, device=dev)
        dist.reduce_scatter(out, [c.to(dev) for c in big[rank].chunk(world)], op=dist.ReduceOp.MAX)
        assert_same(out, torch.stack(big).amax(0).chunk(world)[rank])
    _check("reduce_scatter", reduce_scatter, res)

    def reduce_scatter_tensor():
        out = torch.empty(2, 2, device=dev)
        dist.reduce_scatter_tensor(out, big[rank].to(dev))
        assert_same(out, sum(big).chunk(world)[rank])
        out = torch.empty(2, 2, device=dev)
        dist.reduce_scatter_tensor(out, big[rank].to(dev), op=dist.ReduceOp.AVG)
        assert_same(out, (sum(big) / world).chunk(world)[rank])
    _check("reduce_scatter_tensor", reduce_scatter_tensor, res)

    def all_to_all_single_even():
        out = torch.empty(world * 2, 2, device=dev)
        dist.all_to_all_single(out, big[rank].to(dev))
        assert_same(out, torch.cat([big[r].chunk(world)[rank] for r in range(world)]))
    _check("all_to_all_single_even", all_to_all_single_even, res)

    def all_to_all_single_uneven():
        # rank r sends (r + j + 1) rows of 3 to rank j
        def rows(r, j):
            return torch.full((r + j + 1, 3), 100.0 * r + j)
        send = torch.cat([rows(rank, j) for j in range(world)])
        expect = torch.cat([rows(r, rank) for r in range(world)])
        out = torch.empty(expect.shape, device=dev)
        dist.all_to_all_single(out, send.to(dev), [r + rank + 1 for r in range(world)],
                               [rank + j + 1 for j in range(world)])
        assert_same(out, expect)
    _check("all_to_all_single_uneven", all_to_all_single_uneven, res)

    def all_to_all_list():
        ins = [torch.full((j + 1,), float(10 * rank + j), device=dev) for j in range(world)]
        outs = [torch.empty(rank + 1, device=dev) for _ in range(world)]
        dist.all_to_all(outs, ins)
        for r, o in enumerate(outs):
            assert_same(o, torch.full((rank + 1,), float(10 * r + rank)))
    _check("all_to_all_list", all_to_all_list, res)

    def barrier():
        dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()
    _check("barrier", barrier, res)

    def send_recv():
        if rank == 0:
            dist.send(torch.tensor([7.0, 8.0], device=dev), dst=1)
            z = torch.empty(3, dtype=torch.int64, device=dev)
            dist.recv(z, src=1)
            assert_same(z, torch.as_tensor([1, 2, 3], dtype=z.dtype))
        elif rank == 1:
            z = torch.empty(2, device=dev)
            dist.recv(z, src=0)
            assert_same(z, torch.as_tensor([7.0, 8.0], dtype=z.dtype))
            dist.send(torch.tensor([1, 2, 3], device=dev), dst=0)
    _check("send_recv", send_recv, res)

    def batch_isend_irecv_ring():
        # every rank sends to the next and receives from the previous, in one batch
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        send = torch.full((3,), float(rank), device=dev)
        got = torch.empty(3, device=dev)
        got2 = torch.empty(2, dtype=torch.int32, device=dev)
        ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, got, prv),
               dist.P2POp(dist.isend, torch.tensor([rank, 5], dtype=torch.int32, device=dev), nxt),
               dist.P2POp(dist.irecv, got2, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        assert_same(got, torch.full((3,), float(prv)))
        assert_same(got2, torch.as_tensor([prv, 5], dtype=got2.dtype))
        # isend/irecv crossing each other, then a collective flushes nothing twice
        a = dist.isend(send * 2, nxt)
        b = torch.empty(3, device=dev)
        c = dist.irecv(b, prv)
        x = torch.ones(1, device=dev)
        dist.all_reduce(x)
        a.wait()
        c.wait()
        assert_same(b, torch.full((3,), 2.0 * prv))
        assert_same(x, torch.as_tensor([float(world)], dtype=x.dtype))
    _check("batch_isend_irecv_ring", batch_isend_irecv_ring, res)

    def gather_scatter():
        outs = [torch.empty(2, 3, device=dev) for _ in range(world)] if rank == 1 else None
        dist.gather(per_rank[rank].to(dev), outs, dst=1)
        if rank == 1:
            for o, p in zip(outs, per_rank):
                assert_same(o, p)
        x = torch.empty(2, 3, device=dev)
        dist.scatter(x, [p.to(dev) for p in per_rank] if rank == 0 else None, src=0)
        assert_same(x, per_rank[rank])
    _check("gather_scatter", gather_scatter, res)

    def reduce():
        x = per_rank[rank].to(dev)
        dist.reduce(x, dst=0)
        assert_same(x, sum(per_rank) if rank == 0 else per_rank[rank])
    _check("reduce", reduce, res)

    def coalescing_manager():
        from torch.distributed.distributed_c10d import _coalescing_manager

        a, b = per_rank[rank].to(dev), per_rank[rank][0].to(dev)
        with _coalescing_manager(device=torch.device(dev), async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
        assert_same(a, sum(per_rank))
        assert_same(b, sum(per_rank)[0])
    _check("coalescing_manager", coalescing_manager, res)

    def functional_collectives():
        # what DTensor / FSDP2 / Dynamo emit (_c10d_functional ops), run eagerly
        import torch.distributed._functional_collectives as fc

        import torchtpu

        torchtpu.reset_metrics()
        w = dist.group.WORLD
        assert_same(fc.all_reduce(per_rank[rank].to(dev), "sum", w), sum(per_rank))
        assert_same(fc.all_gather_tensor(per_rank[rank].to(dev), 0, w), torch.cat(per_rank))
        assert_same(fc.reduce_scatter_tensor(big[rank].to(dev), "sum", 0, w), sum(big).chunk(world)[rank])
        assert torchtpu.metrics()["cpu_fallbacks"] == 0, torchtpu.metrics()["fallback_ops"]
    _check("functional_collectives", functional_collectives, res)

    def subgroup():
        g = dist.new_group([1, 0])
        x = per_rank[rank].to(dev)
        dist.all_reduce(x, group=g)
        assert_same(x, sum(per_rank))
    _check("subgroup", subgroup, res)

    return res


def _ddp(rank: int, world: int) -> dict:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchtpu
    from torchtpu.bench.models import TinyGPT

    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, CFG["vocab"], (B * world, T + 1), generator=g) for _ in range(STEPS)]
    torch.manual_seed(0)
    ref = TinyGPT(**CFG)
    model = TinyGPT(**CFG)
    model.load_state_dict(ref.state_dict())

    def loss_of(m, batch):
        return F.cross_entropy(m(batch[:, :-1]).reshape(-1, CFG["vocab"]), batch[:, 1:].reshape(-1))

    torchtpu.reset_metrics()
    ddp = DDP(model.to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for s in range(STEPS):
        loss = loss_of(ddp, data[s][rank * B:(rank + 1) * B].to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses).cpu().tolist()
    fallbacks = torchtpu.metrics()["fallback_ops"]
    fused = torchtpu.metrics().get("regions_with_collectives", 0)

    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_losses = []
    for s in range(STEPS):
        loss = loss_of(ref, data[s])
        ropt.zero_grad()
        loss.backward()
        ropt.step()
        ref_losses.append(loss.item())
    rel = max(
        ((p.detach().cpu() - q.detach()).abs().max() / q.detach().abs().max().clamp_min(1e-12)).item()
        for p, q in zip(model.parameters(), ref.parameters())
    )
    return dict(ddp_losses=losses, ref_losses=ref_losses, param_max_rel=rel, ddp_fallbacks=fallbacks,
                ddp_fused=fused, mode=torchtpu.get_eager_mode())


def _worker_main():
    import torchtpu  # noqa: F401 - registers "tpu"
    from jax._src import xla_bridge

    # `import torchtpu` must leave XLA unstarted: the backend starts it multi-process
    lazy = not xla_bridge.backends_are_initialized()
    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = dict(rank=rank, import_left_xla_unstarted=lazy, backend=dist.get_backend(),
               collectives=_collectives(rank, world))
    out.update(_ddp(rank, world))
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def _worker_die(timeout_s: str):
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchtpu  # noqa: F401
    from torchtpu.bench.models import TinyGPT

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=float(timeout_s)))
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(TinyGPT(**CFG).to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(4):
        batch = torch.randint(0, CFG["vocab"], (B, T + 1)).to("tpu")
        loss = F.cross_entropy(ddp(batch[:, :-1]).reshape(-1, CFG["vocab"]), batch[:, 1:].reshape(-1))
        if s == 1 and rank == 1:
            print(f"leaving {time.time()}", flush=True)
            os._exit(7)  # dies mid-step: after the forward, before the gradient all-reduce
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    print("finished", flush=True)


def _worker_mismatch(variant: str):
    import torchtpu  # noqa: F401

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=30))
    g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=4))
    rank = dist.get_rank()
    x = torch.ones(4, device="tpu")
    if variant == "op":
        if rank == 0:
            dist.all_reduce(x, group=g)
        else:
            dist.broadcast(x, src=0, group=g)
    elif variant == "shape":
        dist.all_reduce(x if rank == 0 else torch.ones(2, 3, device="tpu"), group=g)
    elif variant == "reduce_op":
        dist.all_reduce(x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX, group=g)
    elif variant == "skip":
        if rank == 1:
            time.sleep(14)  # alive, but never issues the collective
            os._exit(0)
        dist.all_reduce(x, group=g)
    print("finished", x.cpu().tolist(), flush=True)


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "main":
        _worker_main()
    elif scenario == "mismatch":
        _worker_mismatch(sys.argv[2])
    elif scenario == "die":
        _worker_die(sys.argv[2])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
