"""When each device program ran, while torch's profiler is on (see device/profiler.py).

The executors call start() before dispatching a program and ran() after; both cost
one flag check when nobody profiles. A waiter thread blocks on each program's
outputs in dispatch order and stamps when they are ready: a program's device
interval runs from when it could start (its dispatch began, or the previous program
finished, whichever is later) to when its outputs were ready. (On XLA:CPU a small
program may run inside the dispatch call; its interval then spans that call.) While
profiling, the waiter holds each program's outputs until they are ready, so a buffer
dispatched a moment ago is not donated to the next in-place op then.
"""
from __future__ import annotations

import queue
import threading
import time

from torch.autograd import profiler as _tprof


class _Record:
    __slots__ = ("name", "t0", "start", "end", "buf", "compiled")

    def __init__(self, name, t0, buf, compiled):
        self.name = name
        self.t0 = t0
        self.buf = buf
        self.compiled = compiled  # its first run: the interval includes XLA's compile
        self.start = self.end = None


_lock = threading.Lock()
_records: list[_Record] = []
_queue: queue.Queue = queue.Queue()
_thread = None
_last_end = [0]


def start() -> int:
    """Called before a program is dispatched: the time, or 0 when nobody profiles."""
    return time.time_ns() if _tprof._is_profiler_enabled else 0


def _first_array(outs):
    if isinstance(outs, dict):
        outs = outs.values()
    if hasattr(outs, "is_ready"):
        return outs
    if isinstance(outs, (list, tuple)) or hasattr(outs, "__iter__"):
        for o in outs:
            b = _first_array(o) if isinstance(o, (list, tuple, dict)) else o
            if hasattr(b, "is_ready"):
                return b
    return None


def ran(name: str, outs, t0: int, compiled: bool = False) -> None:
    """A program named `name`, dispatched at `t0` (from start()), returned `outs`;
    `compiled`: this call compiled it (jax compiles inside the first call)."""
    if not t0:
        return
    global _thread
    rec = _Record(_pretty(name), t0, _first_array(outs), compiled)
    with _lock:
        _records.append(rec)
        if _thread is None:
            _thread = threading.Thread(target=_wait_loop, name="torchtpu-profiler", daemon=True)
            _thread.start()
    _queue.put(rec)


def _pretty(name: str) -> str:
    """ATen overload names as the profiler writes them ("mm.default" -> "aten::mm")."""
    if "::" in name or " " in name:
        return name
    base = name.split(".")[0]
    return f"aten::{base}"


def region_name(op_names) -> str:
    seen = dict.fromkeys(_pretty(n) for n in op_names)
    names = list(seen)
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"tpu region ({len(op_names)} ops: {shown})"


def _wait_loop():
    while True:
        rec = _queue.get()
        buf, rec.buf = rec.buf, None
        if buf is not None:
            try:
                buf.block_until_ready()
            except Exception:  # donated to the next program: it finished before that one ran
                pass
        del buf
        end = time.time_ns()
        with _lock:
            rec.start = max(rec.t0, _last_end[0])
            rec.end = max(end, rec.start)
            _last_end[0] = rec.end
        _queue.task_done()


def take() -> list[_Record]:
    """Every finished record so far, oldest first (waits for the programs to finish)."""
    _queue.join()
    with _lock:
        got = [r for r in _records if r.end is not None]
        _records.clear()
    return got
