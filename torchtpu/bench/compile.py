"""torch.compile(backend="tpu") against the same model written in JAX, torch CPU eager
and Inductor on the CPU, plus cold vs warm start with the persistent compilation cache.

    python -m torchtpu.bench compile [--steps N] [--no-inductor] [--models gpt gpt-m resnet]

One training step = forward, cross-entropy loss, backward, AdamW. The compiled rows compile
forward+loss (backward comes with it through aot_autograd) and the optimizer step
(torch.compile(opt.step)); the JAX row is one jax.jit
of the whole step, from the same initial weights. Times are medians after warm-up;
ratios are against JAX from the same run. The runs take turns (interleaved rounds), so
load that drifts during the benchmark hits every run alike.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

from .models import TinyGPT


class _Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    """A ResNet-style CNN: stem, residual block, strided downsample, residual block, head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.block1 = _Residual(16)
        self.down = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.block2 = _Residual(32)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.block2(self.down(self.block1(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def _setup(name: str):
    """(model, batch, jax loss fn) for a benchmark model, from seed 0."""
    from . import jax_reference as jr

    torch.manual_seed(0)
    if name in ("gpt", "gpt-m"):
        # gpt: the small GPT of the eager-modes issue; gpt-m: twice as wide, twice the batch,
        # where a step's fixed host work (Dynamo guards, autograd, optimizer) weighs less
        d, batch = (128, 8) if name == "gpt" else (256, 16)
        model = TinyGPT(vocab=256, d=d, layers=2, heads=4, max_len=64)
        x = torch.randint(0, 256, (batch, 64))
        y = torch.randint(0, 256, (batch, 64))

        def loss_fn(p, bufs, idx, tgt):
            return jr.gpt_loss(p, idx, tgt, layers=2, heads=4)

        return model, (x, y), loss_fn, lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())
    model = SmallResNet()
    x = torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (16,))
    return model, (x, y), jr.resnet_loss, F.cross_entropy


def _torch_runner(model, batch, crit, device, backend=None):
    """One training step of a PyTorch loop (optionally torch.compile'd) per call: (seconds, loss)."""
    model = copy.deepcopy(model).to(device)
    x, y = (t.to(device) for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def forward_loss(x, y):
        return crit(model(x), y)

    opt_step = opt.step
    if backend is not None:
        # the loss is part of the compiled forward, as in a compiled training step
        forward_loss = torch.compile(forward_loss, backend=backend)
        opt_step = torch.compile(opt.step, backend=backend)

    def step():
        t0 = time.perf_counter()
        loss = forward_loss(x, y)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()  # a host read each step: the loop is synchronous
        return time.perf_counter() - t0, value

    return step


def _checks_as(on: bool, make):
    """A runner whose setup and steps run with device-side checks `on` (a compiled graph
    declares its flags when it is traced, on its first step), the global switch restored
    after each step so that the other runs keep their own setting."""
    def made():
        import torchtpu
        torchtpu.set_checks(on)
        try:
            step = make()
        finally:
            torchtpu.set_checks(True)

        def checked_step():
            torchtpu.set_checks(on)
            try:
                return step()
            finally:
                torchtpu.set_checks(True)

        return checked_step

    return made


def _torch_loop(model, batch, crit, steps, device, backend=None):
    """Per-step seconds and losses of `steps` steps of a PyTorch training loop."""
    step = _torch_runner(model, batch, crit, device, backend)
    times, losses = zip(*(step() for _ in range(steps)))
    return list(times), list(losses)


def _jax_runner(model, batch, loss_fn):
    import jax

    from . import jax_reference as jr

    p, bufs = jr.params_of(model)
    state = [p, bufs, jr.adamw_init(p)]
    update = jr.make_step(loss_fn)
    x, y = (jr.to_jax(t) for t in batch)

    def step():
        t0 = time.perf_counter()
        p, b, s, loss = update(*state, x, y)
        state[:] = [p, b, s]
        value = float(jax.device_get(loss))
        return time.perf_counter() - t0, value

    return step


def _first_step(model_name: str, cache: str) -> dict:
    """In a fresh process: seconds of the first compiled step, of the compiled graphs'
    first calls (JAX trace + lowering + XLA compile or cache load + run), and of XLA
    compilation alone (or loading from the persistent cache)."""
    code = (
        "import json, sys, time, torch, torchtpu\n"
        f"torchtpu.compile_cache_dir({cache!r})\n"
        "from torchtpu.bench.compile import _setup, _torch_loop\n"
        f"m, b, _, crit = _setup({model_name!r})\n"
        "torchtpu.reset_metrics()\n"
        "t, _ = _torch_loop(m, b, crit, 1, 'tpu', backend='tpu')\n"
        "m = torchtpu.metrics()\n"
        "print(json.dumps({'first_step_s': t[0], 'jit_s': m.get('compile_ms', 0) / 1e3,\n"
        "                  'xla_compile_s': m.get('xla_compile_ms', 0) / 1e3}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.bench compile")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="turns each run takes, interleaved")
    ap.add_argument("--models", nargs="*", default=["gpt", "gpt-m", "resnet"], choices=["gpt", "gpt-m", "resnet"])
    ap.add_argument("--no-inductor", action="store_true", help="skip torch.compile with Inductor on the CPU")
    ap.add_argument("--no-cache", action="store_true", help="skip the cold/warm persistent-cache measurement")
    ap.add_argument("--checks", action="store_true",
                    help="also run torchtpu compile with device-side checks off (TORCHTPU_CHECKS=0), "
                         "interleaved with checks on: the cost of the flags")
    args = ap.parse_args(argv)
    import torchtpu

    rows = []
    starts = []
    per = max(args.steps // args.rounds, 1)
    for name in args.models:
        model, batch, loss_fn, crit = _setup(name)
        variants = [("torch cpu eager", lambda: _torch_runner(model, batch, crit, "cpu"))]
        if not args.no_inductor:
            variants.append(("torch.compile inductor cpu",
                             lambda: _torch_runner(model, batch, crit, "cpu", backend="inductor")))
        variants.append(("jax.jit", lambda: _jax_runner(model, batch, loss_fn)))
        ours = lambda: _torch_runner(model, batch, crit, "tpu", backend="tpu")  # noqa: E731
        if args.checks:
            variants.append(("torchtpu compile", _checks_as(True, ours)))
            variants.append(("torchtpu compile, checks off", _checks_as(False, ours)))
        else:
            variants.append(("torchtpu compile", ours))
        torchtpu.reset_metrics()
        steps, times, losses = {}, {}, {}
        for label, make in variants:
            print(f"{name}: {label}: setup and {args.warmup} warm-up steps ...", flush=True)
            steps[label] = make()
            times[label] = []
            losses[label] = [steps[label]()[1] for _ in range(args.warmup)]
        # The runs take turns in rounds, so that load drifting during the run hits all alike.
        # Each turn starts with one untimed step: it absorbs whatever the previous run's
        # last step left executing (dispatch is asynchronous).
        for r in range(args.rounds):
            print(f"{name}: round {r + 1}/{args.rounds}, {per} timed steps per run ...", flush=True)
            for label, step in steps.items():
                losses[label].append(step()[1])
                for _ in range(per):
                    t, loss = step()
                    times[label].append(t)
                    losses[label].append(loss)
        m = torchtpu.metrics()
        ref_losses = losses["torch cpu eager"]
        base = statistics.median(times["jax.jit"]) * 1e3
        for label in steps:
            ms = statistics.median(times[label]) * 1e3
            diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[label], ref_losses))
            ours = label.startswith("torchtpu compile")
            rows.append((name, label, ms, ms / base, diff, m.get("compile_graphs", 0) if ours else "",
                         m["cpu_fallbacks"] if ours else ""))
        if not args.no_cache and name != "gpt-m":  # the start-up story is gpt's and resnet's
            with tempfile.TemporaryDirectory() as cache:
                print(f"{name}: first compiled step in fresh processes (cold cache, then warm) ...", flush=True)
                cold = _first_step(name, cache)
                warm = _first_step(name, cache)
            starts.append((name, cold, warm))

    print()
    print(f"{'model':8} {'run':28} {'ms/step':>9} {'vs jax':>7} {'max rel loss diff vs cpu':>25} {'graphs':>7} {'fallbacks':>9}")
    for name, label, ms, ratio, diff, graphs, fb in rows:
        print(f"{name:8} {label:28} {ms:9.2f} {ratio:7.2f} {diff:25.2e} {graphs!s:>7} {fb!s:>9}")
    print(f"(median of {per * args.rounds} timed steps per run, taken in {args.rounds} interleaved rounds after "
          f"{args.warmup} warm-up steps; loss diff over all steps)")
    if args.checks:
        print()
        print(f"{'model':8} {'checks on / checks off (ms/step)':>34}")
        for name in args.models:
            ms = {label: v for n, label, v, *_ in rows if n == name}
            print(f"{name:8} {ms['torchtpu compile'] / ms['torchtpu compile, checks off']:34.3f}")
    if starts:
        print()
        print(f"{'model':8} {'what (fresh process)':34} {'cold s':>8} {'warm s':>8} {'warm/cold':>10}")
        for name, cold, warm in starts:
            for key, what in (("first_step_s", "first step (Dynamo+AOT+JAX+XLA)"),
                              ("jit_s", "graphs' first calls (JAX+XLA)"),
                              ("xla_compile_s", "XLA compile (or cache load)")):
                print(f"{name:8} {what:34} {cold[key]:8.2f} {warm[key]:8.2f} "
                      f"{warm[key] / max(cold[key], 1e-9):10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
