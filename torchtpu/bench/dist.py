"""Data-parallel training over the c10d backend "tpu", in one run.

    python -m torchtpu.bench dist [--steps N] [--warmup W] [--batch B] [--seq S] [--mode strict|defer_and_fuse]

Training step (forward + backward + AdamW) of the small GPT (2 layers, d=128), batch B
per process:
  1. 1 process, no DDP: the baseline;
  2. 2 processes, DDP with skinny collectives (one XLA executable per all-reduce bucket);
  3. the same 2 processes, DDP inside `no_sync()`: the step without gradient
     communication, timed in blocks interleaved with (2), so (2) - (3) is what the
     collectives (and DDP's bucket copies) cost;
  4. 2 processes, DDP compiled: `torch.compile(ddp_model, backend="tpu")` with
     `torch._dynamo.config.optimize_ddp = "python_reducer"` (DDP's C++ reducer is
     replaced by per-parameter post-accumulate-grad hooks calling
     `_functional_collectives.all_reduce`) and the backward under compiled autograd,
     which traces those hooks, so the gradient all-reduces are `_c10d_functional`
     ops inside the compiled backward graph; the optimizer step stays eager. Run
     twice, differing only by TORCHTPU_COLLECTIVES: "skinny" (each collective its
     own executable, between compiled pieces) and "in_graph" (the collectives are
     part of the compiled program). Their first (warm-up) steps' losses are checked
     against the eager DDP run's: same init, same data, same losses.
  5. (in strict mode) 2 processes, the eager DDP of (2) in defer_and_fuse, run twice,
     differing only by TORCHTPU_COLLECTIVES: "skinny" (each bucket all-reduce
     materializes the region and runs as its own executable) and "in_graph" (the
     all-reduce is recorded into the step's region, so forward, backward, all-reduce and
     AdamW run as one SPMD program), alternated `--launches` times.
Each process is launched as torchrun would (env://, RANK/WORLD_SIZE/MASTER_ADDR/PORT)
on XLA:CPU unless a TPU/GPU is present. ms/step is the median over timing blocks,
after warm-up; losses are read back once at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world: int, args: list[str], env_extra: dict | None = None) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TF_CPP_MIN_LOG_LEVEL="2", **(env_extra or {}))
        procs.append(subprocess.Popen([sys.executable, "-m", "torchtpu.bench.dist", "--worker", *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        so, se = p.communicate()
        line = next((ln for ln in so.splitlines() if ln.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            tail = "\n".join(ln for ln in se.splitlines() if not ln.startswith(("W1", "I1", "    @")))[-3000:]
            raise SystemExit(f"worker failed (rc={p.returncode}):\n{tail}")
        results.append(json.loads(line[len("RESULT "):]))
    return results


def _worker(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--kind", choices=("single", "ddp", "ddp_compiled"))
    p.add_argument("--steps", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--rounds", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--mode")
    p.add_argument("--no-nosync", action="store_true")
    a = p.parse_args(argv)

    import contextlib

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import torchtpu

    from .models import TinyGPT

    torchtpu.set_eager_mode(a.mode)
    world, rank = 1, 0
    if a.kind != "single":
        t0 = time.perf_counter()
        dist.init_process_group("tpu")
        init_s = time.perf_counter() - t0
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        init_s = 0.0
    g = torch.Generator().manual_seed(rank)
    data = [torch.randint(0, 256, (a.batch, a.seq + 1), generator=g) for _ in range(4)]
    torch.manual_seed(0)
    model = TinyGPT().to("tpu")
    forward = model
    backward_ctx = contextlib.nullcontext
    if a.kind != "single":
        from torch.nn.parallel import DistributedDataParallel as DDP

        if a.kind == "ddp_compiled":
            # DDP's python reducer: per-parameter hooks that all-reduce with functional
            # collectives; must be set before DDP is constructed
            torch._dynamo.config.optimize_ddp = "python_reducer"
        model = DDP(model)
        forward = model
        if a.kind == "ddp_compiled":
            from torch._dynamo import compiled_autograd

            forward = torch.compile(model, backend="tpu")
            # compiled autograd traces the backward, the reducer's hooks and their
            # all-reduces included, into one graph for the "tpu" backend
            def backward_ctx():
                return compiled_autograd._enable(torch.compile(backend="tpu", fullgraph=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batches = [(x[:, :-1].to("tpu"), x[:, 1:].to("tpu")) for x in data]
    losses = []
    variants = {"sync": contextlib.nullcontext}
    if a.kind == "ddp" and not a.no_nosync:
        variants["nosync"] = model.no_sync  # same step, no gradient communication

    def step(i, ctx):
        x, y = batches[i % len(batches)]
        with ctx():
            loss = F.cross_entropy(forward(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            with backward_ctx():
                loss.backward()
        opt.step()
        losses.append(loss.detach())

    t0 = time.perf_counter()
    i = 0
    for ctx in variants.values():
        for _ in range(a.warmup):
            step(i, ctx)
            i += 1
    torch.tpu.synchronize()
    warm_s = time.perf_counter() - t0
    per = max(a.steps // a.rounds, 1)
    blocks: dict = {k: [] for k in variants}
    for _ in range(a.rounds):  # variants interleaved block by block: load drifts hit both alike
        for name, ctx in variants.items():
            if world > 1:
                dist.barrier()  # start each block together
            t0 = time.perf_counter()
            for _ in range(per):
                step(i, ctx)
                i += 1
            torch.tpu.synchronize()
            blocks[name].append((time.perf_counter() - t0) * 1000 / per)
    final = torch.stack(losses).cpu().tolist()
    ms = {k: statistics.median(v) for k, v in blocks.items()}
    m = torchtpu.metrics()
    counts = {k: m.get(k, 0) for k in ("in_graph_collective_graphs", "skinny_graphs", "cpu_fallbacks",
                                       "regions_with_collectives", "regions_replayed")}
    print("RESULT " + json.dumps(dict(rank=rank, world=world, ms=ms, blocks=blocks, warmup_s=warm_s,
                                      init_s=init_s, last_loss=final[-1], warm_losses=final[:a.warmup],
                                      collectives=torchtpu.config.read("collectives"),
                                      metrics=counts)), flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench dist")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="timing blocks per configuration")
    p.add_argument("--batch", type=int, default=8, help="sequences per process")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--mode", default="strict", choices=("strict", "defer_and_fuse"))
    p.add_argument("--launches", type=int, default=3, help="alternated jobs per compiled configuration")
    args = p.parse_args(argv)
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--rounds", str(args.rounds),
              "--batch", str(args.batch), "--seq", str(args.seq), "--mode", args.mode]
    rows = []  # (configuration, procs, ms/step)
    print(f"[1/5] 1 process, no DDP (baseline): warm-up {args.warmup} steps, then {args.steps} timed ...", flush=True)
    t0 = time.perf_counter()
    (one,) = _launch(1, ["--kind", "single", *common])
    rows.append(("1 process (baseline)", 1, one["ms"]["sync"]))
    print(f"      {one['ms']['sync']:.1f} ms/step ({time.perf_counter() - t0:.0f} s incl. start-up and compiles)",
          flush=True)
    print("[2/5] 2 processes, DDP, blocks with and without gradient all-reduce interleaved ...", flush=True)
    t0 = time.perf_counter()
    two = _launch(2, ["--kind", "ddp", *common])
    # a data-parallel step ends when its slowest rank does
    for name, key in (("2 processes, DDP skinny", "sync"), ("2 processes, DDP no_sync", "nosync")):
        rows.append((name, 2, max(r["ms"][key] for r in two)))
    print(f"      {rows[1][2]:.1f} / {rows[2][2]:.1f} ms/step ({time.perf_counter() - t0:.0f} s incl. start-up, "
          f"init_process_group {max(r['init_s'] for r in two):.1f} s)", flush=True)
    compiled = {}
    runs: dict = {"skinny": [], "in_graph": []}
    names = {"skinny": "DDP compiled, skinny collectives", "in_graph": "DDP compiled, in-graph collectives"}
    # the two compiled configurations run in separate jobs, alternated `--launches` times
    # each, so that load drifting during the run hits both alike (median of the launches)
    for k in range(args.launches):
        for i, mode in enumerate(("skinny", "in_graph")):
            print(f"[{3 + i}/5] 2 processes, {names[mode]} (TORCHTPU_COLLECTIVES={mode}), "
                  f"launch {k + 1}/{args.launches} ...", flush=True)
            t0 = time.perf_counter()
            # the collective-matching pre-check (c10d store) runs for each collective launched
            # through the process group, i.e. for every skinny one but not inside an in-graph
            # program: off in both compiled rows, so that they differ only by the collectives
            res = _launch(2, ["--kind", "ddp_compiled", *common],
                          env_extra=dict(TORCHTPU_COLLECTIVES=mode, TORCHTPU_DIST_CHECK="0"))
            compiled[mode] = res
            runs[mode].append(max(r["ms"]["sync"] for r in res))
            print(f"      {runs[mode][-1]:.1f} ms/step ({time.perf_counter() - t0:.0f} s incl. start-up and "
                  f"compiles; warm-up {max(r['warmup_s'] for r in res):.1f} s)", flush=True)
    for mode in ("skinny", "in_graph"):
        rows.append((names[mode], 2, statistics.median(runs[mode])))
    fused = None
    if args.mode == "strict":
        # the same eager DDP in defer_and_fuse, collectives on their own (each bucket all-reduce
        # materializes the region and runs as its own executable) or recorded into the region
        # (the step is one SPMD program), alternated `--launches` times
        druns: dict = {"skinny": [], "in_graph": []}
        for k in range(args.launches):
            for flag, what in (("skinny", "skinny collectives"), ("in_graph", "collectives fused into the step")):
                print(f"[5/5] 2 processes, DDP in defer_and_fuse, {what} (TORCHTPU_COLLECTIVES={flag}), "
                      f"launch {k + 1}/{args.launches} ...", flush=True)
                res = _launch(2, ["--kind", "ddp", *common[:-1], "defer_and_fuse", "--no-nosync"],
                              env_extra=dict(TORCHTPU_COLLECTIVES=flag))
                druns[flag].append(max(r["ms"]["sync"] for r in res))
                if flag == "in_graph":
                    fused = res
                print(f"      {druns[flag][-1]:.1f} ms/step", flush=True)
        rows.append(("DDP defer_and_fuse, skinny collectives", 2, statistics.median(druns["skinny"])))
        rows.append(("DDP defer_and_fuse, fused collectives", 2, statistics.median(druns["in_graph"])))

    base = rows[0][2]
    skinny_ms = rows[3][2]
    print()
    print(f"DDP training step, small GPT (2 layers, d=128), batch {args.batch} x seq {args.seq} per process, "
          f"eager mode {args.mode}, XLA:CPU collectives over gloo where no TPU; ms/step = median of "
          f"{args.rounds} blocks of {max(args.steps // args.rounds, 1)} steps after {args.warmup} warm-up")
    hdr = f"{'configuration':<39}{'procs':>6}{'ms/step':>10}{'vs 1 proc':>11}{'samples/s':>11}{'vs skinny':>11}"
    print(hdr)
    print("-" * len(hdr))
    for name, world, ms in rows:
        vs = f"{skinny_ms / ms:>10.2f}x" if name.endswith("in-graph collectives") else ""
        if name.endswith("fused collectives"):
            vs = f"{rows[-2][2] / ms:>10.2f}x"  # against the same defer_and_fuse DDP, skinny collectives
        print(f"{name:<39}{world:>6}{ms:>10.1f}{ms / base:>10.2f}x{world * args.batch * 1000 / ms:>11.1f}{vs}")
    ddp, nosync = rows[1][2], rows[2][2]
    print(f"compiled rows, ms/step per launch in the order run: skinny {[round(v, 1) for v in runs['skinny']]}, "
          f"in-graph {[round(v, 1) for v in runs['in_graph']]}")
    if fused is not None:
        print(f"defer_and_fuse rows, per launch: skinny {[round(v, 1) for v in druns['skinny']]}, "
              f"fused {[round(v, 1) for v in druns['in_graph']]}")
    print()
    print("vs 1 proc: ms/step over the baseline's; vs skinny: compiled-skinny ms/step over this row's "
          "(> 1: in-graph is faster); for the fused defer_and_fuse row, the skinny defer_and_fuse row's over its. Compiled rows: DDP python reducer (one all-reduce per parameter, fused into buckets by the compiler), "
          "backward under compiled autograd, optimizer eager, TORCHTPU_DIST_CHECK=0")
    print(f"gradient all-reduce cost (skinny collectives, DDP buckets): {ddp - nosync:.1f} ms/step "
          f"({(ddp - nosync) / ddp * 100:.0f}% of the DDP step)")
    # correctness: the other runs' warm-up steps (same init, same data) against eager DDP's
    def worst_vs_eager(res) -> float:
        worst = 0.0
        for r, e in zip(sorted(res, key=lambda r: r["rank"]), sorted(two, key=lambda r: r["rank"])):
            for a_, b_ in zip(r["warm_losses"], e["warm_losses"]):
                worst = max(worst, abs(a_ - b_) / max(abs(b_), 1e-12))
        return worst

    checked = [(f"DDP compiled, {mode}", res, lambda m: (
        f"graphs with in-graph collectives {m['in_graph_collective_graphs']}, cut at collectives (skinny) "
        f"{m['skinny_graphs']}")) for mode, res in compiled.items()]
    if fused is not None:
        checked.append(("DDP defer_and_fuse", fused, lambda m: (
            f"regions with collectives {m['regions_with_collectives']}, regions replayed {m['regions_replayed']}")))
    ok = True
    for label, res, counts in checked:
        worst = worst_vs_eager(res)
        good = worst <= 1e-4
        ok &= good
        m = res[0]["metrics"]
        print(f"{label}: first {args.warmup} losses vs eager DDP, every rank: max rel diff {worst:.1e} "
              f"({'match' if good else 'MISMATCH'}); {counts(m)}, cpu fallbacks {m['cpu_fallbacks']}")
    return 0 if ok else 1


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(_worker(sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
