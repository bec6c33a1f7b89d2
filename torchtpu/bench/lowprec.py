"""Low precision inference side by side: fp32, bf16, int8 and float8 in one run.

    python -m torchtpu.bench lowprec [--steps N] [--warmup W] [--models linear,gpt]

A linear layer and the small GPT's forward (under no_grad) in float32, bfloat16, torchao int8
dynamic (Int8DynamicActivationInt8WeightConfig), float8 tensorwise and float8 rowwise
(Float8DynamicActivationFloat8WeightConfig with PerTensor() / PerRow()); the quantized ones are
quantized from the bfloat16 model, as serving stacks do. Each runs on tpu in strict,
defer_and_fuse and compiled (torch.compile(backend="tpu")), and on torch CPU eager. Per row:
ms per step after warm-up (tpu steps end in torch.tpu.synchronize()), the ratio against float32
in the same execution, and the error
against the float32 CPU output (max |out - ref| / max |ref|). One run, no repeats: on a busy
machine the ms are noisy, the errors are not.
"""
from __future__ import annotations

import argparse
import copy
import time
import warnings

import torch

import torchtpu

from .models import TinyGPT

PRECISIONS = ("fp32", "bf16", "int8 dynamic", "fp8 tensorwise", "fp8 rowwise")
EXECUTIONS = ("cpu", "strict", "defer_and_fuse", "compile")


def _config(precision: str):
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig,
                                      Int8DynamicActivationInt8WeightConfig, PerRow, PerTensor)

    return {"int8 dynamic": Int8DynamicActivationInt8WeightConfig,
            "fp8 tensorwise": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerTensor()),
            "fp8 rowwise": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())}[precision]()


def _models(batch: int, seq: int):
    """name -> (float32 model, input, description)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(512, 512)
    x = torch.randn(batch * seq, 512, generator=g)
    # d=96, not 128: torchao reads a 128x128 weight's per-tensor scale block (128, 128) as
    # 128x128 blockwise scaling and then asserts the activation is 1x128-scaled (on CPU too)
    gpt = TinyGPT(d=96, layers=2, heads=4)
    idx = torch.randint(0, 256, (batch, seq), generator=g)
    return {"linear": (linear, x, f"Linear(512, 512), input {batch * seq}x512"),
            "gpt": (gpt, idx, f"small GPT forward (2 layers, d=96), batch {batch}, seq {seq}")}


def _prepare(model, x, precision: str, dev: str):
    """The model in `precision` on `dev`, and its input there."""
    m = copy.deepcopy(model)
    if precision != "fp32":
        m = m.to(torch.bfloat16)
        if x.is_floating_point():
            x = x.to(torch.bfloat16)
    m = m.to(dev)
    if precision not in ("fp32", "bf16"):
        from torchao.quantization import quantize_

        quantize_(m, _config(precision))
    return m, x.to(dev)


def _run(model, x, precision: str, execution: str, steps: int, warmup: int):
    """(ms per step after warm-up, the output on the CPU as float32, programs compiled during
    the timed steps)."""
    dev = "cpu" if execution == "cpu" else "tpu"
    mode = "strict" if execution in ("cpu", "compile") else execution
    m, x = _prepare(model, x, precision, dev)
    if execution == "compile":
        torch._dynamo.reset()
        fn = torch.compile(m, backend="tpu")
    else:
        fn = m

    def step():
        out = fn(x)
        if dev == "tpu":
            # one step a region: defer_and_fuse runs the same fused program each step (steps
            # recorded unsynchronized would make one bigger program, another in each phase)
            torch.tpu.synchronize()
        return out

    with torch.no_grad(), torchtpu.eager_mode(mode):
        for _ in range(warmup):
            step()
        before = torchtpu.metrics()["compiles"]
        t0 = time.perf_counter()
        for _ in range(steps):
            out = step()
        ms = 1e3 * (time.perf_counter() - t0) / steps
        compiles = torchtpu.metrics()["compiles"] - before
        host = out.float().cpu()
    return ms, host, compiles


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench lowprec")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--models", default="linear,gpt")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    models = {k: v for k, v in _models(args.batch, args.seq).items() if k in args.models.split(",")}

    results = {}
    total = len(models) * len(PRECISIONS) * len(EXECUTIONS)
    n = 0
    for name, (model, x, _) in models.items():
        for precision in PRECISIONS:
            for execution in EXECUTIONS:
                n += 1
                print(f"[{n}/{total}] {name:<7}{precision:<15}{execution:<15}...", end=" ", flush=True)
                try:
                    ms, out, compiles = _run(model, x, precision, execution, args.steps, args.warmup)
                except Exception as err:  # noqa: BLE001  (a row that fails is reported, the rest run)
                    results[name, precision, execution] = (None, f"{type(err).__name__}: {str(err).splitlines()[0][:60]}", 0)
                    print("FAILED", results[name, precision, execution][1], flush=True)
                    continue
                results[name, precision, execution] = (ms, out, compiles)
                print(f"{ms:8.2f} ms/step", flush=True)

    print()
    print(f"low precision forward, XLA:{torchtpu.platform()}; {args.steps} timed steps after "
          f"{args.warmup} warm-up; error = max|out - fp32 CPU| / max|fp32 CPU|")
    hdr = (f"{'model':<8}{'precision':<16}{'execution':<16}{'ms/step':>9}{'vs fp32':>9}{'error vs fp32':>15}"
           f"{'compiles':>10}")
    print(hdr)
    print("-" * len(hdr))
    for name in models:
        ref = results.get((name, "fp32", "cpu"), (None, None))[1]
        for precision in PRECISIONS:
            for execution in EXECUTIONS:
                ms, out, compiles = results[name, precision, execution]
                if ms is None:
                    print(f"{name:<8}{precision:<16}{execution:<16}  failed: {out}")
                    continue
                base = results[name, "fp32", execution][0]
                ratio = f"{base / ms:>8.2f}x" if base else f"{'':>9}"
                err = "" if not isinstance(ref, torch.Tensor) else \
                    f"{((out - ref).abs().max() / ref.abs().max()).item():.1e}"
                shown = "" if execution == "cpu" else compiles
                print(f"{name:<8}{precision:<16}{execution:<16}{ms:>9.2f}{ratio}{err:>15}{shown:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
