"""Hugging Face Accelerate places models and batches on "tpu".

Accelerate picks its device from a fixed list (`PartialState.default_device`: MPS,
MLU, SDAA, MUSA, NPU, HPU, CUDA, XPU, Neuron, else CPU) and knows no PrivateUse1
device, so a Trainer on tpu had its model moved back to the CPU by
`accelerator.prepare` and its batches left there, while Transformers itself (which
asks torch.accelerator) said tpu. Its only outside knob, ACCELERATE_TORCH_DEVICE,
overrides even `cpu=True` (TrainingArguments(use_cpu=True) would then train on tpu).

So when accelerate.state is imported, its `default_device` property is wrapped:
where Accelerate would fall back to the CPU and torch's current accelerator is tpu,
the default is tpu, as it is cuda on a CUDA machine; `cpu=True` and every device
Accelerate knows keep their meaning. Nothing is imported before the user imports
accelerate (a meta-path hook waits for it).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

_MODULE = "accelerate.state"


def _tpu_is_the_accelerator() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == "tpu"


def _patch(state) -> None:
    cls = state.PartialState
    orig = cls.__dict__.get("default_device")
    if not isinstance(orig, property) or getattr(orig.fget, "_torchtpu", False):
        return

    def default_device(self) -> torch.device:
        dev = orig.fget(self)
        if dev.type == "cpu" and _tpu_is_the_accelerator():
            return torch.device("tpu")
        return dev

    default_device._torchtpu = True
    default_device.__doc__ = orig.__doc__
    cls.default_device = property(default_device)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # the real spec, found by the other finders
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _patch(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if _MODULE in sys.modules:
        _patch(sys.modules[_MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
