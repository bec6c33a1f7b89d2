"""The torch.tpu module: what torch.cuda offers, for the tpu device."""
from __future__ import annotations

import contextlib

import torch

from ..runtime import rng
from . import memory


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
    """One process drives one XLA device (multi-device runs are multi-process)."""
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    idx = torch.device(device).index if not isinstance(device, int) else device
    if idx not in (None, 0):
        raise RuntimeError(f"torch.tpu.set_device: invalid device index {idx}; this process drives tpu:0")


@contextlib.contextmanager
def device(device):  # noqa: F811 - mirrors torch.cuda.device
    set_device(device)
    yield


def _check(device) -> None:
    if device is None or isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {d}")
        idx = d.index
    if idx not in (None, 0, -1):
        raise AssertionError(f"Invalid device id {idx}: this process drives tpu:0 (device_count() == 1)")


def get_device_name(device=None) -> str:
    """The XLA device behind "tpu": its kind on TPU/GPU ("TPU v5 lite"), "XLA:CPU (<model>)" on the host."""
    _check(device)
    return memory.device_name()


def get_device_capability(device=None) -> tuple[int, int]:
    """(major, minor): the TPU generation, a GPU's compute capability, (0, 0) on XLA:CPU."""
    _check(device)
    return memory.device_capability()


def get_device_properties(device=None) -> memory.DeviceProperties:
    """name, platform, device_kind, total_memory, major, minor, multi_processor_count."""
    _check(device)
    return memory.DeviceProperties()


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
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    rng.manual_seed(seed)


def seed() -> None:
    rng.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return rng.initial_seed()


def __getattr__(name: str):
    # default_generators: a tuple of torch.Generator, as torch.cuda's; made on first use,
    # after PrivateUse1 is named "tpu" (one device per process)
    if name == "default_generators":
        return (rng.default_generator(),)
    raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")


def get_rng_state(device=None) -> torch.Tensor:
    return rng.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    rng.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [rng.get_state()]


def set_rng_state_all(new_states) -> None:
    rng.set_state(new_states[0])


def memory_allocated(device=None) -> int:
    """Bytes held by live device buffers (storages still referenced by a tensor)."""
    _check(device)
    return memory.memory_allocated()


def max_memory_allocated(device=None) -> int:
    _check(device)
    return memory.max_memory_allocated()


def memory_reserved(device=None) -> int:
    """Bytes PJRT holds for this process (equals memory_allocated() on XLA:CPU)."""
    _check(device)
    return memory.memory_reserved()


def max_memory_reserved(device=None) -> int:
    _check(device)
    return memory.max_memory_reserved()


def reset_peak_memory_stats(device=None) -> None:
    _check(device)
    memory.reset_peak_memory_stats()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats()'s keys where meaningful (allocated/active/reserved bytes)."""
    _check(device)
    return memory.memory_stats()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    _check(device)
    return memory.memory_summary(abbreviated)


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of device memory (host RAM on XLA:CPU)."""
    _check(device)
    return memory.mem_get_info()


def empty_cache() -> None:
    """Buffers are freed as soon as their last tensor dies; nothing is cached."""


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


from .streams import Event, Stream, current_stream, default_stream, set_stream, stream  # noqa: E402,F401
