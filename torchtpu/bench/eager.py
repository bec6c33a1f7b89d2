"""Host cost per op in each execution path, next to torch CPU eager and the floor, in one run.

    python -m torchtpu.bench eager [--iters N] [--repeats R]

Each case issues N ops back to back (no sync between them, as a training loop
does), then waits for the last result; the cost per op is the best of R repeats, the eager
paths (torch CPU, the floor, strict, defer_and_fuse recording) measured in turns.
Paths: torch CPU eager; the floor, a `jax.jit` call of the same op on device arrays
(PJRT's own dispatch from Python); tpu strict (a cache hit); defer_and_fuse recording
(the loop alone, the region's flush and run not counted); a `torch.compile(backend="tpu")`
graph of the op, called (guards included); "dynamo": the same torch.compile whose compiled
function does no work (it hands back what its first call computed), i.e. Dynamo's guards and
aot_autograd's wrappers, PyTorch's own per-call cost on these inputs; "ours" is graph minus
that. Ratios are to the floor.

Then views alone (`a[3]`, a slice, a split, ...: metadata only, no device work), against the
same view of a CPU tensor. Then a small GPT's training step (forward, loss, backward, AdamW), host time per step:
torch CPU eager (its arithmetic included: a tiny model's is small), and tpu strict, defer_and_fuse (recording and the region's launch) and a
torch.compile'd model, each issuing steps back to back with one wait at the end; and the
mean over --sustained steps in a row with the time Python's cyclic GC took in them (its full
collections of the whole heap are pauses a best-of never sees).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import time

import torch

import torchtpu
from torchtpu.eager import executor


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


class _Plans:
    """The strict hit plans of a case's op signatures, and a way to call them through the
    jitted function for a while: the executable's direct call (runtime/direct.py) switched
    off, as before it existed, to measure both in one run."""

    def __init__(self, compiled):
        self.compiled = [c for c in compiled if c.hit and c.hit[6] is not None]

    def __bool__(self):
        return bool(self.compiled)

    @contextlib.contextmanager
    def through_jit(self):
        plans = [c.hit for c in self.compiled]
        for c, h in zip(self.compiled, plans):
            c.hit = h[:6] + (None,)
        try:
            yield
        finally:
            for c, h in zip(self.compiled, plans):
                c.hit = h


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
    # in place into a corner of a buffer (a mask sliced from a preallocated one): over its bucket
    ("view mul_", (64, 96), lambda a, b: a[:5, :12].mul_(1.0001), lambda a, b: a.at[:5, :12].multiply(1.0001)),
    ("sum", (16, 16), lambda a, b: a.sum(1), lambda a, b: a.sum(1)),
]


# views alone (no device work: the tensor's new geometry over its base's storage), each against
# the same view of a CPU tensor; (name, shape, view)
VIEWS = [
    ("a[3]", (16, 16), lambda a: a[3]),
    ("a.t()", (16, 16), lambda a: a.t()),
    ("a[:5, :12]", (64, 96), lambda a: a[:5, :12]),
    ("a.view(-1)", (16, 16), lambda a: a.view(-1)),
    ("a.diagonal()", (16, 16), lambda a: a.diagonal()),
    ("a.split(4)", (16, 16), lambda a: a.split(4)),
    ("a.unsqueeze(0).expand(2, -1, -1)", (16, 16), lambda a: a.unsqueeze(0).expand(2, -1, -1)),
]


def _views(iters: int, repeats: int) -> list[tuple[str, float, float]]:
    """(view, torch cpu us, tpu us) per VIEWS case, the two taking turns repeat by repeat."""
    rows = []
    for name, shape, fn in VIEWS:
        c = torch.randn(shape)
        t = c.to("tpu")
        cpu = tpu = float("inf")
        for _ in range(repeats):
            cpu = min(cpu, _per_op(lambda x, y: fn(x), c, None, iters, 1, _cpu_sync))
            tpu = min(tpu, _per_op(lambda x, y: fn(x), t, None, iters, 1, _cpu_sync))
        rows.append((name, cpu, tpu))
    return rows


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


def _dynamo_floor(fn, x, y, iters: int, repeats: int, sync) -> float:
    """torch.compile(fn) with a compiled function that does nothing: Dynamo and aot_autograd alone."""
    from torch._dynamo.backends.common import aot_autograd

    def no_work(gm, example_inputs):
        made = []

        def run(args):
            if not made:  # the first call runs the graph eagerly; later ones hand that back
                made.extend(gm(*args))
            args.clear()
            return list(made)

        run._boxed_call = True
        return run

    torch._dynamo.reset()
    # (input mutations stay the graph's, as the tpu backend keeps them: else aot_autograd adds a copy_)
    backend = aot_autograd(fw_compiler=no_work, keep_inference_input_mutations=True)
    return _per_op(torch.compile(fn, backend=backend), x, y, iters, repeats, sync)


def _train_step_host(device: str, mode: str | None, steps: int, repeats: int,
                     sustained: int) -> tuple[float, int, float, float, int]:
    """(host ms per training step, ATen ops per step, mean ms per step over `sustained` steps
    in a row, of which ms in Python's cyclic GC, full collections among them) of a small GPT
    on `device`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from .models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab=128, d=64, layers=2, heads=4, max_len=32).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    idx = torch.randint(0, 128, (4, 32)).to(device)
    target = torch.randint(0, 128, (4, 32)).to(device)
    fwd = torch.compile(model, backend="tpu") if mode == "compile" else model

    def step():
        loss = torch.nn.functional.cross_entropy(fwd(idx).flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _Count.n += 1
            return func(*args, **(kwargs or {}))

    sync = (lambda out: out.cpu()) if device == "tpu" else (lambda out: None)
    ctx = torchtpu.eager_mode(mode) if mode in ("strict", "defer_and_fuse") else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for _ in range(3):  # compiles
            sync(step())
        ops = 0
        if mode not in ("compile",):
            with _Count():
                sync(step())
            ops = _Count.n
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                out = step()
            best = min(best, (time.perf_counter() - t0) / steps)
            sync(out)
        mean, in_gc, full = _sustained(step, sync, sustained)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return best * 1e3, ops, mean, in_gc, full


def _sustained(step, sync, steps: int) -> tuple[float, float, int]:
    """(mean ms per step, ms per step in the cyclic GC, full collections) over `steps` steps in
    a row: what a best-of misses, the GC's pauses (a full collection walks the whole heap,
    200+ ms with torch and jax loaded), as a long training loop meets them."""
    spent = [0.0, 0]
    started = [0.0]

    def watch(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            spent[1] += info["generation"] == 2

    gc.callbacks.append(watch)
    try:
        t0 = time.perf_counter()
        for i in range(steps):
            out = step()
            if i % 10 == 9:
                sync(out)
        sync(out)
        total = time.perf_counter() - t0
    finally:
        gc.callbacks.remove(watch)
    return total / steps * 1e3, spent[0] / steps * 1e3, spent[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench eager")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-train", action="store_true", help="skip the training step")
    p.add_argument("--sustained", type=int, default=500, help="training steps in a row for the mean (GC pauses included)")
    args = p.parse_args(argv)
    rows = []
    for i, (name, shape, fn, jfn) in enumerate(CASES, 1):
        print(f"[{i}/{len(CASES)}] {name} {shape} ...", flush=True)
        x, y = torch.randn(shape), torch.randn(shape)
        xc, xt, yt = x.clone(), x.to("tpu"), y.to("tpu")
        torchtpu.reset_metrics()
        seen = set(executor._quick)
        tpu = _per_op(fn, xt, yt, args.iters, 1, _tpu_sync)
        m = torchtpu.metrics()
        compiles, fallbacks = m["compiles"], m["cpu_fallbacks"]
        planned = _Plans([c for k, c in executor._quick.items() if k not in seen])
        cpu = floor = rec = via_jit = float("inf")
        # the eager paths take turns, repeat by repeat: a slow stretch of a busy machine falls on
        # all of them, not on one path's whole measurement (their ratios moved by 0.5x run to run)
        for _ in range(args.repeats):
            cpu = min(cpu, _per_op(fn, xc, y, args.iters, 1, _cpu_sync))
            floor = min(floor, _floor(jfn, x, y, args.iters, 1))
            tpu = min(tpu, _per_op(fn, xt, yt, args.iters, 1, _tpu_sync))
            if planned:
                with planned.through_jit():
                    via_jit = min(via_jit, _per_op(fn, xt, yt, args.iters, 1, _tpu_sync))
            rec = min(rec, _record(fn, xt, yt, args.iters, 1))
        torch._dynamo.reset()
        graph = _per_op(torch.compile(fn, backend="tpu"), xt, yt, args.iters, args.repeats, _tpu_sync)
        dyn = _dynamo_floor(fn, xt, yt, args.iters, args.repeats, _tpu_sync)
        rows.append((name, "x".join(map(str, shape)), cpu, floor, tpu, via_jit, rec, graph, dyn, compiles, fallbacks))
    print()
    print(f"host cost per op on XLA:{torchtpu.platform()} (us, best of {args.repeats} x {args.iters}); "
          "x: ratio to the jax.jit floor")
    hdr = (f"{'op':<11}{'shape':>8}{'torch cpu':>10}{'jax floor':>10}{'strict':>9}{'x':>5}{'via jit':>8}{'x':>5}"
           f"{'d&f rec':>9}{'x':>5}{'graph':>8}{'dynamo':>8}{'ours':>7}{'x':>5}{'compiles':>9}{'fallbacks':>10}")
    print(hdr)
    print("-" * len(hdr))
    for name, shape, cpu, floor, tpu, via_jit, rec, graph, dyn, comp, fb in rows:
        jit_cols = f"{via_jit:>8.1f}{via_jit / floor:>5.1f}" if via_jit < float("inf") else f"{'-':>8}{'':>5}"
        print(f"{name:<11}{shape:>8}{cpu:>10.1f}{floor:>10.1f}{tpu:>9.1f}{tpu / floor:>5.1f}{jit_cols}{rec:>9.1f}"
              f"{rec / floor:>5.1f}{graph:>8.1f}{dyn:>8.1f}{graph - dyn:>7.1f}{(graph - dyn) / floor:>5.1f}"
              f"{comp:>9}{fb:>10}")
    print("via jit: the same strict hits calling the op's jitted function instead of its executable "
          "(runtime/direct.py); '-': no hit planned with one")
    print()
    print(f"views alone (us, best of {args.repeats} x {args.iters}; metadata only: the baseline is torch cpu's view)")
    hdr = f"{'view':<34}{'torch cpu':>10}{'tpu':>8}{'x cpu':>7}"
    print(hdr)
    print("-" * len(hdr))
    for name, cpu, tpu in _views(args.iters, args.repeats):
        print(f"{name:<34}{cpu:>10.2f}{tpu:>8.2f}{tpu / cpu:>7.1f}")
    if args.no_train:
        return 0
    print()
    print("[train] a small GPT's training step (TinyGPT d=64, 2 layers, batch 4x32, AdamW) ...", flush=True)
    steps = max(2, args.iters // 30)
    train = []
    for label, device, mode in [("torch cpu", "cpu", None), ("tpu strict", "tpu", "strict"), ("tpu defer_and_fuse", "tpu", "defer_and_fuse"),
                                ("tpu torch.compile", "tpu", "compile")]:
        print(f"  {label} ...", flush=True)
        train.append((label, *_train_step_host(device, mode, steps, args.repeats, args.sustained)))
    cpu_ms = train[0][1]
    print()
    cpu_mean = train[0][3]
    print(f"host time per training step (ms, best of {args.repeats} x {steps} steps, one wait at the end; "
          f"torch cpu's includes its arithmetic); mean: over {args.sustained} steps in a row, a wait every 10, "
          "with the cyclic GC's time in it and its full collections")
    hdr = (f"{'path':<28}{'ms/step':>9}{'ops/step':>10}{'us/op':>8}{'x cpu':>7}"
           f"{'mean':>8}{'x cpu':>7}{'gc ms':>7}{'full gc':>8}")
    print(hdr)
    print("-" * len(hdr))
    for label, ms, ops, mean, in_gc, full in train:
        per_op = f"{ms * 1e3 / ops:>8.1f}" if ops else f"{'':>8}"
        print(f"{label:<28}{ms:>9.2f}{ops if ops else '':>10}{per_op}{ms / cpu_ms:>7.1f}"
              f"{mean:>8.2f}{mean / cpu_mean:>7.1f}{in_gc:>7.2f}{full:>8}")
    return 0
