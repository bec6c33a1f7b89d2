"""Device-side checks: a lowering declares what CPU PyTorch would reject in its data.

CPU kernels raise on an out-of-range index or an integer division by zero; a compiled
XLA program cannot raise, so (like CUDA's device asserts) a lowering computes a small
violation flag next to its result:

    @lower("gather")
    def gather(self, dim, index, sparse_grad=False):
        checks.index_in_range(index, self.shape[dim], dim, exc=RuntimeError)
        ...

Flags are collected while the program is traced, by whoever traces it (a strict op's
jit, a fused region, a compiled graph): `collect()` gathers every flag reported inside
it and packs them into one int64 array, returned as one extra program output. The
`Check`s (exception class, message builder, op name, issuing line) stay on the host,
learned at trace time, and turn a tripped row back into the error CPU would raise
(runtime/checks.py does that at the next host read). Outside a `collect()` (checks
off, or a helper jit) reporting is a no-op and the lowering keeps XLA's semantics.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

import jax.numpy as jnp

from ..config import startup
from ..runtime.checks import ROW  # one row per check: its layout is the reader's (runtime/checks)

enabled_cell = [startup.checks]
_tls = threading.local()  # the collector of the trace in progress on this thread


def enabled() -> bool:
    return enabled_cell[0]


def set_enabled(flag: bool) -> None:
    enabled_cell[0] = bool(flag)


class Check:
    """One declared check, static: what to raise when its row trips."""

    __slots__ = ("exc", "message", "op", "where", "node")

    def __init__(self, exc, message, op, where, node):
        self.exc = exc
        self.message = message  # (v0, v1) -> CPU's message text
        self.op = op  # the ATen op (or graph node) that declared it
        self.where = where  # the user's line, when known at trace time (compiled graphs)
        self.node = node  # index of the region node that declared it (fused regions)

    def error(self, v0: int, v1: int, where: str | None = None) -> BaseException:
        msg = self.message(v0, v1) if callable(self.message) else str(self.message)
        where = where or self.where
        at = f", issued at {where}" if where else ""
        return self.exc(f"{msg} (torchtpu device-side check in {self.op}{at})")


class Collector:
    __slots__ = ("rows", "checks", "op", "where", "node")

    def __init__(self):
        self.rows: list = []
        self.checks: list[Check] = []
        self.op = None
        self.where = None
        self.node = None

    def packed(self):
        """Every row as one flat int64 array (flat: an SPMD program's outputs are 1-D
        blocks, one per rank), or None when nothing was declared."""
        if not self.rows:
            return None
        return jnp.concatenate(self.rows)


@contextlib.contextmanager
def collect():
    """Collect the checks reported while tracing the block (None when checks are off)."""
    if not enabled_cell[0]:
        yield None
        return
    prev = getattr(_tls, "c", None)
    c = _tls.c = Collector()
    try:
        yield c
    finally:
        _tls.c = prev


def active() -> Collector | None:
    return getattr(_tls, "c", None)


@contextlib.contextmanager
def scope(op: str, where: str | None = None, node: int | None = None):
    """Name the op (and, when known, its user line / region node) the checks reported
    inside the block belong to."""
    c = getattr(_tls, "c", None)
    if c is None:
        yield
        return
    saved = (c.op, c.where, c.node)
    c.op = op
    if where is not None:
        c.where = where
    if node is not None:
        c.node = node
    try:
        yield
    finally:
        c.op, c.where, c.node = saved


def report(bad, v0=0, v1=0, *, exc=RuntimeError, message: Callable | str, op: str | None = None) -> None:
    """Declare that the program is invalid where the bool `bad` is true: CPU raises
    `exc(message(v0, v1))`. v0/v1 are the first offending values (integer scalars)."""
    c = getattr(_tls, "c", None)
    if c is None:
        return
    bad = jnp.any(jnp.asarray(bad))
    row = jnp.stack([bad.astype(jnp.int64), jnp.asarray(v0).astype(jnp.int64).reshape(()),
                     jnp.asarray(v1).astype(jnp.int64).reshape(())])
    c.rows.append(row)
    c.checks.append(Check(exc, message, op or c.op or "?", c.where, c.node))


def absorb(found: list, packed) -> None:
    """Rows a control-flow construct carried out of its branch or body (`packed` as
    `Collector.packed` packs them, `found` their Checks) join the collector of the program
    being traced, attributed to the node that holds the construct when they name none."""
    c = getattr(_tls, "c", None)
    if c is None or not found:
        return
    for i, chk in enumerate(found):
        c.rows.append(packed[ROW * i: ROW * (i + 1)])
        c.checks.append(Check(chk.exc, chk.message, chk.op, chk.where or c.where,
                              c.node if chk.node is None else chk.node))


def keep_first(old, new):
    """Two packed flag arrays of the same checks merged row by row, keeping the row that
    tripped first: a loop reports its earliest failing iteration, as CPU raises there."""
    o, n = old.reshape(-1, ROW), new.reshape(-1, ROW)
    return jnp.where(o[:, :1] != 0, o, n).reshape(-1)


def first(mask, values):
    """The first element of `values` (flattened) where `mask` holds (0 if none)."""
    m = jnp.asarray(mask).reshape(-1)
    if m.size == 0:
        return jnp.zeros((), jnp.int64)
    v = jnp.broadcast_to(jnp.asarray(values), jnp.shape(mask)).reshape(-1)
    return v[jnp.argmax(m)]


def index_in_range(index, size: int, dim: int = 0, *, negative: bool = False, exc=IndexError,
                   message: Callable | str | None = None) -> None:
    """Every value of `index` addresses one of `size` positions (negative ones from the
    end when `negative`); CPU's "index 5 is out of bounds for dimension 0 with size 3"."""
    if active() is None:
        return
    index = jnp.asarray(index)
    if index.size == 0:
        return
    lo = -size if negative else 0
    bad = (index < lo) | (index >= size)
    if message is None:
        def message(v, n):  # (size may be a runtime value: a dynamic dim's true size)
            return f"index {v} is out of bounds for dimension {dim} with size {n}"
    report(jnp.any(bad), first(bad, index), size, exc=exc, message=message)
