"""The strict executor's executable cache: op signature key -> op_program.Compiled.

Bounded by runtime/cache.py's limits (overall and per op), least recently used first.
"""
from __future__ import annotations

import itertools
import threading

from ..runtime import cache as _exe_cache
from . import deferred
from .op_program import shapes_seen

cache: dict = _exe_cache.register("eager op executables", {})  # bounded by the executable limits
lock = threading.Lock()
clock = itertools.count(1)  # an op call's time, for least-recently-used eviction
_per_op: dict = _exe_cache.register("eager op executables per op", {})  # op name -> its executables in cache


_per_op_limit = _exe_cache.limit("per_op")
_total_limit = _exe_cache.limit("total")


def admit(key, compiled) -> None:
    """Keep a new executable, keeping the cache within its bounds (runtime/cache.py): least
    recently used first, an eighth of the bound at a time so eviction stays off the per-op path."""
    with lock:
        cache[key] = compiled
    name = key[0]
    n = _per_op[name] = _per_op.get(name, 0) + 1
    per_op = _per_op_limit()
    if n > per_op:
        mine = [(k, c.used) for k, c in list(cache.items()) if k[0] == name]
        _evict(_exe_cache.least_used(mine, max(1, per_op // 8)))
    total = _total_limit()
    if len(cache) > total:
        _evict(_exe_cache.least_used([(k, c.used) for k, c in list(cache.items())], max(1, total // 8)))


def drop(key) -> None:
    """Forget an executable that failed (its next call traces again)."""
    if cache.pop(key, None) is not None:
        _per_op[key[0]] = _per_op.get(key[0], 1) - 1


def _evict(keys) -> None:
    for k in keys:
        if k in cache:
            _per_op[k[0]] = _per_op.get(k[0], 1) - 1
    _exe_cache.evict(cache, keys, lock)


def cache_size() -> int:
    return len(cache)


def clear_cache() -> None:
    with lock:
        cache.clear()
        _per_op.clear()
        shapes_seen.clear()
    deferred._fused_cache.clear()  # its keys hold the dropped op executables
    deferred.forget_signatures()
