"""The default torch.compile on tpu tensors compiles through torchtpu's backend.

`torch.compile(model)` with no backend (or backend="inductor") hands every graph to
torch._TorchCompileInductorWrapper. Inductor's own "tpu" device path emits Pallas
code for another stack and fails here, and Inductor has no way to lower a graph to
XLA; as on the TPU-native stack, the tpu backend is the default for the tpu device.
The wrapper is routed per graph: a graph with a tpu tensor among its example inputs
(parameters are inputs too) goes to `torchtpu.compile.backend`; every other graph
(CPU, CUDA) still goes to Inductor unchanged. Inductor's mode/options do not apply
to tpu graphs.

This lives outside torchtpu.compile because it is installed at import (autoload
included) and must not import Dynamo then; torchtpu.compile is imported when a
default torch.compile is created, before Dynamo traces anything, so its frame
skip rules are in place as they are for backend="tpu".
"""
from __future__ import annotations

import functools

import torch


def _has_tpu_input(inputs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs)


def install() -> None:
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_torchtpu", False):
        return
    inductor_init, inductor_call = wrapper.__init__, wrapper.__call__

    @functools.wraps(inductor_init)
    def __init__(self, *args, **kwargs):
        import torchtpu.compile  # noqa: F401  (Dynamo's skip rules for our frames)

        inductor_init(self, *args, **kwargs)

    @functools.wraps(inductor_call)
    def __call__(self, model_, inputs_, *args, **kwargs):
        if _has_tpu_input(inputs_):
            from torchtpu.compile import backend

            return backend(model_, inputs_)
        return inductor_call(self, model_, inputs_, *args, **kwargs)

    __call__._torchtpu = True
    wrapper.__init__, wrapper.__call__ = __init__, __call__
