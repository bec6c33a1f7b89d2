"""`import torchtpu` binds the device into torch: the name (device/lazy.py, shared with
autoload), the real torch.tpu, and every wrapper PyTorch needs for a Python backend."""
from __future__ import annotations

from . import lazy, module

_done = False


def register() -> None:
    """Rename PrivateUse1 to "tpu", install torch.tpu, hooks and the device guard (once)."""
    global _done
    if _done:
        return
    lazy.name_device(module)  # done already where autoload bound the device (torch.tpu was lazy)
    lazy.retire(module)  # autoload's lazy kernels and wrappers go; torch.tpu is `module`
    from . import (accelerate_support, accelerator, autocast, default_compile, events, profiler, shallow_copy,
                   storage_api, streams, torchao_support, type_names)

    autocast.install()
    storage_api.install()
    events.install()  # torch.Event(device="tpu") records, times and synchronizes
    streams.install()  # torch.Stream(device="tpu").synchronize() waits for the device
    accelerator.install()  # torch.accelerator.synchronize / memory_* / ... reach torch.tpu
    default_compile.install()  # torch.compile(model) on tpu tensors uses backend "tpu"
    accelerate_support.install()  # HF Accelerate (Trainer) defaults to tpu, as to cuda
    torchao_support.install()  # torchao's float8 inference accepts tpu hardware
    profiler.install()  # torch.profiler traces get each program's device time
    type_names.install()  # autograd errors name torch.tpu.FloatTensor, not tpuFloatType
    shallow_copy.install()  # module.to("tpu") keeps its Parameter objects, as on CUDA
    _done = True
