"""Validation CLIs: `python -m torchtpu.validate ops` (PyTorch's OpInfo suite on tpu vs CPU),
`hf` (Hugging Face model sweep), `layers` (the import contract between packages), `titan` (TorchTitan's
training entry point on tpu and its CPU oracle), `pytorch_tests` (PyTorch's own device-generic test files
on tpu vs CPU), `transformers_tests` (Transformers' own model and generate tests on tpu vs CPU),
`modules` and `optims` (PyTorch's ModuleInfo and OptimizerInfo inputs, those of its test_modules.py
and test_optim.py, on tpu vs CPU)."""
from __future__ import annotations

import importlib

VALIDATORS: dict[str, str] = {
    "ops": "torchtpu.validate.ops:main",
    "hf": "torchtpu.validate.hf:main",
    "layers": "torchtpu.validate.layers:main",
    "titan": "torchtpu.validate.titan:main",
    "pytorch_tests": "torchtpu.validate.pytorch_tests:main",
    "transformers_tests": "torchtpu.validate.transformers_tests:main",
    "modules": "torchtpu.validate.modules:main",
    "optims": "torchtpu.validate.optims:main",
}


def get(name: str):
    try:
        target = VALIDATORS[name]
    except KeyError:
        raise SystemExit(f"unknown validator {name!r}; choose from {', '.join(sorted(VALIDATORS))}")
    mod, fn = target.split(":")
    return getattr(importlib.import_module(mod), fn)
