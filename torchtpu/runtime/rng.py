"""Device RNG state: a seed and a counter, shared by every thread.

Each random op takes (seed, counter) as runtime inputs and derives its key with
fold_in inside the compiled program, so drawing random numbers costs no extra
dispatch and never recompiles. Backward runs on the autograd engine's thread,
hence process-wide state under a lock.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

_lock = threading.Lock()
_state = {"seed": 67280421310721, "offset": 0}


def manual_seed(seed: int) -> None:
    with _lock:
        _state["seed"] = int(seed) & 0xFFFFFFFFFFFFFFFF
        _state["offset"] = 0


def initial_seed() -> int:
    return _state["seed"]


def seed() -> int:
    """Seed with a non-deterministic random number (as torch.cuda.seed); returns it."""
    import os

    s = int.from_bytes(os.urandom(8), "little") & 0x7FFFFFFFFFFFFFFF
    manual_seed(s)
    return s


class DeviceGenerator:
    """torch.tpu.default_generators[0]: the device RNG state behind torch.Generator's state
    methods (manual_seed, seed, initial_seed, get_state, set_state), for code that saves and
    restores it through the generator object. A Python backend cannot create a real
    torch.Generator for the device (PyTorch asks the C++ hooks for one), so this is not one:
    random ops on tpu draw from this state; `generator=` takes no tpu generator."""

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", 0)

    def manual_seed(self, seed: int) -> "DeviceGenerator":
        manual_seed(seed)
        return self

    def seed(self) -> int:
        return seed()

    def initial_seed(self) -> int:
        return initial_seed()

    def get_state(self) -> torch.Tensor:
        return get_state()

    def set_state(self, new_state: torch.Tensor) -> "DeviceGenerator":
        set_state(new_state)
        return self


default_generator = DeviceGenerator()


def next_key_data() -> tuple:
    """(seed low word, seed high word, counter) for one random op; advances the counter."""
    with _lock:
        off = _state["offset"]
        _state["offset"] = off + 1
        seed = _state["seed"]
    return np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32), np.uint32(off & 0xFFFFFFFF)


def get_state() -> torch.Tensor:
    with _lock:
        return torch.tensor([_state["seed"], _state["offset"]], dtype=torch.int64).view(torch.uint8)


def set_state(state: torch.Tensor) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise TypeError(f"expected a torch.ByteTensor as the RNG state, but got {type(state).__name__}"
                        + (f" of dtype {state.dtype}" if isinstance(state, torch.Tensor) else ""))
    if state.numel() != 16:
        raise RuntimeError(f"RNG state is wrong size: expected 16 bytes, got {state.numel()}")
    vals = state.detach().cpu().contiguous().view(torch.int64).tolist()
    with _lock:
        _state["seed"], _state["offset"] = int(vals[0]), int(vals[1])


def key(lo, hi, counter):
    """The JAX key for one random op; call inside a trace."""
    import jax

    k = jax.random.fold_in(jax.random.key(lo), hi)
    return jax.random.fold_in(k, counter)
