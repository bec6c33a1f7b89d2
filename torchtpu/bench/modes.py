"""Eager modes side by side: strict vs defer_and_fuse, in one run.

    python -m torchtpu.bench modes [--steps N] [--warmup W] [--checks]

1. Training step (forward + backward + AdamW) of an MLP and of a small GPT
   (2 layers, d=128, seq 64, batch 8): ms/step after warm-up, speed-up of
   defer_and_fuse over strict, and the largest loss difference between modes.
   The modes run interleaved in blocks (median block per mode), each block's
   losses read back once at its end, as a loop that logs every N steps does.
2. Compiles in a 50-step defer_and_fuse loop whose learning rate follows a
   cosine schedule and whose last batch is shorter.
3. Greedy generation of 32 tokens with a KV cache that grows every token, each mode
   starting from empty executable caches.

--checks instead times the training steps of both modes with device-side checks on
and off (torchtpu.set_checks), interleaved in one run: the cost of the flags.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import torchtpu

from .models import MLP, TinyGPT, cosine_lr


def _mlp_task(batch=64):
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(4)]

    def make():
        return MLP()

    def loss_fn(model, x, y):
        return F.cross_entropy(model(x), y)

    return make, data, loss_fn


def _gpt_task(batch=8, seq=64):
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(4):
        idx = torch.randint(0, 256, (batch, seq + 1), generator=g)
        data.append((idx[:, :-1].contiguous(), idx[:, 1:].contiguous()))

    def make():
        return TinyGPT()

    def loss_fn(model, x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    return make, data, loss_fn


MODES = ("strict", "defer_and_fuse")


def _setup(task, mode: str, warmup: int):
    """A model, AdamW and data in `mode`, warmed up; returns (step function, losses)."""
    make, data, loss_fn = task
    torch.manual_seed(0)
    with torchtpu.eager_mode(mode):
        model = make().to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        batches = [(x.to("tpu"), y.to("tpu")) for x, y in data]
        losses = []

        def step(i):
            x, y = batches[i % len(batches)]
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())

        for i in range(warmup):
            step(i)
        torch.tpu.synchronize()
    return step, losses


def _train(task, steps: int, warmup: int, rounds: int):
    """Both modes, interleaved: `rounds` blocks of steps/rounds steps per mode, each block
    timed up to its last loss being on the host; ms/step is the median block per mode, so
    load that drifts during the run (a shared machine) hits both modes alike."""
    runs = {mode: _setup(task, mode, warmup) for mode in MODES}
    per = max(steps // rounds, 1)
    times = {mode: [] for mode in MODES}
    totals = {mode: {} for mode in MODES}
    i = warmup
    for _ in range(rounds):
        for mode in MODES:
            step, losses = runs[mode]
            with torchtpu.eager_mode(mode):
                torch.tpu.synchronize()
                torchtpu.reset_metrics()
                t0 = time.perf_counter()
                for k in range(per):
                    step(i + k)
                losses[-1].item()
                times[mode].append((time.perf_counter() - t0) / per)
                m = torchtpu.metrics()
            for k, v in m.items():
                if isinstance(v, int):
                    totals[mode][k] = totals[mode].get(k, 0) + v
        i += per
    out = {}
    for mode in MODES:
        t = sorted(times[mode])
        out[mode] = (1e3 * t[len(t) // 2], [v.item() for v in runs[mode][1]], totals[mode])
    return out


def _train_checks(task, steps: int, warmup: int, rounds: int):
    """Each mode with device-side checks on and off, interleaved blocks as in _train;
    returns {(mode, checks): median ms/step}."""
    configs = [(mode, on) for mode in MODES for on in (True, False)]
    runs = {}
    for mode, on in configs:
        torchtpu.set_checks(on)
        runs[(mode, on)] = _setup(task, mode, warmup)
    per = max(steps // rounds, 1)
    times = {c: [] for c in configs}
    i = warmup
    try:
        for _ in range(rounds):
            for c in configs:
                mode, on = c
                torchtpu.set_checks(on)
                step, losses = runs[c]
                with torchtpu.eager_mode(mode):
                    torch.tpu.synchronize()
                    t0 = time.perf_counter()
                    for k in range(per):
                        step(i + k)
                    losses[-1].item()
                    times[c].append((time.perf_counter() - t0) / per)
            i += per
    finally:
        torchtpu.set_checks(True)
    return {c: 1e3 * sorted(t)[len(t) // 2] for c, t in times.items()}


def _main_checks(args) -> int:
    rows = []
    tasks = [("MLP", _mlp_task()), ("GPT 2L d128 s64 b8", _gpt_task())]
    for n, (name, task) in enumerate(tasks, 1):
        print(f"[{n}/{len(tasks)}] training {name}, checks on and off, both modes interleaved ...", flush=True)
        rows.append((name, _train_checks(task, args.steps, args.warmup, args.rounds)))
    print()
    print(f"device-side checks, training step, XLA:{torchtpu.platform()}, ms/step (median of {args.rounds} "
          f"interleaved blocks); ratio = checks on / checks off")
    hdr = f"{'model':<22}{'mode':<16}{'checks on':>11}{'checks off':>12}{'ratio':>8}"
    print(hdr)
    print("-" * len(hdr))
    for name, res in rows:
        for mode in MODES:
            on, off = res[(mode, True)], res[(mode, False)]
            print(f"{name:<22}{mode:<16}{on:>11.2f}{off:>12.2f}{on / off:>8.3f}")
    return 0


def _schedule_compiles(total=50, batch=8, last=5):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    with torchtpu.eager_mode("defer_and_fuse"):
        model = MLP().to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=cosine_lr(0, total))
        per_step = []
        for step in range(total):
            n = last if step == total - 1 else batch
            x = torch.randn(n, 64, generator=g).to("tpu")
            y = torch.randint(0, 10, (n,), generator=g).to("tpu")
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, total)
            before = torchtpu.metrics()["compiles"]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            per_step.append(torchtpu.metrics()["compiles"] - before)
    return per_step


def _generate(mode: str, tokens: int):
    from ..eager import executor

    torch.manual_seed(0)
    model = TinyGPT().eval()
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    with torchtpu.eager_mode(mode):
        m = model.to("tpu")
        torch.tpu.synchronize()
        # Each mode compiles from scratch: the other mode's per-op executables (shared
        # by both modes) would otherwise make whichever runs second look free.
        executor.clear_cache()
        torchtpu.reset_metrics()
        t0 = time.perf_counter()
        out = m.generate(prompt.to("tpu"), tokens).cpu()
        elapsed = time.perf_counter() - t0
        metrics = torchtpu.metrics()
    return elapsed, out, metrics


def _deep_forward(chunked: bool, layers: int, calls: int = 6):
    """A deep model's forward in defer_and_fuse, read on the host: one region of every
    layer, compiled whole or as its repeating chunks (eager/region_plan.py), from scratch."""
    from ..eager import executor, region_plan

    torch.manual_seed(0)
    model = TinyGPT(d=64, layers=layers).eval()
    x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
    saved = region_plan.MIN_OPS
    region_plan.MIN_OPS = saved if chunked else float("inf")
    try:
        with torchtpu.eager_mode("defer_and_fuse"), torch.no_grad():
            m = model.to("tpu")
            xt = x.to("tpu")
            torch.tpu.synchronize()
            executor.clear_cache()
            torchtpu.reset_metrics()
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                out = m(xt).cpu()
                times.append(time.perf_counter() - t0)
            metrics = torchtpu.metrics()
    finally:
        region_plan.MIN_OPS = saved
    return times, float((out - ref).abs().max()), metrics


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench modes")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4, help="interleaved timing blocks per mode")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=32, help="layers of the deep forward")
    p.add_argument("--checks", action="store_true", help="training steps with device-side checks on vs off")
    args = p.parse_args(argv)
    if args.checks:
        return _main_checks(args)

    rows = []
    tasks = [("MLP", _mlp_task()), ("GPT 2L d128 s64 b8", _gpt_task())]
    n = 0
    for name, task in tasks:
        n += 1
        print(f"[{n}/5] training {name}, strict and defer_and_fuse interleaved ...", flush=True)
        res = _train(task, args.steps, args.warmup, args.rounds)
        s_ms, s_losses, _ = res["strict"]
        d_ms, d_losses, dm = res["defer_and_fuse"]
        worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(s_losses, d_losses))
        rows.append((name, s_ms, d_ms, s_ms / d_ms, worst, dm.get("compiles", 0),
                     dm.get("region_ops", 0) / max(dm.get("regions_executed", 1), 1)))
    n += 1
    print(f"[{n}/5] 50-step cosine-LR loop with a short last batch ...", flush=True)
    per_step = _schedule_compiles()
    n += 1
    print(f"[{n}/5] greedy generation of {args.tokens} tokens ...", flush=True)
    gen = {mode: _generate(mode, args.tokens) for mode in ("strict", "defer_and_fuse")}
    n += 1
    print(f"[{n}/5] a {args.layers}-layer forward in defer_and_fuse, whole and as chunks ...", flush=True)
    deep = {c: _deep_forward(c, args.layers) for c in (False, True)}

    print()
    print(f"training step, XLA:{torchtpu.platform()}, ms/step after {args.warmup} warm-up steps "
          f"(median of {args.rounds} interleaved blocks of {max(args.steps // args.rounds, 1)} steps per mode)")
    hdr = f"{'model':<22}{'strict':>9}{'defer':>9}{'speed-up':>10}{'max rel loss diff':>19}{'compiles':>10}{'ops/region':>12}"
    print(hdr)
    print("-" * len(hdr))
    for name, s_ms, d_ms, ratio, worst, comp, opr in rows:
        print(f"{name:<22}{s_ms:>9.2f}{d_ms:>9.2f}{ratio:>9.2f}x{worst:>19.1e}{comp:>10}{opr:>12.0f}")
    print()
    after = per_step[2:-1]
    print(f"cosine-LR loop, defer_and_fuse: compiles per step {per_step[:3]} ... last {per_step[-1]}; "
          f"after warm-up (steps 2..48): {sum(after)}; last (shorter) batch: {per_step[-1]}")
    print()
    (s_t, s_out, s_m), (d_t, d_out, d_m) = gen["strict"], gen["defer_and_fuse"]
    print(f"greedy generation, {args.tokens} tokens, KV cache growing each step")
    print(f"{'mode':<16}{'seconds':>9}{'tok/s':>8}{'compiles':>10}{'same tokens':>13}")
    print(f"{'strict':<16}{s_t:>9.2f}{args.tokens / s_t:>8.1f}{s_m['compiles']:>10}{'':>13}")
    print(f"{'defer_and_fuse':<16}{d_t:>9.2f}{args.tokens / d_t:>8.1f}{d_m['compiles']:>10}"
          f"{str(bool(torch.equal(s_out, d_out))):>13}")
    print()
    print(f"{args.layers}-layer GPT forward (d64, 4x32 tokens) in defer_and_fuse, read on the host: "
          "its region compiled whole, or cut into its layers' chunks")
    print(f"{'region':<10}{'cold s':>8}{'2nd s':>8}{'warm ms':>9}{'compiles':>10}{'max diff vs CPU':>17}")
    for c, name in ((False, "whole"), (True, "chunks")):
        times, diff, m = deep[c]
        warm = sorted(times[3:])[len(times[3:]) // 2] * 1e3
        print(f"{name:<10}{times[0]:>8.2f}{times[1]:>8.2f}{warm:>9.1f}{m.get('compiles', 0):>10}{diff:>17.1e}")
    return 0
