"""The one place that touches PyTorch's experimental Python-backend registration."""
from __future__ import annotations

import sys

import torch

from . import module

_done = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register() -> None:
    """Rename PrivateUse1 to "tpu", install torch.tpu, hooks and the device guard (once)."""
    global _done
    if _done:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(
        "tpu", backend_module=module, hook=_Hooks(), device_guard=_Guard()
    )
    sys.modules.setdefault("torch.tpu", module)
    from . import (accelerate_support, accelerator, autocast, default_compile, events, profiler, storage_api, streams,
                   tied, type_names)

    autocast.install()
    tied.install()
    storage_api.install()
    events.install()  # torch.Event(device="tpu") records, times and synchronizes
    streams.install()  # torch.Stream(device="tpu").synchronize() waits for the device
    accelerator.install()  # torch.accelerator.synchronize / memory_* / ... reach torch.tpu
    default_compile.install()  # torch.compile(model) on tpu tensors uses backend "tpu"
    accelerate_support.install()  # HF Accelerate (Trainer) defaults to tpu, as to cuda
    profiler.install()  # torch.profiler traces get each program's device time
    type_names.install()  # autograd errors name torch.tpu.FloatTensor, not tpuFloatType
    _done = True
