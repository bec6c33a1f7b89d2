"""Benchmarks: `python -m torchtpu.bench NAME`. Each reports ratios against a baseline
measured in the same run, since these machines are noisy."""
from __future__ import annotations

import importlib

# name -> "module:function", imported only when asked for
BENCHMARKS: dict[str, str] = {
    "eager": "torchtpu.bench.eager:main",
    "modes": "torchtpu.bench.modes:main",
    "compile": "torchtpu.bench.compile:main",
    "dist": "torchtpu.bench.dist:main",
    "amp": "torchtpu.bench.amp:main",
    "kernels": "torchtpu.bench.kernels:main",
    "transfers": "torchtpu.bench.transfers:main",
    "autoload": "torchtpu.bench.autoload:main",
    "generate": "torchtpu.bench.generate:main",
    "control": "torchtpu.bench.control:main",
    "churn": "torchtpu.bench.churn:main",
    "lowprec": "torchtpu.bench.lowprec:main",
}


def get(name: str):
    try:
        target = BENCHMARKS[name]
    except KeyError:
        raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(sorted(BENCHMARKS))}")
    mod, fn = target.split(":")
    return getattr(importlib.import_module(mod), fn)
