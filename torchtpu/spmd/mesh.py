"""The group a SPMD program runs over: its mesh axis, what the program needs of the group,
and the context a graph's or a region's collectives carry.

torchtpu.distributed's process group is the one implementation of `SpmdGroup`; compiled
graphs and fused regions only see this interface, so they never import distributed/.
"""
from __future__ import annotations

from typing import Protocol

import torch

AXIS = "r"  # the mesh axis of every process-group program: one XLA device per rank


class SpmdGroup(Protocol):
    """What a SPMD program needs of its process group."""

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def mesh_and_sharding(self):
        """(jax Mesh over the group's devices along AXIS, NamedSharding P(AXIS) on it)."""

    def check_program(self, what: str, digest: str) -> None:
        """Before a new program with collectives first runs: raise unless every rank is
        about to run one with the same collectives (`digest`; `what` names them)."""


def _is_spmd_group(x) -> bool:
    # hasattr, not isinstance(x, a runtime_checkable Protocol): this runs for every
    # functional collective recorded in a region, and the Protocol check is far slower
    return hasattr(x, "mesh_and_sharding") and hasattr(x, "check_program")


def tpu_group(name: str) -> SpmdGroup | None:
    """The torchtpu process group behind a c10d group name, or None."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = _resolve_process_group(name)
    if _is_spmd_group(pg):
        return pg
    try:
        backend = pg._get_backend(torch.device("tpu"))
    except Exception:
        return None
    return backend if _is_spmd_group(backend) else None


class Context:
    """What a graph's collectives run over: the group, its size, its mesh; for a compiled
    graph also what its collectives are (checked across ranks before its first run)."""

    def __init__(self, group: SpmdGroup, what: str = "", digest: str = ""):
        self.group = group
        self.size = group.size()
        self.mesh, self.sharding = group.mesh_and_sharding()
        self.what = what
        self.digest = digest
