"""Per-op dispatch cost of strict eager next to torch CPU eager, in one run.

    python -m torchtpu.bench eager [--iters N] [--repeats R]

Each case issues N ops back to back (no sync between them, as a training loop
does), then waits for the last result; the cost per op is the best of R repeats.
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


CASES = [
    ("add", (16, 16), lambda a, b: a + b),
    ("add_", (16, 16), lambda a, b: a.add_(b, alpha=0.5)),
    ("mul scalar", (16, 16), lambda a, b: a * 1.0001),
    ("matmul", (64, 64), lambda a, b: a @ b),
    ("matmul", (256, 256), lambda a, b: a @ b),
    ("view+add", (16, 16), lambda a, b: a.t() + b),
    ("row add", (16, 16), lambda a, b: a[3] + b[5]),  # views at nonzero storage offsets
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench eager")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rows = []
    for i, (name, shape, fn) in enumerate(CASES, 1):
        print(f"[{i}/{len(CASES)}] {name} {shape} ...", flush=True)
        x, y = torch.randn(shape), torch.randn(shape)
        cpu = _per_op(fn, x.clone(), y, args.iters, args.repeats, _cpu_sync)
        xt, yt = x.to("tpu"), y.to("tpu")
        torchtpu.reset_metrics()
        tpu = _per_op(fn, xt, yt, args.iters, args.repeats, _tpu_sync)
        m = torchtpu.metrics()
        rows.append((name, "x".join(map(str, shape)), cpu, tpu, tpu / cpu, m["compiles"], m["cpu_fallbacks"]))
    print()
    print(f"strict eager on XLA:{torchtpu.platform()} vs torch CPU eager (us per op, best of {args.repeats} x {args.iters})")
    hdr = f"{'op':<12}{'shape':>10}{'torch cpu':>12}{'tpu strict':>12}{'ratio':>8}{'compiles':>10}{'fallbacks':>11}"
    print(hdr)
    print("-" * len(hdr))
    for name, shape, cpu, tpu, ratio, comp, fb in rows:
        print(f"{name:<12}{shape:>10}{cpu:>12.1f}{tpu:>12.1f}{ratio:>8.1f}{comp:>10}{fb:>11}")
    return 0
