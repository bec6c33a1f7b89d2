"""Point-to-point messages of the process group "tpu" (a mixin of TpuProcessGroup).

isend/irecv are queued and run when one of their Works is waited on (dist.send and
dist.recv wait at once), or before the next collective. The queue is run as one
2-device program per peer, pairs taken in (lower rank, higher rank) order, each
program carrying every queued message of that pair in both directions, matched in
issue order per direction (as MPI matches). So a ring exchange issued as
[isend(next), irecv(prev)] on every rank (batch_isend_irecv) cannot deadlock.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..spmd.bodies import body_p2p
from ..spmd.mesh import AXIS
from .bringup import device_of
from .flat_buffers import flat_in, store, zeros


class PointToPoint:
    """send/recv of TpuProcessGroup: needs `launch`, `_p2p`, `_rank`, `_global_ranks`,
    `_pair_meshes` from it."""

    def send(self, tensors, dstRank, tag=0):
        (t,) = tensors
        self._p2p.append(("send", dstRank, t, flat_in(t) if t.numel() else None))
        return _P2PWork(self, [t])

    def recv(self, tensors, srcRank, tag=0):
        (t,) = tensors
        self._p2p.append(("recv", srcRank, t, None))
        return _P2PWork(self, [t])

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("torchtpu.distributed: recv from any source is not supported; name the source rank")

    def _pair_mesh(self, lo: int, hi: int):
        ms = self._pair_meshes.get((lo, hi))
        if ms is None:
            mesh = Mesh(np.array([device_of(self._global_ranks[lo]), device_of(self._global_ranks[hi])]), (AXIS,))
            ms = self._pair_meshes[(lo, hi)] = (mesh, NamedSharding(mesh, P(AXIS)))
        return ms

    def _flush_p2p(self) -> None:
        if not self._p2p:
            return
        pending, self._p2p = self._p2p, []
        me = self._rank
        for peer in sorted({op[1] for op in pending}):
            ops = [op for op in pending if op[1] == peer and op[2].numel()]
            if not ops:
                continue
            lo, hi = min(me, peer), max(me, peer)
            sends = [op for op in ops if op[0] == "send"]
            recvs = [op for op in ops if op[0] == "recv"]
            # slots of lo->hi first, then hi->lo; each slot: (direction, numel, dtype)
            up, down = (sends, recvs) if me == lo else (recvs, sends)
            slots = [(0, op[2].numel(), str(op[2].dtype)) for op in up] + [(1, op[2].numel(), str(op[2].dtype))
                                                                         for op in down]
            flats = []
            for op in up + down:
                if op[0] == "send":
                    flats.append(op[3])
                else:
                    flats.append(zeros(op[2].numel(), op[2].dtype))
            mesh, sh = self._pair_mesh(lo, hi)
            dirs = tuple(d for d, _, _ in slots)
            desc = f"P2P(with rank {peer}: {len(sends)} send, {len(recvs)} recv)"
            outs = self.launch(desc, ("p2p", lo, hi, dirs), lambda: body_p2p(dirs), flats,
                               [op[2] for op in up + down], mesh=mesh, sharding=sh, width=2)
            for op, o in zip(up + down, outs):
                if op[0] == "recv":
                    store(op[2], o)


class _P2PWork(dist._Work):
    """A queued send/recv: waiting runs the process group's queued point-to-point messages."""

    def __init__(self, pg, tensors):
        super().__init__()
        self._pg = pg
        self._tensors = tensors

    def wait(self, timeout=None):
        self._pg._flush_p2p()
        return True

    def is_completed(self):
        return not self._pg._p2p

    def get_future(self):
        self._pg._flush_p2p()
        fut = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut
