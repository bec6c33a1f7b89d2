"""`pin_memory()`, `is_pinned()` and non-blocking copies to the host, for the tpu device.

PyTorch implements these over the accelerator's C++ host allocator, which the
pure-Python PrivateUse1 hooks cannot register (they raise "implement
getPinnedMemoryAllocator"). Their ATen kernels are served here instead:

- `_pin_memory` and `is_pinned` at the CPU key (they take a CPU tensor): pinned
  blocks come from runtime/pinned.py. `t.pin_memory()`, `pin_memory("tpu")`,
  `DataLoader(pin_memory=True)` and storages' `pin_memory()` all reach them.
- `_to_copy` for tpu tensors: a non-blocking copy to the CPU returns pinned memory,
  as CUDA's does; everything else runs PyTorch's own composite (redispatched at the
  CPU key, where it is the kernel; its allocations and copy_ dispatch by device).

`torch.empty(..., pin_memory=True)` (and the factories over it: zeros, randn, tensor,
empty_like, ...) never reaches Python: CPU allocation happens in C++. The extension
`_pinned_factories` (csrc/pinned_factories.cpp) replaces the two BackendSelect kernels
every CPU factory allocates through, routing a pinned allocation to `_pin_memory` here,
and those of the factories that resize what they start from (arange, eye, windows) or
allocate themselves (tril/triu_indices, scalar_tensor): run unpinned, then pinned.

`.to("cpu", non_blocking=True)` returns its pinned result before the value has
landed (runtime/transfer.to_host_async: a worker thread writes it); as on CUDA the
value is right once the user synchronizes (`torch.tpu.synchronize()`,
`torch.accelerator.synchronize()`, a tpu stream's or event's synchronize) or makes
any blocking host read after it. A plain `torch.Stream(device="tpu")` synchronizes
too (device/streams.py installs it). `cpu_tensor.copy_(tpu_tensor, non_blocking=True)`
is asynchronous the same way when the destination is pinned, contiguous and of the
source's dtype and shape (eager/runtime_kernels.copy_), and blocking otherwise, as CUDA's from
pageable memory. A host->device copy out of pinned memory waits for the copies still
landing (runtime/transfer.to_device_array), as it would queue behind them on CUDA's stream.
"""
from __future__ import annotations

import warnings

import torch

from ..runtime import pinned

_lib = torch.library.Library("aten", "IMPL")
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_to_copy_op = torch.ops.aten._to_copy.default


def _check_device(device, op: str) -> None:
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cpu":
        raise RuntimeError("CPU device type not an accelerator.")
    if device.type != "tpu":
        raise RuntimeError(f"{op}: cannot pin memory for device '{device}'; the accelerator here is tpu")


def is_pinned(self, device=None) -> bool:
    if device is not None and torch.device(device).type != "tpu":
        return False
    return pinned.is_pinned_ptr(self.untyped_storage().data_ptr())


def _pin_memory(self, device=None):
    _check_device(device, "pin_memory")
    out = pinned.empty_strided(tuple(self.shape), self.stride(), self.dtype) \
        if _dense(self) else pinned.empty_strided(tuple(self.shape), _contiguous(self.shape), self.dtype)
    out.copy_(self)
    return out


def _dense(t) -> bool:
    """Non-overlapping and dense (a permutation of a contiguous layout): pinning keeps its strides."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _contiguous(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    kw = dict(dtype=dtype, layout=layout, device=device, pin_memory=pin_memory, memory_format=memory_format)
    to_host = device is not None and torch.device(device).type == "cpu"
    if to_host and self.device.type != "cpu":
        # (only to the host: a tpu->tpu conversion, .to(dtype), stays in its deferred region)
        _computed_first(self)
    if non_blocking and to_host \
            and layout in (None, torch.strided) and memory_format in (None, torch.preserve_format) \
            and self.layout == torch.strided and not (self.is_conj() or self.is_neg()):
        out = _to_host_async(self, dtype or self.dtype)
        if out is not None:
            return out
    if (non_blocking or pin_memory) and to_host and layout in (None, torch.strided):
        # CUDA gives a pinned result for a non-blocking device->host copy.
        kw["pin_memory"] = None
        host = _to_copy_op.redispatch(_CPU, self, non_blocking=False, **kw)
        return _pin_memory(host)
    return _to_copy_op.redispatch(_CPU, self, non_blocking=non_blocking, **kw)


def _computed_first(t) -> None:
    """Compute a value still pending on the device before the host allocates its copy, so
    that a failure there (the device out of memory) surfaces as itself and not as whatever
    the host allocation of the result runs into first (CPU's allocator refusing 256 GiB)."""
    from ..runtime import pending, storage

    pending.concrete(storage.lookup(t), "host_read")


def _to_host_async(self, dtype):
    """The pinned result of a non-blocking copy to the host, its value still landing; None
    where the copy must block (a dtype numpy cannot hold)."""
    from ..runtime import transfer

    # the layout CPU's _to_copy gives (preserve_format), read off a meta stand-in
    like = torch.empty_like(torch.empty_strided(self.shape, self.stride(), dtype=dtype, device="meta"))
    out = pinned.empty_strided(tuple(like.shape), like.stride(), dtype)
    if out.numel():
        try:
            transfer.to_host_async(self, out)
        except TypeError:  # no numpy view of this dtype (float8): the blocking path
            return None
    return out


_done = False


def install() -> None:
    global _done
    if _done:
        return
    _lib.impl("is_pinned", is_pinned, "CPU")
    _lib.impl("_pin_memory", _pin_memory, "CPU")
    _lib.impl("_to_copy", _to_copy, "PrivateUse1")
    try:
        from . import _pinned_factories  # noqa: F401  (importing it registers the kernels)
    except ImportError as err:  # not built: pin_memory=True factories keep PyTorch's error
        warnings.warn(f"torchtpu: torch.empty(..., pin_memory=True) is unavailable: the C++ extension "
                      f"torchtpu/device/_pinned_factories is not built; run `make venv` ({err})")
    _done = True
