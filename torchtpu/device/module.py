"""The torch.tpu module: what torch.cuda offers, for the tpu device."""
from __future__ import annotations

import warnings

import torch

from ..runtime import placement, rng, sync_debug
from . import memory as _memory  # (torch.tpu.memory is the public module device/submodules.py makes)


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


# torch.utils.checkpoint stashes and restores a device's RNG state only when
# torch.<device>._initialized is true (without it, dropout in a checkpointed block
# drew a different mask on recompute and gradients differed silently)
_initialized = True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """The XLA devices this process drives (`jax.local_devices()`); in a process launched for a
    distributed run, before its runtime is up, counted from the environment (JAX must not
    start before init_process_group)."""
    return placement.count()


def current_device() -> int:
    return placement.current()


def set_device(device) -> None:
    """This thread's current device (a negative index, as CUDA's, is a no-op)."""
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {d}")
        idx = d.index
    if idx is None or idx < 0:
        return
    placement.set_current(idx)


class device:  # noqa: N801 - mirrors torch.cuda.device
    """Context manager that makes `device` current (None or a negative index: no change)."""

    def __init__(self, device):
        self.idx = _index(device, optional=True)
        self.prev = -1

    def __enter__(self):
        if self.idx is not None and self.idx >= 0:
            self.prev = placement.current()
            if self.idx != self.prev:
                placement.set_current(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev >= 0 and self.prev != placement.current():
            placement.set_current(self.prev)
        return False


class device_of(device):  # noqa: N801 - mirrors torch.cuda.device_of
    """The device of tensor `obj` made current (no change for a non-tpu tensor)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else -1)


def _index(device, optional: bool = False):
    """The index `device` names (None: the current device), checked against device_count()."""
    if device is None:
        return None if optional else placement.current()
    if isinstance(device, int):
        idx = device
    else:
        if isinstance(device, str) and device.isdigit():
            device = int(device)
            return _index(device, optional)
        d = torch.device(device)
        if d.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {d}")
        idx = d.index
        if idx is None:
            return None if optional else placement.current()
    if idx == -1 and not optional:
        return placement.current()
    if idx >= 0:
        n = placement.count()
        if idx >= n:
            raise AssertionError(f"Invalid device id {idx}: this process has {n} tpu device"
                                 f"{'s' if n != 1 else ''} (device_count() == {n})")
    return idx


def _check(device) -> None:
    _index(device)


def get_device_name(device=None) -> str:
    """The XLA device behind "tpu": its kind on TPU/GPU ("TPU v5 lite"), "XLA:CPU (<model>)" on the host."""
    return _memory.device_name(_index(device))


def get_device_capability(device=None) -> tuple[int, int]:
    """(major, minor): the TPU generation, a GPU's compute capability, (0, 0) on XLA:CPU."""
    return _memory.device_capability(_index(device))


def get_device_properties(device=None) -> _memory.DeviceProperties:
    """name, platform, device_kind, total_memory, major, minor, multi_processor_count."""
    return _memory.DeviceProperties(_index(device))


def synchronize(device=None) -> None:
    """Wait for every computation dispatched so far, whether or not its results are still
    held (deferred work is materialized first)."""
    from ..eager import deferred
    from ..runtime import inflight

    _check(device)
    deferred.flush("synchronize")
    inflight.wait_all()
    from ..runtime import checks, transfer

    transfer.wait_host_copies()  # landed by wait_all; this raises a failed one's error

    checks.raise_pending()  # device-side check failures surface here, as CUDA's asserts do


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator."""
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator."""
    rng.manual_seed_all(seed)


def seed() -> None:
    rng.seed()


def seed_all() -> None:
    """A non-deterministic seed for every device."""
    rng.manual_seed_all(rng.seed())


def initial_seed() -> int:
    return rng.initial_seed()


def __getattr__(name: str):
    # default_generators: a tuple of torch.Generator per device, as torch.cuda's; made on first
    # use, after PrivateUse1 is named "tpu"
    if name == "default_generators":
        return tuple(rng.default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"default_generators"})


def get_rng_state(device="tpu") -> torch.Tensor:
    return rng.get_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    rng.set_state(new_state, _index(device))


def get_rng_state_all() -> list[torch.Tensor]:
    return [rng.get_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        rng.set_state(state, i)


def memory_allocated(device=None) -> int:
    """Bytes held by live device buffers (storages still referenced by a tensor)."""
    return _memory.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return _memory.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes PJRT holds for this process (equals memory_allocated() on XLA:CPU)."""
    return _memory.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    return _memory.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    _memory.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats()'s keys where meaningful (allocated/active/reserved bytes)."""
    return _memory.memory_stats(_index(device))


def memory_stats_as_nested_dict(device=None) -> dict:
    """memory_stats() as the nested dict torch.cuda flattens it from."""
    return _memory.memory_stats_as_nested_dict(_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    """Reset the accumulated counters of memory_stats() (num_ooms)."""
    _memory.reset_accumulated_memory_stats(_index(device))


def host_memory_stats() -> "collections.OrderedDict[str, int]":
    """The pinned host allocator's statistics (`pin_memory()`, `DataLoader(pin_memory=True)`,
    non-blocking copies to the host), flattened as torch.cuda.host_memory_stats flattens its
    own: "allocations.peak", "allocated_bytes.current", "host_alloc_time.avg", ..."""
    import collections

    flat = []

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, obj))

    walk("", host_memory_stats_as_nested_dict())
    return collections.OrderedDict(sorted(flat))


def host_memory_stats_as_nested_dict() -> dict:
    """host_memory_stats() as the nested dict it is flattened from (runtime/pinned.host_stats)."""
    from ..runtime import pinned

    return pinned.host_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Reset host_memory_stats()' historical counts ("allocated", "freed") and timings."""
    from ..runtime import pinned

    pinned.reset_accumulated_host_stats()


def reset_peak_host_memory_stats() -> None:
    """Reset host_memory_stats()' "peak" values to the current ones."""
    from ..runtime import pinned

    pinned.reset_peak_host_stats()


def memory_cached(device=None) -> int:
    warnings.warn("torch.tpu.memory_cached has been renamed to torch.tpu.memory_reserved", FutureWarning)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    warnings.warn("torch.tpu.max_memory_cached has been renamed to torch.tpu.max_memory_reserved", FutureWarning)
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    warnings.warn("torch.tpu.reset_max_memory_cached now calls torch.tpu.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning)
    reset_peak_memory_stats(device)


def device_memory_used(device=None) -> int:
    """Bytes of the device's memory in use (by every process where PJRT reports a limit;
    host RAM in use on XLA:CPU)."""
    free, total = mem_get_info(device)
    return total - free


def memory_summary(device=None, abbreviated: bool = False) -> str:
    return _memory.memory_summary(abbreviated, _index(device))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of device memory (host RAM on XLA:CPU)."""
    return _memory.mem_get_info(_index(device))


def empty_cache() -> None:
    """Buffers are freed as soon as their last tensor dies; nothing is cached."""


def init() -> None:
    """Start the device runtime now rather than at the first use (as torch.cuda.init); a
    no-op once started."""
    placement.devices()


OutOfMemoryError = torch.OutOfMemoryError


def is_current_stream_capturing() -> bool:
    """False: tpu has no stream capture (a CUDA graph's counterpart is torch.compile's
    program), so no capture is ever under way."""
    return False


def set_sync_debug_mode(debug_mode) -> None:
    """"default" or 0: say nothing; "warn" or 1: warn; "error" or 2: raise, at each operation
    that makes the host wait for the device (runtime/sync_debug.py says which)."""
    sync_debug.set_mode(debug_mode)


def get_sync_debug_mode() -> int:
    return sync_debug.MODE[0]


def can_device_access_peer(device, peer_device) -> bool:
    """Whether `device` reads `peer_device`'s buffers directly: PJRT copies between a host's
    devices without the host (runtime/transfer.moved); a device is not its own peer."""
    d = _index(device)  # (out of range: AssertionError "Invalid device id ...", as CUDA's)
    try:
        p = _index(peer_device)
    except AssertionError:
        raise AssertionError("Invalid peer device id") from None
    return d != p


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def set_eager_mode(mode: str) -> None:
    """Same as torchtpu.set_eager_mode."""
    from ..eager import modes

    modes.set(mode)


def get_eager_mode() -> str:
    from ..eager import modes

    return modes.get()


def eager_mode(mode: str):
    """Same as torchtpu.eager_mode (a context manager)."""
    from ..eager import modes

    return modes.mode(mode)


from .streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream  # noqa: E402,F401

from .submodules import install as _install_submodules  # noqa: E402

_install_submodules(__name__)
