"""Mixed precision side by side: float32 vs bf16 autocast vs bf16 weights, in one run.

    python -m torchtpu.bench amp [--steps N] [--warmup W] [--batch B] [--seq S]

The small GPT's training step (forward, backward, AdamW) in each precision, on tpu in
strict, defer_and_fuse and compiled (torch.compile(backend="tpu") around forward and
backward), and the same precision on torch CPU eager as the numerical reference. Per
row: ms/step after warm-up, the ratio against float32 in the same execution mode
(the baseline of this run), and the largest relative loss difference against CPU.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import torchtpu

from .models import TinyGPT

PRECISIONS = ("float32", "bf16 autocast", "bf16 weights")
EXECUTIONS = ("cpu", "strict", "defer_and_fuse", "compile")


def _data(batch, seq, n=4):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (n, batch, seq + 1), generator=g)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in idx]


def _run(precision: str, execution: str, data, steps: int, warmup: int):
    """(ms per step after warm-up, losses, compiles during the timed steps)."""
    dev = "cpu" if execution == "cpu" else "tpu"
    mode = "strict" if execution in ("cpu", "compile") else execution
    torch.manual_seed(0)
    model = TinyGPT(d=64, layers=2, heads=4)
    if precision == "bf16 weights":
        model = model.to(torch.bfloat16)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batches = [(x.to(dev), y.to(dev)) for x, y in data]
    autocast = precision == "bf16 autocast"

    def fwd_bwd(x, y):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        return loss.detach()

    fn = torch.compile(fwd_bwd, backend="tpu") if execution == "compile" else fwd_bwd
    losses = []
    with torchtpu.eager_mode(mode):
        def step(i):
            x, y = batches[i % len(batches)]
            losses.append(fn(x, y))
            opt.step()
            opt.zero_grad()

        for i in range(warmup):
            step(i)
        if dev == "tpu":
            torch.tpu.synchronize()
        before = torchtpu.metrics()["compiles"]
        t0 = time.perf_counter()
        for i in range(warmup, warmup + steps):
            step(i)
        vals = [float(v) for v in torch.stack(losses).cpu()]
        ms = 1e3 * (time.perf_counter() - t0) / steps
        compiles = torchtpu.metrics()["compiles"] - before
    return ms, vals, compiles


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench amp")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    args = p.parse_args(argv)
    data = _data(args.batch, args.seq)

    results = {}
    total = len(PRECISIONS) * len(EXECUTIONS)
    n = 0
    for precision in PRECISIONS:
        for execution in EXECUTIONS:
            n += 1
            print(f"[{n}/{total}] {precision:<14} {execution:<15} ...", end=" ", flush=True)
            ms, losses, compiles = _run(precision, execution, data, args.steps, args.warmup)
            results[precision, execution] = (ms, losses, compiles)
            print(f"{ms:8.1f} ms/step, final loss {losses[-1]:.4f}", flush=True)

    print()
    print(f"small GPT training step (2 layers, d=64, batch {args.batch}, seq {args.seq}, AdamW), "
          f"XLA:{torchtpu.platform()}; {args.steps} timed steps after {args.warmup} warm-up")
    hdr = (f"{'precision':<15}{'execution':<16}{'ms/step':>9}{'vs float32':>12}"
           f"{'max rel loss diff vs CPU':>26}{'compiles':>10}")
    print(hdr)
    print("-" * len(hdr))
    for precision in PRECISIONS:
        ref = results[precision, "cpu"][1]
        for execution in EXECUTIONS:
            ms, losses, compiles = results[precision, execution]
            base = results["float32", execution][0]
            diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref))
            shown = "(reference)" if execution == "cpu" else f"{diff:.1e}"
            print(f"{precision:<15}{execution:<16}{ms:>9.1f}{base / ms:>11.2f}x{shown:>26}"
                  f"{compiles if execution != 'cpu' else '':>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
