"""Host cost per op in each execution path, next to torch CPU eager and the floor, in one run.

    python -m torchtpu.bench eager [--iters N] [--repeats R]

Each case issues N ops back to back (no sync between them, as a training loop
does), then waits for the last result; the cost per op is the best of R repeats.
Paths: torch CPU eager; the floor, a `jax.jit` call of the same op on device arrays
(PJRT's own dispatch from Python); tpu strict (a cache hit); defer_and_fuse recording
(the loop alone, the region's flush and run not counted); a `torch.compile(backend="tpu")`
graph of the op, called (guards included). Ratios are to the floor.
"""
from __future__ import annotations

import argparse
import time

import torch

import torchtpu


def _per_op(fn, x, y, iters: int, repeats: int, sync) -> float:
    fn(x, y)
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn(x, y)
        sync(out)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


def _tpu_sync(out=None):
    if out is not None:
        torchtpu.runtime.transfer.value(out).block_until_ready()


def _cpu_sync(out=None):
    pass


# (name, shape, torch op, the same op on JAX arrays for the floor)
CASES = [
    ("add", (16, 16), lambda a, b: a + b, lambda a, b: a + b),
    ("add_", (16, 16), lambda a, b: a.add_(b, alpha=0.5), lambda a, b: a + 0.5 * b),
    ("mul scalar", (16, 16), lambda a, b: a * 1.0001, lambda a, b: a * 1.0001),
    ("matmul", (64, 64), lambda a, b: a @ b, lambda a, b: a @ b),
    ("matmul", (256, 256), lambda a, b: a @ b, lambda a, b: a @ b),
    ("view+add", (16, 16), lambda a, b: a.t() + b, lambda a, b: a.T + b),
    ("row add", (16, 16), lambda a, b: a[3] + b[5], lambda a, b: a[3] + b[5]),  # views at nonzero offsets
    ("sum", (16, 16), lambda a, b: a.sum(1), lambda a, b: a.sum(1)),
]


def _floor(jfn, x, y, iters: int, repeats: int) -> float:
    import jax

    f = jax.jit(jfn)
    xa, ya = jax.numpy.asarray(x.numpy()), jax.numpy.asarray(y.numpy())
    f(xa, ya).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = f(xa, ya)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


def _record(fn, x, y, iters: int, repeats: int) -> float:
    """defer_and_fuse: the recording loop alone (each repeat's region flushed after the clock stops)."""
    best = float("inf")
    with torchtpu.eager_mode("defer_and_fuse"):
        for _ in range(repeats + 1):  # the first compiles the region
            t0 = time.perf_counter()
            for _ in range(iters):
                out = fn(x, y)
            best = min(best, (time.perf_counter() - t0) / iters)
            torch.tpu.synchronize()
    del out
    return best * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench eager")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rows = []
    for i, (name, shape, fn, jfn) in enumerate(CASES, 1):
        print(f"[{i}/{len(CASES)}] {name} {shape} ...", flush=True)
        x, y = torch.randn(shape), torch.randn(shape)
        cpu = _per_op(fn, x.clone(), y, args.iters, args.repeats, _cpu_sync)
        floor = _floor(jfn, x, y, args.iters, args.repeats)
        xt, yt = x.to("tpu"), y.to("tpu")
        torchtpu.reset_metrics()
        tpu = _per_op(fn, xt, yt, args.iters, args.repeats, _tpu_sync)
        m = torchtpu.metrics()
        compiles, fallbacks = m["compiles"], m["cpu_fallbacks"]
        rec = _record(fn, xt, yt, args.iters, args.repeats)
        torch._dynamo.reset()
        graph = _per_op(torch.compile(fn, backend="tpu"), xt, yt, args.iters, args.repeats, _tpu_sync)
        rows.append((name, "x".join(map(str, shape)), cpu, floor, tpu, rec, graph, compiles, fallbacks))
    print()
    print(f"host cost per op on XLA:{torchtpu.platform()} (us, best of {args.repeats} x {args.iters}); "
          "x: ratio to the jax.jit floor")
    hdr = (f"{'op':<11}{'shape':>8}{'torch cpu':>10}{'jax floor':>10}{'strict':>9}{'x':>5}{'d&f rec':>9}{'x':>5}"
           f"{'graph':>8}{'x':>5}{'compiles':>9}{'fallbacks':>10}")
    print(hdr)
    print("-" * len(hdr))
    for name, shape, cpu, floor, tpu, rec, graph, comp, fb in rows:
        print(f"{name:<11}{shape:>8}{cpu:>10.1f}{floor:>10.1f}{tpu:>9.1f}{tpu / floor:>5.1f}{rec:>9.1f}"
              f"{rec / floor:>5.1f}{graph:>8.1f}{graph / floor:>5.1f}{comp:>9}{fb:>10}")
    return 0
