"""torchao's float8 inference accepts tpu.

`quantize_(model, Float8DynamicActivationFloat8WeightConfig(...))` asserts the hardware first
(`torchao.float8.inference._check_hardware_support`, imported by name into
`torchao.quantization.quant_api`): CUDA sm89+, MI300/MI350 or XPU, else "Float8 dynamic
quantization requires CUDA compute capability >=8.9 ...", even when the model is bound for
tpu. XLA has float8 types on every backend (TPUs from v5p compute in them; older TPUs and
XLA:CPU convert around the dot), and torchtpu lowers float8 storage, casts and `_scaled_mm`
natively (ops/casts.py, ops/low_precision.py), so where torch's accelerator is tpu the check
passes for the granularities torchao's float8 inference offers (per tensor, per row,
1x128 activation / 128x128 weight); anything else still goes to torchao's own check (CUDA
keeps its meaning, and an invalid granularity still raises torchao's ValueError).

Nothing is imported before the user imports torchao: a meta-path hook waits for each module.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

_MODULES = ("torchao.float8.inference", "torchao.quantization.quant_api")


def _tpu_is_the_accelerator() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == "tpu"


def _patch(module) -> None:
    orig = getattr(module, "_check_hardware_support", None)
    if orig is None or getattr(orig, "_torchtpu", False):
        return

    def _check_hardware_support(granularities):
        if _tpu_is_the_accelerator():
            from torchao.float8.inference import _granularity_is_a_1_128_w_128_128
            from torchao.quantization.granularity import PerRow, PerTensor

            a, w = granularities
            if (isinstance(a, PerTensor) and isinstance(w, PerTensor)) or \
                    (isinstance(a, PerRow) and isinstance(w, PerRow)) or \
                    _granularity_is_a_1_128_w_128_128(granularities):
                return None
        return orig(granularities)

    _check_hardware_support._torchtpu = True
    _check_hardware_support.__doc__ = orig.__doc__
    module._check_hardware_support = _check_hardware_support


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _MODULES:
            return None
        sys.meta_path.remove(self)  # the real spec, from the other finders
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    for name in _MODULES:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not all(name in sys.modules for name in _MODULES) and \
            not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
