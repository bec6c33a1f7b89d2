"""Device-side checks in SPMD programs (issue 16): each rank reports its own flags.

A real 2-process job on XLA:CPU (as tests/test_distributed_parallel.py launches it): a
program that all-reduces and then gathers with an index that is out of range on rank 1
only. Rank 1 raises CPU's error naming the op at its next host read; rank 0, whose index
is valid, gets the right numbers; both then run a further collective correctly (nobody
hangs, nothing is lost). Run as a fused region (defer_and_fuse) and as a compiled graph.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import multiproc
import pytest
import torch
import torch.distributed as dist

HERE = os.path.abspath(__file__)


def _program(x, idx):
    dist.all_reduce(x)  # every rank: x = world * arange
    return torch.gather(x, 0, idx) + 1


def _compiled_program(x, idx):
    import torch.distributed._functional_collectives as fc

    y = fc.all_reduce(x, "sum", dist.group.WORLD)
    return torch.gather(y, 0, idx) + 1


def _section(fn, rank, world):
    x = torch.arange(4.0, device="tpu")
    idx = torch.tensor([0, 9 if rank == 1 else 3], device="tpu")
    out = {}
    try:
        out["value"] = fn(x, idx).cpu().tolist()
    except Exception as e:  # noqa: BLE001 - the parent test checks class and message
        out["error"] = [type(e).__name__, str(e)]
    # the device and the group keep working after the error
    y = torch.full((2,), float(rank + 1), device="tpu")
    dist.all_reduce(y)
    out["after"] = y.cpu().tolist()
    return out


def _worker(mode):
    import torchtpu

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=multiproc.PG_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    res = dict(rank=rank)
    try:
        if mode == "compile":
            fn = torch.compile(_compiled_program, backend="tpu", fullgraph=True)
            res["run"] = _section(fn, rank, world)
        else:
            with torchtpu.eager_mode(mode):
                res["run"] = _section(_program, rank, world)
    except Exception:  # noqa: BLE001
        res["crash"] = traceback.format_exc()
    m = torchtpu.metrics()
    res["fused"] = m.get("regions_with_collectives", 0)
    res["in_graph"] = m.get("in_graph_collective_graphs", 0)
    print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["defer_and_fuse", pytest.param("compile", marks=pytest.mark.slow)])
def test_each_rank_reports_its_own_flags(mode):
    job = multiproc.launch(HERE, mode)
    res = [multiproc.result(p) for p in job]
    for r in res:
        assert "crash" not in r, r["crash"]
        # the checked gather and the all_reduce were one SPMD program
        assert (r["in_graph"] if mode == "compile" else r["fused"]) > 0, r
    r0, r1 = (r["run"] for r in sorted(res, key=lambda r: r["rank"]))
    # CPU: gather of [0, 3] from 2 * arange(4) is [0, 6], + 1
    assert r0.get("value") == [1.0, 7.0], r0
    cls, msg = r1.get("error", [None, ""])
    assert cls == "RuntimeError", r1
    assert "index 9 is out of bounds for dimension 0 with size 4" in msg and "gather" in msg, msg
    assert r0["after"] == r1["after"] == [3.0, 3.0]


if __name__ == "__main__":
    _worker(sys.argv[1])
