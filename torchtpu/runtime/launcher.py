"""Launching one jitted program: the part every executor shares.

Strict ops (eager/executor.py), fused regions (eager/deferred.py) and compiled graphs
(compile/runtime.py) launch their programs the same way: a call that compiles first makes sure
the heap has room (XLA's compiler aborts the process on an exhausted heap: cache.before_compile),
the call is timed for torch.profiler (program_timing), and running out of memory, compiling or
running, becomes torch.OutOfMemoryError naming what ran (cache.out_of_memory). The callers keep
what differs between them: their keys and caches, commits, and what a failure leaves behind.
"""
from __future__ import annotations

from typing import Any, Callable

from torch.autograd import profiler as _tprof

from . import cache, lowerings, program_timing


def launch(fn: Callable, args: tuple, what: Callable[[], str], compiling: bool,
           release: tuple = (), released: Callable[[], int] | None = None,
           timing: str | Callable[[], str] | None = None, account: tuple | None = None,
           compiled: Callable[[], None] | None = None) -> Any:
    """`fn(*args)`.

    what:      names the program for errors (called only when one is raised or a compile
               finds the heap short)
    compiling: this call compiles the program (JAX compiles inside the first call)
    release:   the caller's ways to drop its cached executables before a compile on a short heap
    released:  on out-of-memory, gives back the caller's cached executables; how many
    timing:    the program's name in the profiler (default: `what`)
    account:   (an executables.Executables cache, the program's key in it): a compiling call
               charges the program with the host memory its compile kept (the bound in bytes)
    compiled:  called after a compiling call, while JAX still holds the program's lowering
               (runtime/direct.py plans from it; shed() then drops it)
    """
    if compiling:
        cache.before_compile(what(), release)
        before = cache.heap_in_use() if account is not None else None
    t0 = _tprof._is_profiler_enabled and program_timing.start()  # nonzero only under torch.profiler
    try:
        out = fn(*args)
    except Exception as err:
        if cache.is_out_of_memory(err):
            raise cache.out_of_memory(err, what(), released() if released is not None else 0) from err
        raise
    if compiling:
        if compiled is not None:
            compiled()
        lowerings.shed()  # the executable stays in the jit's C++ cache; its lowering goes
        after = cache.heap_in_use() if before is not None else None
        if after is not None and _warm[0]:
            account[0].sized(account[1], after - before)
        _warm[0] = True
    if t0:
        name = timing if isinstance(timing, str) else (timing or what)()
        program_timing.ran(name, out, t0, compiling)
    return out


# The process's first compile also starts XLA's compiler (its LLVM and thread pools), which no
# executable keeps: it charges nothing.
_warm = [False]
