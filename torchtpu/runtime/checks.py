"""Pending device-side check flags, checked at the next host read.

Every program whose lowerings declared checks (ops/checks.py) returns one packed int64
flag array. It is kept here as a device array, unread: no host round trip per op, as
with CUDA's device asserts. The next host read (`.item()`, `.cpu()`, printing,
`torch.tpu.synchronize()`) reads the pending flags and, if one tripped, raises the
error CPU PyTorch would have raised (its exception class and message, the op and the
user's line). In debug mode the executor checks right after each op.

After an error the process keeps working: the pending list is emptied, the storages
the failed program wrote (and nothing else) are marked lost, so reading them raises a
clear error instead of returning the clamped values XLA computed.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from .. import metrics
from . import inflight
from .pending import Failed

# The flag array's layout: one row per check, (tripped, first offending value, a second
# value); ops/checks.py packs it, this module reads it.
ROW = 3

# Past this many unread flag arrays the finished ones are read (non-blocking), so a loop
# that never reads the host keeps a bounded list; a tripped one waits for the next read.
_DRAIN_AT = 256

_lock = threading.Lock()
_pending: list = []  # [(flags, checks, where, writes)] in issue order
_tripped: list = []  # errors found while draining, raised at the next host read


class _Record:
    __slots__ = ("flags", "checks", "where", "writes")

    def __init__(self, flags, checks, where, writes):
        self.flags = flags  # the packed jax int64 array: ROW values per check
        self.checks = checks  # [ops.checks.Check]
        self.where = where  # str, or a list of strs indexed by Check.node (a region's lines)
        self.writes = writes  # [(weakref(storage entry), weakref(buffer it got))]


def add(flags, checks, where=None, writes=()) -> None:
    """Keep a program's packed flags until the next host read. `writes` are the
    (entry, buffer) pairs the program produced, lost if a flag trips."""
    if flags is None or not checks:
        return
    rec = _Record(flags, checks, where, [(weakref.ref(e), weakref.ref(b)) for e, b in writes
                                         if b is not None and not isinstance(b, (int, tuple))])
    with _lock:
        _pending.append(rec)
        n = len(_pending)
    metrics.bump("checks_pending")
    if n >= _DRAIN_AT:
        _drain()


def _drain() -> None:
    """Read the finished flag arrays without blocking; keep errors for the next read."""
    with _lock:
        keep = []
        done = []
        for r in _pending:
            (done if inflight.ready(r.flags) else keep).append(r)
        if len(keep) >= 4 * _DRAIN_AT:  # the device is far behind: wait for the oldest
            done.extend(keep[:_DRAIN_AT])
            keep = keep[_DRAIN_AT:]
        _pending[:] = keep
    for r in done:
        err = _error_of(r)
        if err is not None:
            _tripped.append(err)


def _where_of(rec: _Record, check) -> str | None:
    w = rec.where
    if isinstance(w, list):  # a region's nodes' (file, line, function)
        if check.node is None or not 0 <= check.node < len(w):
            return None
        w = w[check.node]
    if isinstance(w, tuple):
        return f"{w[0]}:{w[1]} in {w[2]}"
    return w


def _error_of(rec: _Record) -> BaseException | None:
    rows = np.asarray(rec.flags).reshape(-1, ROW)
    bad = np.nonzero(rows[:, 0])[0]
    if not len(bad):
        return None
    i = int(bad[0])
    check = rec.checks[i] if i < len(rec.checks) else rec.checks[-1]
    err = check.error(int(rows[i, 1]), int(rows[i, 2]), _where_of(rec, check))
    metrics.bump("checks_failed")
    _lose(rec, err)
    return err


def _lose(rec: _Record, err: BaseException) -> None:
    for er, br in rec.writes:
        e, b = er(), br()
        if e is not None and b is not None and e.buf is b:
            e.buf = Failed(err)


def raise_pending() -> None:
    """Check every pending flag (blocking on the programs that made them) and raise the
    first violation in issue order, as CPU would have raised it."""
    if not _pending and not _tripped:
        return
    with _lock:
        records = list(_pending)
        _pending.clear()
    errors = list(_tripped)
    _tripped.clear()
    for r in records:
        err = _error_of(r)
        if err is not None:
            errors.append(err)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"torchtpu: {len(errors) - 1} more device-side check(s) failed since the last host read")
        raise first


def clear() -> None:
    """Forget pending flags without reading them (checks turned off)."""
    with _lock:
        _pending.clear()
    _tripped.clear()


def outstanding() -> bool:
    """Whether flags are waiting to be read or an error to be raised (a host read drains them)."""
    return bool(_pending or _tripped)


def pending() -> int:
    return len(_pending)
