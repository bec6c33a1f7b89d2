"""Host<->device copies: blocking vs non-blocking, pageable vs pinned, in one run.

    python -m torchtpu.bench transfers [--n N] [--iters I] [--mb MB]

- device->host: each iteration dispatches device work (a chain of N x N matmuls),
  copies its result to the host, does host work of about the same length (a CPU
  matmul), then uses the copied value. Blocking (`.to("cpu")`, the baseline) waits for
  the device before the host work starts; non-blocking (`.to("cpu", non_blocking=True)`,
  a pinned result landed by a copy thread, then `torch.tpu.synchronize()` before use)
  overlaps them. Per row: ms/iteration, ms spent inside the `.to` call, and the
  speed-up over the blocking baseline.
- host->device: a MB-sized batch from pageable memory (`.to("tpu")`, the baseline) vs
  from pinned memory (`.to("tpu", non_blocking=True)`), and the cost of `pin_memory()`.
  PJRT stages host->device copies itself, so pinned memory is expected to be on par.
"""
from __future__ import annotations

import argparse
import time

import torch

import torchtpu  # noqa: F401 - registers "tpu"


def _time(fn, iters: int) -> tuple[float, float]:
    """(ms per iteration, ms inside the copy call per iteration)."""
    fn()  # warm-up: compiles
    torch.tpu.synchronize()
    inside = 0.0
    t0 = time.perf_counter()
    for _ in range(iters):
        inside += fn()
    torch.tpu.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters, inside * 1e3 / iters


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench transfers")
    p.add_argument("--n", type=int, default=512, help="matmul size of the device work")
    p.add_argument("--chain", type=int, default=4, help="matmuls per iteration")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--mb", type=int, default=16, help="size of the host->device batch")
    args = p.parse_args(argv)

    a = (torch.randn(args.n, args.n) / args.n ** 0.5).to("tpu")
    host_a = torch.randn(args.n, args.n)
    checks = []

    def d2h(non_blocking: bool):
        def run():
            y = a
            for _ in range(args.chain):
                y = y @ a
            t0 = time.perf_counter()
            out = y.to("cpu", non_blocking=non_blocking)
            inside = time.perf_counter() - t0
            for _ in range(args.chain):  # host work meanwhile
                host_a @ host_a
            if non_blocking:
                torch.tpu.synchronize()
            checks.append(float(out[0, 0]))
            return inside
        return run

    rows = []
    print(f"device->host: {args.chain} matmuls of {args.n}x{args.n}, then host work, {args.iters} iterations",
          flush=True)
    for name, nb in (("blocking .to('cpu')", False), ("non_blocking=True", True)):
        ms, inside = _time(d2h(nb), args.iters)
        rows.append(("device->host", name, ms, inside))
        print(f"  {name:<28} {ms:8.2f} ms/iter, {inside:7.2f} ms in the call", flush=True)
    ref = y_ref = None
    y_ref = a
    for _ in range(args.chain):
        y_ref = y_ref @ a
    ref = float(y_ref.cpu()[0, 0])
    assert all(abs(c - ref) <= 1e-4 * max(1.0, abs(ref)) for c in checks), "copied values differ"

    numel = args.mb * (1 << 20) // 4
    pageable = torch.randn(numel)
    pinned = pageable.pin_memory()

    def h2d(src, non_blocking):
        def run():
            t0 = time.perf_counter()
            t = src.to("tpu", non_blocking=non_blocking)
            inside = time.perf_counter() - t0
            (t * 2).sum()
            return inside
        return run

    print(f"host->device: {args.mb} MB, {args.iters} iterations", flush=True)
    for name, src, nb in (("pageable .to('tpu')", pageable, False), ("pinned, non_blocking=True", pinned, True)):
        ms, inside = _time(h2d(src, nb), args.iters)
        rows.append(("host->device", name, ms, inside))
        print(f"  {name:<28} {ms:8.2f} ms/iter, {inside:7.2f} ms in the call", flush=True)

    t0 = time.perf_counter()
    for _ in range(args.iters):
        pageable.pin_memory()
    pin_ms = (time.perf_counter() - t0) * 1e3 / args.iters
    t0 = time.perf_counter()
    for _ in range(args.iters):
        pageable.clone()
    clone_ms = (time.perf_counter() - t0) * 1e3 / args.iters

    print("\n| copy | variant | ms/iter | ms in the call | speed-up vs baseline |")
    print("|---|---|---|---|---|")
    base = {}
    for kind, name, ms, inside in rows:
        base.setdefault(kind, ms)
        print(f"| {kind} | {name} | {ms:.2f} | {inside:.2f} | {base[kind] / ms:.2f}x |")
    print(f"| pin_memory() of {args.mb} MB | vs clone() | {pin_ms:.2f} | - | {clone_ms / pin_ms:.2f}x |")
    return 0
