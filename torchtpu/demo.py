"""`make demo`: the same training program on "tpu" and on the CPU, side by side.

A 2-layer MLP learns to classify points of three interleaved spirals, with
AdamW and cross-entropy. The only difference between the two runs is the
device string. Prints both loss curves, the wall time of each, and what the
tpu run compiled and whether anything fell back to the CPU.
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import torchtpu


def spirals(n_per_class: int = 256, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(classes):
        r = torch.linspace(0.05, 1.0, n_per_class)
        theta = torch.linspace(0, 4 * math.pi / classes * 2, n_per_class) + 2 * math.pi * c / classes
        theta = theta + 0.15 * torch.randn(n_per_class, generator=g)
        xs.append(torch.stack([r * torch.sin(theta), r * torch.cos(theta)], dim=1))
        ys.append(torch.full((n_per_class,), c, dtype=torch.int64))
    return torch.cat(xs), torch.cat(ys)


def make_model(hidden: int = 128) -> nn.Module:
    return nn.Sequential(nn.Linear(2, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 3))


WARMUP = 10  # steps excluded from the steady-state time (they compile)


def train(device: str, steps: int, batch: int, seed: int = 0):
    torch.manual_seed(seed)
    model = make_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    x_all, y_all = spirals()
    perm = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(seed))
    losses = []
    t0 = time.perf_counter()
    warm = None
    for step in range(steps):
        if step == WARMUP:
            warm = time.perf_counter()
        idx = perm[(step * batch) % len(x_all):][:batch]
        if len(idx) < batch:
            idx = perm[:batch]
        x, y = x_all[idx].to(device), y_all[idx].to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    end = time.perf_counter()
    wall = end - t0
    steady_ms = 1e3 * (end - warm) / (steps - WARMUP) if warm is not None else float("nan")
    with torch.no_grad():
        acc = (model(x_all.to(device)).argmax(1).cpu() == y_all).float().mean().item()
    return losses, wall, steady_ms, acc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.demo")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args(argv)

    print(f"torchtpu {torchtpu.__version__}: 'tpu' is XLA:{torchtpu.platform()} through PJRT")
    print(f"training a 2-layer MLP on 3 spirals, {args.steps} steps, AdamW, batch {args.batch}\n")
    cpu_losses, cpu_wall, cpu_ms, cpu_acc = train("cpu", args.steps, args.batch)
    torchtpu.reset_metrics()
    tpu_losses, tpu_wall, tpu_ms, tpu_acc = train("tpu", args.steps, args.batch)
    m = torchtpu.metrics()

    print(f"{'step':>6}{'cpu loss':>12}{'tpu loss':>12}{'rel diff':>11}")
    every = max(1, args.steps // 10)
    for i in list(range(0, args.steps, every)) + [args.steps - 1]:
        c, t = cpu_losses[i], tpu_losses[i]
        print(f"{i:>6}{c:>12.5f}{t:>12.5f}{abs(c - t) / max(abs(c), 1e-12):>11.2e}")
    worst = max(abs(c - t) / max(abs(c), 1e-12) for c, t in zip(cpu_losses, tpu_losses))
    print()
    print(f"{'device':<8}{'wall s':>9}{'ms/step after warm-up':>24}{'accuracy':>10}")
    print(f"{'cpu':<8}{cpu_wall:>9.2f}{cpu_ms:>24.2f}{cpu_acc:>10.3f}")
    print(f"{'tpu':<8}{tpu_wall:>9.2f}{tpu_ms:>24.2f}{tpu_acc:>10.3f}")
    print(f"(the tpu wall time includes compiling each new op signature once; "
          f"mode: {torchtpu.get_eager_mode()})")
    print(f"\nworst relative loss difference over {args.steps} steps: {worst:.2e}")
    print(f"tpu run: {m['compiles']} compiles, {m['cache_hits']} cache hits, "
          f"{m['executions']} executions, {m['cpu_fallbacks']} CPU fallbacks {m['fallback_ops'] or ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
