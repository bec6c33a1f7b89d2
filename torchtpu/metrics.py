"""Process-wide counters: compiles, cache hits, executions, transfers, CPU fallbacks."""
from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter = Counter()
_fallbacks: Counter = Counter()


def bump(name: str, n: int = 1) -> None:
    # No lock: bumped several times per op on the hot path, and under the GIL an int
    # increment is as good as atomic for counters read by people.
    _counts[name] += n


def fallback(op_name: str) -> None:
    _fallbacks[op_name] += 1
    _counts["cpu_fallbacks"] += 1


# Callables that add counts kept elsewhere into _counts (csrc/hit.cpp counts its cache hits
# in C++ and adds them here when the counters are read or reset)
_flushers: list = []


def add_flusher(fn) -> None:
    _flushers.append(fn)


def _flush() -> None:
    for fn in _flushers:
        fn()


def live_counts() -> Counter:
    """The counters themselves, for native code that bumps them (csrc/hit.cpp): the same
    dict, mutated in place, never replaced (reset() clears it)."""
    return _counts


def snapshot() -> dict:
    with _lock:
        _flush()
        counts = dict(_counts)  # one C-level copy: bump() does not lock
        out = {
            k: counts.get(k, 0)
            for k in (
                "compiles",
                "cache_hits",
                "executions",
                "transfers_to_device",
                "bytes_to_device",
                "transfers_to_host",
                "bytes_to_host",
                "cpu_fallbacks",
            )
        }
        out.update({k: v for k, v in counts.items() if k not in out})
        out["fallback_ops"] = dict(_fallbacks)
        return out


def reset() -> None:
    with _lock:
        _flush()
        _counts.clear()
        _fallbacks.clear()
