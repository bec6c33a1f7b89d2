"""Caches: the persistent XLA compilation cache on disk, the bounds of the executable caches,
and the registry of every module-level cache (bounded; emptied by torchtpu.clear_caches())."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable

from ..config import startup


def compile_cache_dir(path: str | os.PathLike | None) -> None:
    """Keep XLA executables in `path` so a later process skips XLA compilation
    (None turns the persistent cache off). Env: TORCHTPU_CACHE_DIR."""
    import jax

    if path is None:
        jax.config.update("jax_compilation_cache_dir", None)
        return
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # cache every executable, however quick to compile: small graphs are many
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        from jax._src import compilation_cache

        compilation_cache.reset_cache()
    except Exception:  # older/newer JAX without the hook: the config alone applies to new compiles
        pass


_EVENTS = {
    "/jax/core/compile/backend_compile_duration": "xla_compile_ms",  # or a cache load, when warm
    "/jax/core/compile/jaxpr_trace_duration": "trace_ms",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_ms",
}


def count_compile_time() -> None:
    """Add JAX's own compile timings to torchtpu.metrics(): xla_compile_ms (XLA
    compilation, or loading from the persistent cache), trace_ms and lower_ms."""
    from jax import monitoring

    from ..metrics import bump

    def listener(event: str, duration_secs: float, **kwargs) -> None:
        name = _EVENTS.get(event)
        if name is not None:
            bump(name, int(round(duration_secs * 1000)))

    monitoring.register_event_duration_secs_listener(listener)


# ---- bounded executable caches -------------------------------------------------------------
#
# Every executable the executors keep holds its compiled code (about 0.25 MB for one op on
# XLA:CPU once JAX's lowering is let go: runtime/lowerings.py; 1.5 MB before): kept forever,
# 3,000 shapes of one small op grew the process by 3 GB, and a few thousand programs made LLVM
# fail to allocate and XLA crash. All caches together are bounded in bytes as well. The eager op cache and the fused-region
# cache are LRUs by count, per op and overall; an evicted executable's jax.jit and closures
# die with it, JAX's own compile caches are weak-keyed on them, and freed heap is handed back
# to the OS (glibc keeps it otherwise, so resident memory would not show the release).

_limits = {
    "total": startup.max_executables,
    "per_op": startup.max_executables_per_op,
    "regions": startup.max_regions,
    "total_bytes": int(startup.max_executable_mb * 2**20),
}


def set_executable_limit(total: int | None = None, per_op: int | None = None,
                         regions: int | None = None, total_bytes: int | None = None) -> None:
    """Bound the executables kept: `total` eager-op executables, `per_op` per ATen op (its
    shapes), `regions` fused defer_and_fuse regions, `total_bytes` the host memory all of them
    keep together (each measured when compiled: runtime/launcher.py). Least recently used go first."""
    for name, v in (("total", total), ("per_op", per_op), ("regions", regions), ("total_bytes", total_bytes)):
        if v is not None:
            if int(v) < 1:
                raise ValueError(f"set_executable_limit: {name} must be >= 1, got {v}")
            _limits[name] = int(v)


def executable_limit() -> dict:
    return dict(_limits)


def limit(name: str) -> Callable[[], int]:
    """The bound `name` ("total", "per_op", "regions", "total_bytes") as it is when called."""
    return lambda: _limits[name]


def heap_in_use() -> int | None:
    """Bytes of the process's heap in use: what a compile adds to it is what the program it made
    keeps (its executable, once runtime/lowerings.py let JAX's lowering go), measured since
    XLA:CPU reports no code size. glibc's count of allocated bytes, which heap freed earlier and
    reused does not hide as it hides from the resident size (a bound by resident growth let the
    cache grow to twice its executables after evictions); the resident size where there is no
    glibc. None where neither can be read."""
    mallinfo = _GLIBC[1]
    if mallinfo is not None:
        info = mallinfo()
        return info.uordblks + info.hblkhd  # allocated in the arenas, and in chunks mapped apart
    try:
        import resource

        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError, ImportError):
        return None


def _glibc():
    """(glibc's malloc_trim, its mallinfo2), each None where the C library lacks it (not glibc,
    or glibc older than 2.33 for mallinfo2)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None, None
    trim = getattr(libc, "malloc_trim", None)
    mallinfo = getattr(libc, "mallinfo2", None)
    if mallinfo is not None:
        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]

        mallinfo.restype = Info
    return trim, mallinfo


_GLIBC = _glibc()  # one handle, looked up at import (a dlopen of the loaded C library)


def trim_heap() -> None:
    trim = _GLIBC[0]
    if trim is not None:  # not glibc: the allocator keeps what it keeps
        trim(0)


def evict(cache: dict, victims, lock=None) -> int:
    """Drop `victims` (keys) from `cache`; count them; give freed memory back."""
    from ..metrics import bump

    n = 0
    for k in victims:
        if lock is not None:
            with lock:
                gone = cache.pop(k, None)
        else:
            gone = cache.pop(k, None)
        n += gone is not None
    if n:
        bump("executables_evicted", n)
        import gc

        gc.collect()  # jit wrappers sit in reference cycles with their closures
        trim_heap()
    return n


def least_used(items, n: int) -> list:
    """The keys of the `n` least recently used (key, last use) items."""
    return [k for k, _ in sorted(items, key=lambda kv: kv[1])[:n]]


def is_out_of_memory(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, MemoryError) or "RESOURCE_EXHAUSTED" in text or "Cannot allocate memory" in text \
        or "Out of memory" in text or "out of memory" in text


# Host memory a compilation must find free before it starts. XLA's compiler (LLVM) does not
# fail cleanly when an allocation fails: it aborts the process (std::bad_alloc, "Cannot
# allocate memory", seen at a few thousand programs). So a compile that would start on an
# exhausted heap first gives back every cached executable, and if that is not enough raises
# torch.OutOfMemoryError instead. A floor, not a prediction of what a program needs.
COMPILE_HEADROOM_MB = startup.compile_headroom_mb


def memory_left() -> float | None:
    """Bytes this process may still allocate, the least of: the system's MemAvailable, the
    cgroup's limit less its usage, the address-space limit (RLIMIT_AS) less what is mapped.
    None when none of them can be read."""
    import resource

    left = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    left.append(int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                left.append(int(limit) - int(f.read()))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        with open("/proc/self/statm") as f:
            left.append(soft - int(f.read().split()[0]) * resource.getpagesize())
    return min(left) if left else None


# Memory mappings a compilation must find free. Each executable XLA:CPU keeps maps its code in
# a few regions of its own (3-4: 15,500 mappings at 4,000 small programs); the kernel caps a
# process's mappings (vm.max_map_count, 65,530 by default), and LLVM aborts the process when a
# mapping is refused ("LLVM ERROR: Unable to allocate section memory!", seen after ~11,000
# ModuleInfo cases in one process). Counting them reads /proc/self/maps, so it is counted every
# MAPS_EVERY compiles while far from the cap, and at each compile once near it.
MAPS_HEADROOM = 4096
MAPS_EVERY = 32
_maps = {"limit": None, "countdown": 0, "near": False}


def _map_limit() -> int | None:
    if _maps["limit"] is None:
        try:
            with open("/proc/sys/vm/max_map_count", "rb") as f:
                _maps["limit"] = int(f.read())
        except (OSError, ValueError):
            _maps["limit"] = 0
    return _maps["limit"] or None


def mappings() -> int | None:
    """The process's memory mappings (lines of /proc/self/maps); None where unreadable."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def maps_short() -> tuple[int, int] | None:
    """(mappings, the cap) when fewer than MAPS_HEADROOM mappings are left, else None."""
    limit = _map_limit()
    if limit is None:
        return None
    if not _maps["near"] and _maps["countdown"] > 0:
        _maps["countdown"] -= 1
        return None
    _maps["countdown"] = MAPS_EVERY
    n = mappings()
    if n is None:
        return None
    _maps["near"] = n > limit - 2 * MAPS_HEADROOM
    return (n, limit) if n > limit - MAPS_HEADROOM else None


def before_compile(what: str, release=()) -> None:
    """Called before a new program is compiled (see COMPILE_HEADROOM_MB and MAPS_HEADROOM);
    `release` are the caller's ways to drop its cached executables (the layers above own those
    caches)."""
    need = COMPILE_HEADROOM_MB * 2**20
    left = memory_left()
    maps = maps_short()
    if (left is None or left >= need) and maps is None:
        return
    import gc

    import jax

    for drop in release:
        drop()
    jax.clear_caches()
    gc.collect()
    trim_heap()
    left = memory_left()
    if maps is not None:
        _maps["countdown"] = 0
        maps = maps_short()
        if maps is not None:
            import torch

            from ..metrics import bump

            bump("out_of_memory")
            raise torch.OutOfMemoryError(
                f"torchtpu: out of memory mappings for the compilation of {what}: the process holds {maps[0]} "
                f"of the {maps[1]} the kernel allows (vm.max_map_count), under the {MAPS_HEADROOM} a "
                "compilation is given; XLA's compiler would abort the process. Bound the compiled-program "
                "caches with torchtpu.set_executable_limit, or raise vm.max_map_count")
    if left is not None and left < need:
        import torch

        from ..metrics import bump

        bump("out_of_memory")
        raise torch.OutOfMemoryError(
            f"torchtpu: out of memory for the compilation of {what}: {left / 2**20:.0f} MB of host memory "
            f"left, under the {COMPILE_HEADROOM_MB:.0f} MB a compilation is given "
            "(TORCHTPU_COMPILE_HEADROOM_MB); XLA's compiler would abort the process. Free tensors you no "
            "longer need, or bound the compiled-program caches with torchtpu.set_executable_limit")


def out_of_memory(err: BaseException, what: str, released: int = 0):
    """What CUDA raises when device memory runs out, torch.OutOfMemoryError (a RuntimeError
    that `except torch.OutOfMemoryError` catches), naming what ran and carrying XLA's text;
    counted in torch.tpu.memory_stats()["num_ooms"]. Compiling or running one program failed,
    nothing was written: the process, and every tensor the program did not write, go on."""
    import torch

    from ..metrics import bump

    if isinstance(err, torch.OutOfMemoryError):  # said already (before_compile), by us
        return err
    bump("out_of_memory")
    gave = f"; released {released} cached executables (bound them with torchtpu.set_executable_limit)" \
        if released else ""
    return torch.OutOfMemoryError(f"torchtpu: out of memory running {what}{gave}: {err}")
# ---- every module-level cache, bounded and registered ----------------------------------------
#
# A cache a module keeps for the life of the process grows with the shapes, signatures and
# scalars a program shows it; unbounded, a long sweep (the OpInfo suite) grew by gigabytes.
# Each one is bounded (LRU by count, or its own eviction as the executable caches above) and
# registered here under a name, so torchtpu.clear_caches() empties them all and a test can
# check that it does.


class LRU(OrderedDict):
    """A dict of at most `maxsize` entries: storing a new key past it drops the least recently
    used; get() and storing count as a use. `maxsize` may be a callable (a limit read when
    storing, so set_executable_limit applies at once)."""

    def __init__(self, maxsize: "int | Callable[[], int]"):
        super().__init__()
        self._maxsize = maxsize

    @property
    def maxsize(self) -> int:
        return self._maxsize() if callable(self._maxsize) else self._maxsize

    def get(self, key, default=None):
        try:  # one step, so a racing eviction is a miss rather than a KeyError
            self.move_to_end(key)
            return super().__getitem__(key)
        except KeyError:
            return default

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        limit = self.maxsize
        while len(self) > limit:
            self.popitem(last=False)


class LRUSet:
    """A set of at most `maxsize` members, the least recently added or seen dropped first."""

    def __init__(self, maxsize: "int | Callable[[], int]"):
        self._items = LRU(maxsize)

    def add(self, item) -> None:
        self._items[item] = None

    def update(self, items) -> None:
        for item in items:
            self._items[item] = None

    def discard(self, item) -> None:
        self._items.pop(item, None)

    def __contains__(self, item) -> bool:
        return item in self._items

    @property
    def members(self) -> dict:
        """The members as the keys of a dict, the same object for the set's life (read
        without a Python call: csrc/record.h's membership test)."""
        return self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(list(self._items))

    def clear(self) -> None:
        self._items.clear()


_registry: dict[str, tuple[Callable[[], int], Callable[[], None]]] = {}


def register(name: str, cache: Any = None, *, size: "Callable[[], int] | None" = None,
             clear: "Callable[[], None] | None" = None) -> Any:
    """Enter `cache` (anything with len() and clear(), or an functools.lru_cache function) as
    `name`, so clear_registered() empties it; returns it, for `_x = register("x", LRU(n))`."""
    if hasattr(cache, "cache_clear"):  # a functools.lru_cache function
        size = size or (lambda: cache.cache_info().currsize)
        clear = clear or cache.cache_clear
    _registry[name] = (size or (lambda: len(cache)), clear or cache.clear)
    return cache


def sizes() -> dict[str, int]:
    """Entries held by each registered cache."""
    return {name: size() for name, (size, _) in _registry.items()}


def clear_registered() -> None:
    for _, clear in _registry.values():
        clear()
