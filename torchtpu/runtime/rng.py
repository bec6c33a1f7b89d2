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
    vals = state.detach().cpu().contiguous().view(torch.int64).tolist()
    with _lock:
        _state["seed"], _state["offset"] = int(vals[0]), int(vals[1])


def key(lo, hi, counter):
    """The JAX key for one random op; call inside a trace."""
    import jax

    k = jax.random.fold_in(jax.random.key(lo), hi)
    return jax.random.fold_in(k, counter)
