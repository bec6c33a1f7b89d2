"""A recurrent loop on the device: a Python loop vs torch's scan, in one run.

    python -m torchtpu.bench control [--steps 128] [--iters 5] [--warmup 2]

An RNN cell (h = tanh(x_t W + h U + b), batch 16, 32 -> 64) over --steps time steps and
a loss over its outputs, forward only and with the backward, written twice: as a Python for-loop over the steps and as
torch._higher_order_ops.scan. Each runs in defer_and_fuse and under
torch.compile(backend="tpu", fullgraph=True). Reported per row: programs compiled
(torchtpu.metrics()["compiles"], first call included), the first call's seconds
(tracing and XLA compilation), ms per step after warm-up (median), the speed-up over
the Python loop in the same mode, and the largest difference of the loss and gradients
from the Python loop's.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch._higher_order_ops.scan import scan

import torchtpu

BATCH, IN, HIDDEN = 16, 32, 64


def rnn_loop(xs, h, w, u, b):
    ys = []
    for t in range(xs.shape[0]):
        h = torch.tanh(xs[t] @ w + h @ u + b)
        ys.append(h)
    return h, torch.stack(ys)


def rnn_scan(xs, h, w, u, b):
    def cell(h, x):
        h = torch.tanh(x @ w + h @ u + b)
        return h, h.clone()

    return scan(cell, h, xs)


def _loss(rnn):
    def loss(xs, h, w, u, b):
        h, ys = rnn(xs, h, w, u, b)
        return ys.pow(2).mean() + h.sum() * 1e-3

    return loss


def _data(steps):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(steps, BATCH, IN, generator=g)
    h0 = torch.zeros(BATCH, HIDDEN)
    w = torch.randn(IN, HIDDEN, generator=g) * IN ** -0.5
    u = torch.randn(HIDDEN, HIDDEN, generator=g) * HIDDEN ** -0.5
    b = torch.zeros(HIDDEN)
    return xs, h0, w, u, b


def _run(rnn, mode: str, train: bool, steps: int, warmup: int, iters: int):
    xs, h0, w, u, b = [t.to("tpu") for t in _data(steps)]
    params = [p.requires_grad_(train) for p in (w, u, b)]
    fn = _loss(rnn)
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="tpu", fullgraph=True)
    eager = "strict" if mode == "compile" else mode

    def step():
        for p in params:
            p.grad = None
        loss = fn(xs, h0, *params)
        if train:
            loss.backward()
        torch.tpu.synchronize()
        return loss

    with torchtpu.eager_mode(eager):
        torch.tpu.synchronize()
        before = torchtpu.metrics()["compiles"]
        t0 = time.perf_counter()
        loss = step()
        first = time.perf_counter() - t0
        for _ in range(warmup):
            step()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t0)
        compiles = torchtpu.metrics()["compiles"] - before
        result = [loss.detach().cpu()] + ([p.grad.cpu() for p in params] if train else [])
    return compiles, first, statistics.median(times) * 1e3, result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.bench control")
    ap.add_argument("--steps", type=int, default=128, help="time steps of the recurrence")
    ap.add_argument("--iters", type=int, default=5, help="timed steps per row")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    args = ap.parse_args(argv)

    rows = []
    plan = [(task, mode, name, fn) for task in ("forward", "fwd+bwd") for mode in ("defer_and_fuse", "compile")
            for name, fn in (("python loop", rnn_loop), ("scan", rnn_scan))]
    for i, (task, mode, name, fn) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {task}, {name}, {mode}, {args.steps} steps ...", flush=True)
        rows.append((task, mode, name) + _run(fn, mode, task != "forward", args.steps, args.warmup, args.iters))

    print()
    print(f"RNN cell over {args.steps} steps (batch {BATCH}, {IN} -> {HIDDEN}), loss and its backward, "
          f"XLA:{torchtpu.platform()}; median of {args.iters} steps after {args.warmup} warm-up")
    hdr = (f"{'task':<9}{'mode':<16}{'loop':<13}{'compiles':>9}{'first call s':>14}{'ms/step':>10}"
           f"{'vs loop':>9}{'max diff':>11}")
    print(hdr)
    print("-" * len(hdr))
    base = {}
    for task, mode, name, compiles, first, ms, result in rows:
        if name == "python loop":
            base[task, mode] = (ms, result)
        ref_ms, ref = base[task, mode]
        diff = max((a - b).abs().max().item() for a, b in zip(result, ref))
        print(f"{task:<9}{mode:<16}{name:<13}{compiles:>9}{first:>14.2f}{ms:>10.2f}{ref_ms / ms:>8.2f}x{diff:>11.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
