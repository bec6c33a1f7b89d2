"""The hook through which defer_and_fuse runs regions that hold collectives.

eager/deferred records collectives into a region like any op, but whether the ranks
agree on the region and how its launch is watched belong to the process group, which
sits above eager. So distributed/ installs a runner
(`eager.deferred.set_collective_region_runner`) when its first group comes up, and
deferred calls it; this Protocol is the contract between them.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from .mesh import Context


class CollectiveRegionRunner(Protocol):
    def agree(self, ctx: Context, fkey, nodes: Sequence) -> bool:
        """Whether every rank of `ctx.group` fused this region (signature `fkey`, recorded
        `nodes`) around the same collectives. False: every rank replays it op by op."""

    def run(self, ctx: Context, fkey, nodes: Sequence, fn, args) -> tuple:
        """Launch the region's SPMD executable `fn(*args)` and return its results, watched
        like any collective (a peer that dies mid-program ends in an error, not a hang)."""
