"""torch.accelerator on "tpu".

torch.accelerator's functions call C++ (`torch._C._accelerator_*`), which reaches
the device through a C++ DeviceGuardImpl and a C++ DeviceAllocator; a Python
backend has neither, so for PrivateUse1 they raise ("Backend doesn't support
synchronizing all streams", "Allocator for tpu is not a DeviceAllocator").
`install()` routes each of them to torch.tpu when the device it is asked about is
tpu (the current accelerator, an index of it, or a tpu device); any other device
keeps PyTorch's function. memory_allocated / max_memory_allocated /
memory_reserved / max_memory_reserved read torch.accelerator.memory.memory_stats,
so routing memory_stats serves them too.
"""
from __future__ import annotations

import functools

import torch


def _on_tpu(device) -> bool:
    if device is None or isinstance(device, int):
        acc = torch._C._accelerator_getAccelerator()
        return acc is not None and acc.type == "tpu"
    return torch.device(device).type == "tpu"


def _route(namespaces, name: str, ours, by_device: bool = False) -> None:
    """torch.accelerator.<name> served by `ours(device)` for a tpu device (None: the current
    one). `by_device`: its answer for an explicit torch.device is always the same (a device's
    one stream), kept per device."""
    orig = getattr(namespaces[0], name)
    if getattr(orig, "_torchtpu", False):
        return
    known: dict = {}

    @functools.wraps(orig)
    def routed(*args, **kwargs):
        device = args[0] if args else kwargs.get("device", kwargs.get("device_index"))
        keep = by_device and type(device) is torch.device  # (Dynamo asks current_stream per compiled call)
        if keep:
            got = known.get(device)
            if got is not None:
                return got
        if _on_tpu(device):
            got = ours(device)
            if keep and device.index is not None:
                known[device] = got
            return got
        return orig(*args, **kwargs)

    routed._torchtpu = True
    for ns in namespaces:
        if getattr(ns, name, None) is orig:
            setattr(ns, name, routed)


def _tpu(name: str, takes_device: bool = True):
    """torch.tpu.<name>, looked up at the call: under autoload torch.tpu loads torchtpu on
    first use (device/lazy.py), and this is installed before then."""
    if takes_device:
        return lambda device: getattr(torch.tpu, name)(device)
    return lambda device: getattr(torch.tpu, name)()


def install() -> None:
    import torch.accelerator as acc
    import torch.accelerator.memory as accmem

    both = (acc, accmem)
    _route((acc,), "synchronize", _tpu("synchronize"))
    _route((acc,), "get_device_capability", lambda device: {
        "supported_dtypes": {torch.float32, torch.float64, torch.float16, torch.bfloat16,
                             torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                             torch.bool, torch.complex64}})
    _route((acc,), "current_stream", _tpu("current_stream"), by_device=True)
    _route(both, "memory_stats", _tpu("memory_stats"))
    _route(both, "reset_peak_memory_stats", _tpu("reset_peak_memory_stats"))
    _route(both, "reset_accumulated_memory_stats", lambda device: None)
    _route(both, "empty_cache", _tpu("empty_cache", takes_device=False))
    _route(both, "get_memory_info", _tpu("mem_get_info"))
