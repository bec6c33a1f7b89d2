"""What defer_and_fuse records: the interface an op's executable offers a region.

deferred.record() takes any executable that traces into a region's program and can
also run on its own (a replayed region runs its nodes one by one): an ATen op's
(eager/op_program.Compiled), a traced higher-order op's (eager/control_flow.py), a
collective's (distributed/fused.py). These Protocols say what it reads of them.
"""
from __future__ import annotations

from typing import Callable, Hashable, Protocol, Sequence

from .. import metrics


class RecordedOp(Protocol):
    """The op's identity (an ops.registry.Lowering satisfies it)."""

    name: str      # as errors and the profiler name it ("mul.Tensor")
    mode: str      # "inplace": its program writes storages (`updated`) instead of returning outputs
    random: bool   # takes an RNG key: the region passes one per random node


class Recordable(Protocol):
    """One op signature's executable."""

    # (bufs, scalars, rngdata) -> (flat outputs, {storage slot: new buffer}), traced
    # inside the region's program; bufs[i] is None for a storage never written
    program: Callable
    # (shape, torch dtype) of each functional output, None for one not asked for
    outs: Sequence
    # the storage slots an in-place op writes (known before recording)
    updated: tuple
    # the standalone jitted executable, (bufs, packed scalars, rngdata) ->
    # (outs, updated[, check flags]); `fn.codes` is its scalars' layout (eager/scalars.py)
    fn: Callable
    checks: tuple  # the device-side checks its program declares (ops/checks.py)
    ran: bool      # fn has run (so XLA compiled it)

    def shape_free_key(self) -> Hashable:
        """The signature without sizes, strides and offsets (the compile-storm guard)."""


def count_run(compiled: Recordable) -> None:
    """Count one run of an op's own executable: its first run compiled it."""
    if compiled.ran:
        metrics.bump("cache_hits")
    else:
        compiled.ran = True
        metrics.bump("compiles")
