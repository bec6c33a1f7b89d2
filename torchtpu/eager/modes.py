"""The eager mode: strict, debug or defer_and_fuse, process-wide.

Process-wide, never thread-local: backward kernels run on the autograd engine's
device thread and must see the mode (and the pending graph) the user set.
"""
from __future__ import annotations

import contextlib
import threading

from ..config import startup
from ..runtime import pending

MODES = ("strict", "debug", "defer_and_fuse")

_lock = threading.Lock()


def _from_env() -> str:
    mode = startup.eager_mode
    if mode not in MODES:
        raise ValueError(f"TORCHTPU_EAGER_MODE={mode!r}: expected one of {', '.join(MODES)}")
    return mode


state = {"mode": _from_env(), "debug_nans": startup.debug_nans}


def get() -> str:
    return state["mode"]


def set(mode: str) -> None:  # noqa: A001 - mirrors the public set_eager_mode
    if mode not in MODES:
        raise ValueError(f"set_eager_mode: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    with _lock:
        old = state["mode"]
        if old == "defer_and_fuse" and mode != old:
            pending.materialize("mode_change")  # (eager/deferred.py's flush)
        state["mode"] = mode


@contextlib.contextmanager
def mode(name: str):
    old = get()
    set(name)
    try:
        yield
    finally:
        set(old)


def debug_nans() -> bool:
    return state["debug_nans"]


def set_debug_nans(enabled: bool) -> None:
    state["debug_nans"] = bool(enabled)
