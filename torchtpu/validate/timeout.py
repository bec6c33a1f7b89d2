"""A wall-clock limit for one validation case (SIGALRM, main thread only)."""
from __future__ import annotations

import contextlib
import signal


class Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise Timeout(f"timed out after {seconds}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
