"""Which of this process's XLA devices a tensor lives on and an op runs on.

A process drives every local XLA device, as torch.cuda drives every visible GPU: "tpu:N" is
`jax.local_devices()[N]`. A tensor's device index is in its TensorImpl (made by
csrc/device_guard.cpp's create_empty); its storage's buffer is committed to that device, so
a jitted program over it runs there (JAX places a computation on its committed inputs).
What has no input to follow (a factory, a buffer never written) is placed by JAX's default
device, which an op on tpu:N sets for its call (`on`).

The current device (`set_device`, `torch.tpu.device(N)`) is per thread, kept by the C++
device guard, so the autograd engine's worker for device N runs on N as CUDA's does.

Until something names a device other than 0 (`spread()` is False), nothing here runs on the
op path: a one-device program pays nothing for the others.
"""
from __future__ import annotations

import contextlib
import os
import threading

import jax

from . import chips, jaxenv  # noqa: F401  (jaxenv first: it runs chips.configure)

_spread = [False]   # some tensor, op or current device is not tpu:0
SPREAD = _spread    # the same cell, read per op by the executors (spread() is a call)
_chosen = [False]   # the program has set a current device
_devices: list = []


_NOT_SPREAD = contextlib.nullcontext()


class _Active(threading.local):
    index = None    # the device of the op running on this thread (None: the current device)


_active = _Active()


def _guard():
    # the C++ device guard (csrc/device_guard.cpp): device/lazy.py loads it when it names the
    # device, before any tensor exists; imported here on first use only
    from . import _device_guard

    return _device_guard


def spread() -> bool:
    """Whether any device but tpu:0 has been named in this process."""
    return _spread[0]


def create_empty(shape, dtype, index: int):
    """A tpu tensor over an empty storage on tpu:`index` (the C++ guard's helper)."""
    return _guard().create_empty(shape, dtype, index)


def devices() -> list:
    """This process's XLA devices by tpu index (starts JAX's backend on first call). A process
    given one chip of a host it shares with other torchrun processes (runtime/chips.py) has it
    at its LOCAL_RANK's index; the others' indices hold None."""
    if not _devices:
        found = jax.local_devices()
        shared = chips.slot()
        if shared is not None and len(found) == 1:
            found = [found[0] if i == shared[0] else None for i in range(shared[1])]
        _devices.extend(found)
        try:
            _guard().set_count(len(found))
        except ImportError:  # the C++ guard is not built: one device, as its Python stand-in says
            del _devices[1:]
    return _devices


def started() -> bool:
    """Whether JAX's backend (and so the device list) is up."""
    if _devices:
        return True
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def count() -> int:
    """The number of tpu devices. Before JAX's backend starts, counted without starting it
    (`count_unstarted`): a distributed run must bring its runtime up first, and a program that
    only asks should not pay for it (as CUDA counts its devices without a context)."""
    if _devices or started():
        return len(devices())
    return count_unstarted()


def count_unstarted() -> int:
    """Local devices as JAX will see them, read from the environment alone: XLA:CPU's forced
    device count, or the host's chips (runtime/chips.py), restricted by TPU_VISIBLE_CHIPS /
    CUDA_VISIBLE_DEVICES."""
    import re

    shared = chips.slot()
    if shared is not None:
        return shared[1]
    kind, n = chips.host_chips()
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu") or not kind:
        m = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
        return int(m.group(1)) if m else 1
    visible = os.environ.get("TPU_VISIBLE_CHIPS" if kind == "tpu" else "CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    return n


def chosen() -> bool:
    """Whether the program has set a current device (torch.tpu.set_device)."""
    return _chosen[0]


def current() -> int:
    """This thread's current device index."""
    if not _spread[0]:
        return 0
    try:
        return _guard().current()
    except ImportError:
        return 0


def check_index(index: int, what: str, n: int | None = None) -> None:
    """CUDA's error for an ordinal the process does not have."""
    n = count() if n is None else n
    if not 0 <= index < n:
        raise RuntimeError(f"{what}: invalid device tpu:{index}: invalid device ordinal "
                           f"(this process has {n} tpu device{'s' if n != 1 else ''})")
    shared = chips.slot()
    if shared is not None and index != shared[0]:
        raise _neighbours(index)


def set_current(index: int) -> None:
    """torch.tpu.set_device. Before JAX starts (a distributed launch sets the device before
    init_process_group) the index is only recorded; it is checked when the devices are known."""
    index = int(index)
    check_index(index, "torch.tpu.set_device")
    _chosen[0] = True
    if index != 0:
        _spread[0] = True
    if _spread[0]:
        _guard().set_current(index)


def index_of(device, op: str = "tpu") -> int:
    """The index a `device=` argument names (None or "tpu": the current device), checked."""
    if device is None:
        return current()
    if isinstance(device, int):
        index = device
    else:
        index = device.index if hasattr(device, "index") else None
        if index is None:
            return current()
    if index != 0 or _spread[0]:
        check_index(index, op)
        _spread[0] = True
    return index


def names_other(device) -> bool:
    """Whether a `device=` argument names a tpu device other than tpu:0."""
    return device is not None and getattr(device, "index", None) not in (None, 0) \
        and getattr(device, "type", None) == "tpu"


def active_index() -> int:
    """The device an op running now makes its results on."""
    if not _spread[0]:
        return 0
    i = _active.index
    return current() if i is None else i


def jax_device(index: int | None = None):
    """The XLA device of tpu:`index` (the active one when None)."""
    d = devices()[active_index() if index is None else index]
    if d is None:
        raise _neighbours(active_index() if index is None else index)
    return d


def _neighbours(index: int) -> RuntimeError:
    rank = chips.slot()[0]
    return RuntimeError(
        f"tpu:{index} is driven by local rank {index}'s process on this host; this process drives "
        f"tpu:{rank} only (under torchrun each process is given its own chip: runtime/chips.py)")


@contextlib.contextmanager
def on(index: int):
    """Run an op on tpu:`index`: its results are made there, and what JAX places by default
    (a program with no committed input) goes there."""
    prev = _active.index
    _active.index = index
    try:
        with jax.default_device(devices()[index]):
            yield
    finally:
        _active.index = prev


def at(device, op: str = "tpu"):
    """The context in which something made outside an op (a factory kernel, a storage, a
    buffer brought from the host) is made on `device` (an index, a torch.device, or None: the
    current one): `on` it once more than tpu:0 is in use, else nothing."""
    index = index_of(device, op)
    return on(index) if _spread[0] else _NOT_SPREAD


def same_device_error(a: int, b, op: str) -> RuntimeError:
    other = b if isinstance(b, str) else f"tpu:{b}"
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"tpu:{a} and {other}! (when checking arguments for {op})")


def call_index(op: str, args, kwargs) -> int:
    """The device of a call: its tpu tensors' (all on one device, else CUDA's error), else its
    `device=`, else the current device."""
    found = _tensors_index(op, args, None)
    if kwargs:
        found = _tensors_index(op, kwargs.values(), found)
    if found is not None:
        return found
    return index_of(kwargs.get("device") if kwargs else None, op)


def _tensors_index(op: str, values, found):
    """The device index of the tpu tensors among `values` (lists searched, in order), checked
    against `found` (the index met so far)."""
    tdev = _torch_device()
    for v in values:
        if isinstance(v, (list, tuple)):
            found = _tensors_index(op, v, found)
            continue
        d = getattr(v, "device", None)
        if type(d) is not tdev or d.type != "tpu":
            continue
        if found is None:
            found = d.index
        elif d.index != found:
            raise same_device_error(found, d.index, op)
    return found


def _torch_device():
    import torch

    return torch.device


def _adopt_launch() -> None:
    # a process given one chip of a shared host (runtime/chips.py) is tpu:<local rank>: that is
    # every thread's current device until it sets one
    shared = chips.slot()
    if shared is not None:
        _spread[0] = True
        try:
            _guard().set_default(shared[0])
        except ImportError:
            pass


def _announce_count() -> None:
    # The autograd engine sizes its per-device worker threads from the guard's count at the first
    # backward, which may come before anything here asks JAX for its devices: the guard is told
    # the count the environment gives now (JAX is not started for it), and the true one later.
    try:
        _guard().set_count(count_unstarted())
    except ImportError:
        pass


_adopt_launch()
_announce_count()
