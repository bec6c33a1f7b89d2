"""The torch.tpu module: what torch.cuda offers, for the tpu device."""
from __future__ import annotations

import contextlib

import torch

from ..runtime import jaxenv, rng, storage


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


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


def get_device_name(device=None) -> str:
    d = jaxenv.device()
    return f"{d.platform}:{d.device_kind}"


def synchronize(device=None) -> None:
    """Materialize deferred work, then block until every queued computation has finished."""
    from ..eager import deferred
    from ..runtime.storage import _table

    deferred.flush("synchronize")
    for entry in list(_table.values()):
        buf = entry.buf
        if hasattr(buf, "block_until_ready"):
            buf.block_until_ready()


def manual_seed(seed: int) -> None:
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    rng.manual_seed(seed)


def seed() -> None:
    import random

    rng.manual_seed(random.getrandbits(63))


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return rng.initial_seed()


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
    return storage.memory_allocated()


def max_memory_allocated(device=None) -> int:
    return storage.max_memory_allocated()


def reset_peak_memory_stats(device=None) -> None:
    storage.reset_peak_memory_stats()


def memory_stats(device=None) -> dict:
    return {
        "allocated_bytes.all.current": storage.memory_allocated(),
        "allocated_bytes.all.peak": storage.max_memory_allocated(),
        "live_buffers": storage.live_buffers(),
    }


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
