"""A fused kernel through torchtpu.jax_op vs the same math as PyTorch ops, in one run.

    python -m torchtpu.bench kernels [--steps N] [--rounds R] [--batch B] [--dim D]

The block is RMSNorm then SwiGLU, y = silu(a) * b with [a, b] = rmsnorm(x) * g @ w, written
once as one JAX function registered with jax_op (one op forward, one vjp op backward) and once
as PyTorch ops (about 10 ops forward, 15 backward). A training step is forward, a mean-square
loss, backward and an SGD update of g and w; ms/step is the median of interleaved timing
blocks for each of strict, defer_and_fuse and torch.compile(backend="tpu"). Both versions
must give the same losses (the last column).
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

import torchtpu

EPS = 1e-6


def block_torch(x, g, w):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g
    a, b = (h @ w).chunk(2, -1)
    return F.silu(a) * b


def _block_jax(x, g, w):
    h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * g
    a, b = jnp.split(h @ w, 2, axis=-1)
    return jax.nn.silu(a) * b


_op = None


def block_fused(x, g, w):
    global _op
    if _op is None:
        _op = torchtpu.jax_op("torchtpu_bench::rmsnorm_swiglu", _block_jax)
    return _op(x, g, w)


KINDS = {"PyTorch ops": block_torch, "one jax_op": block_fused}
MODES = ("strict", "defer_and_fuse", "compile")


def _setup(block, mode: str, data, dim: int, hidden: int, warmup: int):
    torch.manual_seed(0)
    eager = "strict" if mode == "compile" else mode
    with torchtpu.eager_mode(eager):
        g = torch.nn.Parameter(torch.ones(dim, device="tpu"))
        w = torch.nn.Parameter((torch.randn(dim, 2 * hidden) / dim ** 0.5).to("tpu"))
        opt = torch.optim.SGD([g, w], lr=0.1)
        xs = [x.to("tpu") for x in data]

        def loss_fn(x, g, w):
            return block(x, g, w).square().mean()

        fn = torch.compile(loss_fn, backend="tpu", fullgraph=True) if mode == "compile" else loss_fn
        losses = []

        def step(i):
            loss = fn(xs[i % len(xs)], g, w)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())

        for i in range(warmup):
            step(i)
        torch.tpu.synchronize()
    return step, losses, eager


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench kernels")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="interleaved timing blocks per run")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args(argv)

    gen = torch.Generator().manual_seed(0)
    data = [torch.randn(args.batch, args.dim, generator=gen) for _ in range(4)]
    runs = {}
    n = 0
    for mode in MODES:
        for kind, block in KINDS.items():
            n += 1
            print(f"[{n}/{len(MODES) * len(KINDS)}] warming up {kind} in {mode} ...", flush=True)
            runs[(mode, kind)] = _setup(block, mode, data, args.dim, args.hidden, args.warmup)
    per = max(args.steps // args.rounds, 1)
    times = {k: [] for k in runs}
    execs = {k: 0 for k in runs}
    i = args.warmup
    for r in range(args.rounds):
        print(f"timing round {r + 1}/{args.rounds} ({per} steps per run) ...", flush=True)
        for key, (step, losses, eager) in runs.items():
            with torchtpu.eager_mode(eager):
                torch.tpu.synchronize()
                torchtpu.reset_metrics()
                t0 = time.perf_counter()
                for k in range(per):
                    step(i + k)
                losses[-1].item()
                times[key].append((time.perf_counter() - t0) / per)
                execs[key] += torchtpu.metrics()["executions"]
        i += per

    def ms(key):
        t = sorted(times[key])
        return 1e3 * t[len(t) // 2]

    print()
    print(f"RMSNorm+SwiGLU training step (x {args.batch}x{args.dim}, w {args.dim}x{2 * args.hidden}, SGD), "
          f"XLA:{torchtpu.platform()}, ms/step: median of {args.rounds} interleaved blocks of {per} steps")
    hdr = (f"{'mode':<16}{'PyTorch ops':>13}{'one jax_op':>12}{'speed-up':>10}"
           f"{'execs/step':>13}{'max rel loss diff':>19}")
    print(hdr)
    print("-" * len(hdr))
    steps_timed = per * args.rounds
    for mode in MODES:
        a, b = (mode, "PyTorch ops"), (mode, "one jax_op")
        la = [v.item() for v in runs[a][1]]
        lb = [v.item() for v in runs[b][1]]
        worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(la, lb))
        ex = f"{execs[a] / steps_timed:.0f} / {execs[b] / steps_timed:.0f}"
        print(f"{mode:<16}{ms(a):>13.2f}{ms(b):>12.2f}{ms(a) / ms(b):>9.2f}x{ex:>13}{worst:>19.1e}")
    return 0
