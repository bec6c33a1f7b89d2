"""Every compiled program torchtpu keeps, in one place and under one eviction rule.

Four kinds, each an `Executables` cache keyed by what the program was compiled for:

- `ops`: strict ops' executables (eager/executor.py), keyed by runtime/signature.Signature,
  bounded overall and per op (its shapes);
- `regions`: defer_and_fuse fused regions (eager/deferred.py);
- `control_flow`: traced higher-order ops recorded into regions (eager/control_flow.py);
- `graph_programs()`: each torch.compile graph's programs, one per input signature
  (compile/runtime.py), bounded per graph; the cache dies with its graph.

Each entry carries `used`, the `clock` at its last use (the owner sets it on a hit: a
dict lookup stays a dict lookup on the per-op path). Past its bound a cache evicts its
least recently used eighth at a time, so eviction stays off the per-call path; what an
entry lacks `used` for (a graph's program) goes oldest first. Evicting gives the freed
code back (runtime/cache.evict). `clear_all()` empties every one and calls the listeners
that keep state derived from them (deferred's signatures seen fused).
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Callable, Hashable

from . import cache as _cache

clock = itertools.count(1)  # one clock for every cache: a use's time
_QUICK_MAX = 8192  # quick keys per cache (one signature may have a few: finer than its key)


class Executables(dict):
    """key -> executable, bounded by `limit()` entries and, with `group`, by `per_group()`
    entries of one group (an op's shapes)."""

    def __init__(self, name: str, limit: Callable[[], int], per_group: Callable[[], int] | None = None,
                 group: Callable[[Hashable], Hashable] | None = None, register: bool = True):
        super().__init__()
        self.name = name
        self.limit = limit
        self.per_group = per_group
        self.group = group
        self.lock = threading.Lock()
        self._counts: dict = {}  # group -> its entries
        # quick key -> entry: a second, cheaper key of an entry (a call's arguments read off
        # their metadata, finer than the full key), which the executors look up first. Emptied
        # whenever an entry leaves, so it never holds one this cache let go.
        self.by_quick_key: dict = {}
        self._listeners: list[Callable[[], None]] = []
        if register:
            _cache.register(name, self)

    def __hash__(self) -> int:  # kept in a WeakSet (graph_programs)
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other

    def admit(self, key: Hashable, exe) -> None:
        """Keep a new executable, evicting the least recently used past the bounds."""
        with self.lock:
            self[key] = exe
        if self.group is not None:
            g = self.group(key)
            n = self._counts[g] = self._counts.get(g, 0) + 1
            bound = self.per_group()
            if n > bound:
                self._evict([(k, e) for k, e in list(self.items()) if self.group(k) == g], bound)
        bound = self.limit()
        if len(self) > bound:
            self._evict(list(self.items()), bound)

    def remember(self, quick_key: Hashable, key: Hashable, exe) -> None:
        """Let `quick_key` find `exe` (held under `key`) from now on; nothing when this cache
        no longer holds it or the quick keys are at their bound."""
        if len(self.by_quick_key) < _QUICK_MAX and self.get(key) is exe:
            self.by_quick_key[quick_key] = exe

    def drop(self, key: Hashable) -> None:
        """Forget one executable (it failed: its next call compiles again)."""
        with self.lock:
            gone = self.pop(key, None)
        if gone is not None:
            self.by_quick_key.clear()
            if self.group is not None:
                self._uncount(key)

    def clear(self) -> None:
        with self.lock:
            super().clear()
            self._counts.clear()
            self.by_quick_key.clear()
        for fn in self._listeners:
            fn()

    def on_clear(self, fn: Callable[[], None]) -> None:
        """Call `fn` whenever this cache is emptied (state derived from its entries)."""
        self._listeners.append(fn)

    def _uncount(self, key) -> None:
        g = self.group(key)
        self._counts[g] = self._counts.get(g, 1) - 1

    def _evict(self, items, bound: int) -> None:
        victims = [k for k, _ in sorted(items, key=lambda kv: getattr(kv[1], "used", 0))[:max(1, bound // 8)]]
        if self.group is not None:
            for k in victims:
                if k in self:
                    self._uncount(k)
        self.by_quick_key.clear()
        _cache.evict(self, victims, self.lock)


ops = Executables("eager op executables", _cache.limit("total"), _cache.limit("per_op"), lambda sig: sig.op)
regions = Executables("fused regions", _cache.limit("regions"))
control_flow = Executables("control flow executables", _cache.limit("per_op"))
ops.on_clear(regions.clear)  # a region's key holds the op executables it was built from
_graphs: "weakref.WeakSet[Executables]" = weakref.WeakSet()


def graph_programs(label: str) -> Executables:
    """A compiled graph's own cache of programs (one per input signature), bounded as one
    op's shapes are; torchtpu.clear_caches() empties it with the others."""
    c = Executables(f"graph programs of {label}", _cache.limit("per_op"), register=False)
    _graphs.add(c)
    return c


def clear_all() -> None:
    for c in (ops, regions, control_flow, *list(_graphs)):
        c.clear()


def count() -> int:
    """Executables held by every cache."""
    return len(ops) + len(regions) + len(control_flow) + sum(len(c) for c in list(_graphs))


_cache.register("graph programs", size=lambda: sum(len(c) for c in list(_graphs)),
                clear=lambda: [c.clear() for c in list(_graphs)])
