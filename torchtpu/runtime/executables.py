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
entry lacks `used` for (a graph's program) goes oldest first. Together the caches are also
bounded in bytes: each program is charged with the host memory its compile kept (`sized`,
measured by runtime/launcher.py), and past `set_executable_limit(total_bytes=)` the cache
holding the most bytes evicts its least recently used eighth. Evicting gives the freed
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
_held = [0]  # host bytes the executables of every cache keep, as measured when compiled
_GONE = object()


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
        self.lock = threading.RLock()  # reentrant: pop() takes it, and so may its callers
        self._counts: dict = {}  # group -> its entries
        self.nbytes: dict = {}  # key -> host bytes its compile kept (runtime/launcher.py)
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
                self._evict([(k, e) for k, e in list(self.items()) if self.group(k) == g], max(1, bound // 8))
        bound = self.limit()
        if len(self) > bound:
            self._evict(list(self.items()), max(1, bound // 8))

    def sized(self, key: Hashable, nbytes: int) -> None:
        """Charge the executable under `key` with `nbytes` of host memory (its compile's);
        past the bound in bytes of all caches together, the least recently used go."""
        if key not in self:  # evicted or dropped meanwhile
            return
        nbytes = max(0, int(nbytes))
        with self.lock:
            self.nbytes[key] = self.nbytes.get(key, 0) + nbytes
            _held[0] += nbytes
        if _held[0] > _cache.limit("total_bytes")():
            _shrink()

    def pop(self, key, *default):
        """dict.pop, giving back the entry's bytes."""
        with self.lock:
            got = super().pop(key, _GONE)
            _held[0] -= self.nbytes.pop(key, 0)
        if got is _GONE:
            if default:
                return default[0]
            raise KeyError(key)
        return got

    def remember(self, quick_key: Hashable, key: Hashable, exe, found=None) -> None:
        """Let `quick_key` find `exe` (held under `key`), or `found` (what the caller serves
        it with: eager/extents.Bucketed), from now on; nothing when this cache no longer
        holds it or the quick keys are at their bound."""
        if len(self.by_quick_key) < _QUICK_MAX and self.get(key) is exe:
            self.by_quick_key[quick_key] = exe if found is None else found

    def drop(self, key: Hashable) -> None:
        """Forget one executable (it failed: its next call compiles again)."""
        gone = self.pop(key, None)  # (pop takes the lock)
        if gone is not None:
            self.by_quick_key.clear()
            if self.group is not None:
                self._uncount(key)

    def clear(self) -> None:
        with self.lock:
            super().clear()
            self._counts.clear()
            self.by_quick_key.clear()
            _held[0] -= sum(self.nbytes.values())
            self.nbytes.clear()
        for fn in self._listeners:
            fn()

    def on_clear(self, fn: Callable[[], None]) -> None:
        """Call `fn` whenever this cache is emptied (state derived from its entries)."""
        self._listeners.append(fn)

    def _uncount(self, key) -> None:
        g = self.group(key)
        self._counts[g] = self._counts.get(g, 1) - 1

    def _evict(self, items, n: int) -> None:
        """Evict the `n` least recently used of `items`."""
        victims = [k for k, _ in sorted(items, key=lambda kv: getattr(kv[1], "used", 0))[:n]]
        if self.group is not None:
            for k in victims:
                if k in self:
                    self._uncount(k)
        self.by_quick_key.clear()
        _cache.evict(self, victims, None)  # (pop takes the lock)


def _shrink() -> None:
    """Past the bound in bytes: evict the least recently used eighth of the cache holding
    the most bytes, until under it."""
    from ..metrics import bump

    bound = _cache.limit("total_bytes")()
    while _held[0] > bound:
        caches = [c for c in (ops, regions, control_flow, *list(_graphs)) if c.nbytes]
        if not caches:
            return
        c = max(caches, key=lambda c: sum(c.nbytes.values()))
        n = len(c)
        c._evict(list(c.items()), max(1, n // 8))
        bump("executables_evicted_for_bytes", n - len(c))


def held_bytes() -> int:
    """Host memory the kept executables hold, all caches together (measured at their compiles)."""
    return _held[0]


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
