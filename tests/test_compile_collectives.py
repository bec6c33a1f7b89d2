"""Collectives inside torch.compile(backend="tpu") programs, on real 2-process jobs.

Each test launches two ranks the way torchrun does and runs this file as a
script in each (`python tests/test_compile_collectives.py MODE`), with
TORCHTPU_COLLECTIVES=in_graph (one SPMD program holds the collectives) or skinny
(the graph is cut at each collective). Oracles: the collectives' values worked
out on the CPU from every rank's known inputs, and a single-process CPU run of
the same model on the combined batch.
"""
from __future__ import annotations

import datetime
import json
import os
import sys

import multiproc
import pytest
import torch
import torch.distributed as dist

HERE = os.path.abspath(__file__)
CFG = dict(vocab=64, d=32, layers=1, heads=2, max_len=16)
B, T, STEPS = 2, 8, 3


def _launch(mode: str) -> list[dict]:
    job = multiproc.launch(HERE, mode, timeout=240.0, env_extra=dict(TORCHTPU_COLLECTIVES=mode))
    return [multiproc.result(p) for p in job]


@pytest.fixture(scope="module", params=["in_graph", "skinny"])
def job(request):
    return request.param, _launch(request.param)


def test_functional_collectives_compiled(job):
    mode, ranks = job
    for r in ranks:
        assert r["collectives"] == {k: True for k in r["collectives"]}, r["collectives"]


def test_graph_kind_follows_the_switch(job):
    mode, ranks = job
    for r in ranks:
        if mode == "in_graph":
            assert r["in_graph_graphs"] >= 2 and r["skinny_graphs"] == 0
        else:
            assert r["skinny_graphs"] >= 2 and r["in_graph_graphs"] == 0


def test_gradient_all_reduces_are_bucketed(job):
    # DDP's python reducer all-reduces each gradient alone; the compiler fuses them
    # (and the two sum all-reduces of the functional test) in either mode
    mode, ranks = job
    for r in ranks:
        assert r["buckets"] >= 2, r["buckets"]


def test_compiled_ddp_matches_single_process_cpu(job):
    from conftest import assert_values

    mode, ranks = job
    for r in ranks:
        assert_values(r["losses"], r["ref_losses_mine"], rtol=1e-4, atol=1e-5)  # values from the job
        assert r["param_max_rel"] < 1e-4, r["param_max_rel"]
        assert r["fallbacks"] == {}


def test_ranks_compiling_different_collectives_fail_naming_both():
    # a rank-dependent branch in compiled code: each rank compiles a different graph; the
    # first run of each SPMD program is checked across ranks, never silently wrong
    job = multiproc.launch(HERE, "mismatch", timeout=240.0, env_extra=dict(TORCHTPU_COLLECTIVES="in_graph"))
    for rc, so, se, _ in job:
        assert rc != 0, so
        err = multiproc.clean(se)
        assert "issued different collectives" in err, err[-3000:]
        assert "all_reduce((4,):float32, 'sum')" in err and "all_reduce((4,):float32, 'max')" in err, err[-3000:]
        assert "RESULT" not in so


# ----------------------------------------------------------------------------- in each rank


def _worker_mismatch() -> None:
    import torch.distributed._functional_collectives as funcol

    import torchtpu  # noqa: F401

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    op = "sum" if dist.get_rank() == 0 else "max"
    f = torch.compile(lambda x: funcol.all_reduce(x * 2, op, dist.group.WORLD), backend="tpu")
    out = f(torch.ones(4, device="tpu")).cpu()
    print("RESULT " + json.dumps(dict(value=out.tolist())), flush=True)


def _collectives(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    def f(x, y, i):
        a = funcol.all_reduce(x * 2, "sum", group)
        m = funcol.all_reduce(x, "max", group)
        g = funcol.all_gather_tensor(y + 1, 0, group)
        s = funcol.reduce_scatter_tensor(g * 1.0, "sum", 0, group)
        t = funcol.all_to_all_single(i, None, None, group)
        b = funcol.broadcast(x, 1, group)
        z = x.clone()
        dist.all_reduce(z)  # Dynamo rewrites it into the functional form
        return a.sin() + z, m, g, s, t, b

    def inputs(r):
        return (torch.arange(4.0).reshape(2, 2) + r, torch.ones(3) * (r + 1),
                torch.arange(4) * 10 + r)

    xs, ys, its = zip(*[inputs(r) for r in range(world)])
    total = sum(xs)
    gathered = torch.cat([y + 1 for y in ys])
    expected = (
        (2 * total).sin() + total,
        torch.stack(xs).amax(0),
        gathered,
        (world * gathered).chunk(world)[rank],
        torch.cat([it.chunk(world)[rank] for it in its]),
        xs[1],
    )
    x, y, i = (v.to("tpu") for v in inputs(rank))
    got = torch.compile(f, backend="tpu")(x, y, i)
    names = ["all_reduce_sum", "all_reduce_max", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    from conftest import assert_same

    ok = {}
    for n, e, g in zip(names, expected, got):
        try:
            assert_same(g, e)
            ok[n] = True
        except AssertionError as err:
            ok[n] = str(err)[:300]
    return ok


def _compiled_ddp(rank: int, world: int) -> dict:
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

    # DDP's python reducer under compiled autograd: the bucket all-reduces become
    # _c10d_functional ops in the compiled backward graph
    torch._dynamo.config.optimize_ddp = "python_reducer"
    ddp = DDP(model.to("tpu"))
    compiled = torch.compile(ddp, backend="tpu")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    torchtpu.reset_metrics()
    losses = []
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="tpu")):
        for s in range(STEPS):
            loss = loss_of(compiled, data[s][rank * B:(rank + 1) * B].to("tpu"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    losses = torch.stack(losses).cpu().tolist()
    metrics = torchtpu.metrics()

    # the CPU run on the combined batch; each rank's reported loss is its own half's
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    mine = []
    for s in range(STEPS):
        with torch.no_grad():
            mine.append(loss_of(ref, data[s][rank * B:(rank + 1) * B]).item())
        loss = loss_of(ref, data[s])
        ropt.zero_grad()
        loss.backward()
        ropt.step()
    rel = max(
        ((p.detach().cpu() - q.detach()).abs().max() / q.detach().abs().max().clamp_min(1e-12)).item()
        for p, q in zip(model.parameters(), ref.parameters())
    )
    return dict(losses=losses, ref_losses_mine=mine, param_max_rel=rel, fallbacks=metrics["fallback_ops"],
                in_graph_graphs=metrics.get("in_graph_collective_graphs", 0),
                skinny_graphs=metrics.get("skinny_graphs", 0))


def _worker(mode: str) -> None:
    import torchtpu

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    torchtpu.reset_metrics()
    out = dict(rank=rank, collectives=_collectives(rank, world))
    m = torchtpu.metrics()
    first = (m.get("in_graph_collective_graphs", 0), m.get("skinny_graphs", 0))
    out.update(_compiled_ddp(rank, world))
    out["in_graph_graphs"] += first[0]
    out["skinny_graphs"] += first[1]
    out["buckets"] = torchtpu.metrics().get("all_reduce_buckets", 0) + m.get("all_reduce_buckets", 0)
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "mismatch":
        _worker_mismatch()
    else:
        _worker(sys.argv[1])
