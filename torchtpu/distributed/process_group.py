"""The c10d ProcessGroup "tpu": one XLA device per process; collectives are XLA programs.

Each collective ("skinny") is a jitted shard_map program over a mesh of the group's
devices, cached per (collective, static arguments) and, by jit, per shape/dtype; the
c10d methods themselves are in collectives.py and p2p.py. Dispatch is asynchronous like
every torchtpu op; later ops are ordered by data dependence. Every launch is matched
across ranks first (agreement.py) and watched until it completes (watchdog.py).
Fused regions (fused.py) and compiled graphs use the public methods: `launch`,
`launch_watched`, `agreement`, `recording_allowed`, `mesh_and_sharding`,
`check_program`.
"""
from __future__ import annotations

import datetime
import time

import jax
import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from torch._C._distributed_c10d import _create_work_from_future

from .. import config
from ..eager import deferred
from ..spmd.mesh import AXIS
from .agreement import Agreement, shape_str
from .bringup import device_of
from .collectives import CollectiveOps
from .p2p import PointToPoint
from .watchdog import TpuDistError, watchdog


class TpuProcessGroup(CollectiveOps, PointToPoint, dist.ProcessGroup):
    """A process group over one XLA device per process; collectives are XLA programs."""

    def __init__(self, rank: int, size: int, global_ranks, timeout: datetime.timedelta, name: str = "",
                 store=None):
        super().__init__(rank, size)
        checked = store is not None and size > 1 and config.read("dist_check")
        grace = min(config.read("dist_check_grace"), timeout.total_seconds())
        self._agreement = (Agreement(store, rank, size, grace, timeout.total_seconds(), self.getGroupName)
                           if checked else None)
        self._rank = rank
        self._size = size
        self._global_ranks = list(global_ranks)
        self._timeout = timeout.total_seconds()
        self._label = name
        self._seq = 0
        self._mesh = None
        self._sharding = None
        self._fns: dict = {}
        self._pair_meshes: dict = {}
        self._exes: dict = {}  # (program key, mesh, input avals) -> compiled executable
        self._p2p: list = []  # queued (kind, peer, tensor, flat value for sends)

    # -- identity
    def getBackendName(self) -> str:
        return "tpu"

    # this Python process group is its own backend for every device type
    def _get_backend(self, device=None):
        return self

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_coalescing(self) -> bool:
        return False

    # old-style coalescing: the collectives inside run one by one as they are issued
    def _start_coalescing(self, device=None) -> None:
        pass

    def _end_coalescing(self, device=None):
        self._flush_p2p()
        return self._work(None)

    # a Python process group keeps its own name (the C++ base asks its backends for it)
    def setGroupName(self, name) -> None:
        self._group_name = name

    def getGroupName(self):
        return getattr(self, "_group_name", self._label)

    def setGroupDesc(self, desc) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self._rank}, size={self._size}, ranks={self._global_ranks})"

    # -- what SPMD programs need of the group (spmd.mesh.SpmdGroup) and fused regions use
    def mesh_and_sharding(self):
        if self._mesh is None:
            devs = [device_of(r) for r in self._global_ranks]
            self._mesh = Mesh(np.array(devs), (AXIS,))
            self._sharding = NamedSharding(self._mesh, P(AXIS))
        return self._mesh, self._sharding

    def check_program(self, what: str, digest: str) -> None:
        """Before a compiled SPMD program first runs: every rank must run the same
        collectives (a rank-dependent branch in compiled code compiles another graph)."""
        if self._agreement is not None:  # None: TORCHTPU_DIST_CHECK=0
            self._agreement.check_program(what, digest)

    @property
    def agreement(self) -> Agreement | None:
        """The group's cross-rank signature protocol; None when checks are off or size 1."""
        return self._agreement

    @property
    def recording_allowed(self) -> bool:
        """Whether a collective of this group may join a fused region now: more than one
        rank, and no queued point-to-point message that must run before it."""
        return self._size > 1 and not self._p2p

    def launch_watched(self, what: str, fn, *args):
        """Launch a program with collectives built elsewhere (a fused region) and hand its
        outputs to the watchdog: a peer that dies mid-program ends in a timeout error."""
        wd = watchdog()
        self._seq += 1
        desc = f"{what} (rank {self._rank} of {self._size}, seq {self._seq})"
        wd.dispatching = (desc, time.monotonic(), self._timeout, None)
        try:
            results = fn(*args)
        finally:
            wd.dispatching = None
        wd.add(desc, list(results), self._timeout)
        return results

    # -- running a collective program
    def _program(self, key, make_body, n_in: int, mesh=None):
        fn = self._fns.get(key)
        if fn is None:
            mesh = mesh or self.mesh_and_sharding()[0]
            sm = jax.shard_map(make_body(), mesh=mesh, in_specs=(P(AXIS),) * n_in, out_specs=P(AXIS),
                               check_vma=False)
            fn = self._fns[key] = jax.jit(sm)
        return fn

    def launch(self, name: str, key, make_body, flats, ts, mesh=None, sharding=None, width=None):
        """Run a collective program on this rank's flat blocks; returns this rank's out blocks.

        `key` names the program (with `make_body()` building its body, spmd/bodies.py);
        `ts` are the tensors it reads, for messages; `mesh`/`sharding`/`width` a pair's
        mesh for point-to-point (not matched across the group)."""
        wd = watchdog()
        wd.check()
        deferred.flush_collectives("collective")
        if self._p2p and mesh is None:
            self._flush_p2p()  # queued point-to-point messages go first, in program order
        self._seq += 1
        desc = (f"collective {name} (rank {self._rank} of {self._size}, seq {self._seq}, "
                f"tensors [{shape_str(ts)}])")
        verify = info = None
        if mesh is None:
            mesh, sharding = self.mesh_and_sharding()
            if self._agreement is not None:
                verify, info = self._agreement.match(name, key, flats, ts, desc)
        w = width or self._size
        fn = self._program(key, make_body, len(flats), mesh)
        glob = [jax.make_array_from_single_device_arrays((w * f.shape[0],), sharding, [f]) for f in flats]
        # compiled ahead of time, so that the watched launch below is only the launch
        sig = (key, id(mesh), tuple((f.shape, f.dtype) for f in flats))
        exe = self._exes.get(sig)
        if exe is None:
            exe = self._exes[sig] = fn.lower(*glob).compile()
        # a launch can itself block (XLA:CPU runs a first call inline): watch it too
        wd.dispatching = (desc, time.monotonic(), self._timeout, info)
        try:
            outs = exe(*glob)
        except Exception as e:
            msg = f"torchtpu.distributed: {desc} failed: {str(e).strip()}"
            wd.fail(msg)  # ends the process unless TORCHTPU_DIST_ABORT=0
            raise TpuDistError(msg) from e
        finally:
            wd.dispatching = None
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        local = [o.addressable_data(0) for o in outs]
        wd.add(desc, local, self._timeout, verify, info)
        return local

    def _work(self, result, block: bool = False):
        if block:
            watchdog().drain()
        fut = torch.futures.Future()
        fut.set_result(result)
        return _create_work_from_future(fut)

    # -- lifecycle
    def abort(self):
        pass

    def shutdown(self):
        pass
