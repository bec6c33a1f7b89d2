"""The c10d backend "tpu": the creator torch.distributed calls for each new group.

The package is split by concern: bringup.py (the XLA multi-process runtime),
watchdog.py (failed or hung collectives end the process), agreement.py (ranks issue
the same collectives), flat_buffers.py (tensors as flat blocks), collectives.py and
p2p.py (the c10d methods), process_group.py (TpuProcessGroup), fused.py (collectives
inside defer_and_fuse regions). The collective bodies themselves are in spmd/, shared
with compiled graphs and fused regions.
"""
from __future__ import annotations

from . import bringup, fused
from .process_group import TpuProcessGroup
from .watchdog import TpuDistError

__all__ = ["create", "TpuProcessGroup", "TpuDistError"]


def create(backend_opts, pg_options=None) -> TpuProcessGroup:
    """The c10d creator (extended API): brings up the XLA runtime on the first call."""
    rank, size = backend_opts.group_rank, backend_opts.group_size
    ranks = list(backend_opts.global_ranks_in_group) or list(range(size))
    timeout = backend_opts.timeout
    if not bringup.is_up():
        # the first group is the default (world) group: its ranks are the global ranks
        bringup.bring_up(backend_opts.store, rank, size, timeout)
    fused.install()
    return TpuProcessGroup(rank, size, ranks, timeout, name=str(backend_opts.group_id), store=backend_opts.store)
