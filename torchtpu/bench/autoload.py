"""What autoload adds to `import torch`, measured against plain `import torch` in one run.

    python -m torchtpu.bench autoload [--rounds N]

Each round starts fresh interpreters, in alternating order: `import torch` with
TORCH_DEVICE_BACKEND_AUTOLOAD=0 (the baseline); `import torch` with autoload (which names
the device and imports no JAX: torchtpu/device/lazy.py); autoload plus the first tpu op
(`torch.randn(2, device="tpu")`: torchtpu and JAX load there, and the PJRT client
starts); and `import torch, torchtpu` with autoload off (what autoload cost while it
imported torchtpu with torch). Medians of the wall times; then the largest imports below
torchtpu that the first tpu op brings, from one `python -X importtime` run, and autoload's own
time measured inside an interpreter.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = [
    ("import torch (autoload off)", "import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
    ("import torch (autoload)", "import torch", {}),
    ("import torch + first tpu op", "import torch; torch.randn(2, device='tpu').cpu()", {}),
    # what autoload cost when it imported torchtpu (and JAX) with torch, before device/lazy.py
    ("import torch, torchtpu", "import torch, torchtpu", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
]


def _run(code: str, env: dict) -> float:
    e = dict(os.environ, **env)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=e, check=True, capture_output=True)
    return time.perf_counter() - t0


# autoload's own work, timed inside one interpreter (the wall times above vary by more than it)
_BIND = ("import time, torch; t = time.perf_counter(); import torchtpu_autoload; torchtpu_autoload.load(); "
         "print(time.perf_counter() - t)")


def _bind_time() -> float:
    r = subprocess.run([sys.executable, "-c", _BIND], capture_output=True, text=True, check=True,
                       env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    return float(r.stdout.split()[-1])


def _top_imports(n: int = 8) -> list[tuple[str, float]]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", CASES[2][1]], capture_output=True,
                       text=True, env=dict(os.environ))
    rows = []
    for line in r.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].strip()
            if name in ("torchtpu", "jax", "torchtpu.runtime.jaxenv") or (
                    name.startswith("torchtpu.") and name.count(".") == 1):
                rows.append((name, int(parts[1]) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:n]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench autoload")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    times: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    for r in range(args.rounds):
        order = CASES if r % 2 == 0 else CASES[::-1]
        for name, code, env in order:
            times[name].append(_run(code, env))
        print(f"[{r + 1}/{args.rounds}] " + ", ".join(f"{n}: {times[n][-1]:.2f}s" for n, _, _ in CASES),
              flush=True)
    base = statistics.median(times[CASES[0][0]])
    print(f"\n{'case':<32} {'median s':>9} {'vs baseline':>12}")
    for name, _, _ in CASES:
        med = statistics.median(times[name])
        print(f"{name:<32} {med:>9.2f} {med / base:>11.2f}x")
    bind = statistics.median(_bind_time() for _ in range(args.rounds))
    print(f"\nautoload's own time in `import torch` (in-process, median): {bind * 1000:.0f} ms")
    print("\nlargest imports at the first tpu op (python -X importtime, cumulative):")
    for name, s in _top_imports():
        print(f"  {name:<34} {s:>6.2f} s")
    return 0
