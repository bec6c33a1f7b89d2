"""The c10d collective methods of the process group "tpu" (a mixin of TpuProcessGroup).

Each method turns its tensors into flat blocks (flat_buffers.py), runs the collective's
program through the group's `launch` (matched across ranks, watched) and writes the
blocks back. In defer_and_fuse, the collectives a region can hold (DDP's bucket
all-reduce, FSDP2's all-gather and reduce-scatter, broadcast) are recorded into it
instead (fused.py). They need of the group: `launch`, `_work`, `_rank`, `_size`,
`_flush_p2p`.

Which reduce op goes with which dtype is decided in one place, spmd/reduce.py. A
PREMUL_SUM collective (FSDP2's gradient divide factor) passes its factor to the program
as one more input, a one-element block: `_factor_block` for a launch, `_factor_tensor`
for a fused region (a tpu factor tensor stays on the device, never read on the host).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import cache as _caches
from ..runtime import jaxenv, tensors
from ..spmd.bodies import (body_allgather, body_allreduce, body_alltoall, body_broadcast, body_reduce_scatter,
                           body_scatter, pad_chunks, unpad_chunks)
from ..spmd.reduce import ReduceOp, premul_factor, reduce_kind
from . import fused
from .flat_buffers import dtype_of, flat_in, store, zeros


@functools.lru_cache(maxsize=64)
def _constant_block(value: float, dtype_name: str) -> jax.Array:
    # a Python factor, rounded once to the collective's dtype (NCCL's scalar is of it)
    return jax.device_put(np.asarray([value]).astype(jnp.dtype(dtype_name)), jaxenv.device())


_caches.register("premul_sum factors", _constant_block)


def _factor_block(op, kind: str, dtype, what: str) -> list:
    """[the factor as a one-element block] for a PREMUL_SUM launch, [] for other kinds."""
    if kind != "premul_sum":
        return []
    f = premul_factor(op, what)
    if isinstance(f, torch.Tensor):
        return [flat_in(f).reshape(1)]
    return [_constant_block(float(f), jnp.dtype(dtype).name)]


def _factor_tensor(op, kind: str, dtype: torch.dtype, what: str) -> list:
    """[the factor as a tpu tensor] for a PREMUL_SUM recorded into a fused region."""
    if kind != "premul_sum":
        return []
    f = premul_factor(op, what)
    if isinstance(f, torch.Tensor):
        if f.device.type == "tpu":
            return [f]  # a device value (perhaps still deferred): read in the program
        return [tensors.empty((1,), f.dtype, flat_in(f).reshape(1))]
    return [tensors.empty((1,), dtype, _constant_block(float(f), jnp.dtype(jaxenv.to_jax_dtype(dtype)).name))]


def _check_empty(op, tensors_, what: str) -> None:
    # tensors with no elements run nothing, but a reduce op their dtype refuses is an
    # error all the same, as on NCCL
    for t in tensors_:
        if not t.numel():
            reduce_kind(op, jaxenv.to_jax_dtype(t.dtype), what)


class CollectiveOps:
    """The collectives of TpuProcessGroup (see the module docstring for what they need of it)."""

    def allreduce(self, tensors, opts=None, what="all_reduce"):
        op = ReduceOp.SUM if opts is None else opts.reduceOp
        ts = [t for t in tensors if t.numel()]
        _check_empty(op, tensors, what)
        if ts:
            groups: dict = {}
            for t in ts:
                groups.setdefault(t.dtype, []).append(t)
            for dt, grp in groups.items():
                jdt = jaxenv.to_jax_dtype(dt)
                kind = reduce_kind(op, jdt, what)
                w = self._size
                key = ("allreduce", kind, len(grp))
                if fused.recording(self) and fused.record_written(
                        self, "ALLREDUCE", key, lambda: body_allreduce(kind, w),
                        grp + _factor_tensor(op, kind, dt, what), grp):
                    continue  # in the defer_and_fuse region (DDP's bucket all-reduce)
                outs = self.launch("ALLREDUCE", key, lambda: body_allreduce(kind, w),
                                   [flat_in(t) for t in grp] + _factor_block(op, kind, jdt, what), grp)
                for t, o in zip(grp, outs):
                    store(t, o)
        return self._work(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts, "all_reduce_coalesced")

    def reduce(self, tensors, opts):
        # an allreduce whose result only the root keeps
        (t,) = tensors
        jdt = jaxenv.to_jax_dtype(t.dtype)
        kind = reduce_kind(opts.reduceOp, jdt, "reduce")
        if t.numel():
            w = self._size
            (o,) = self.launch("REDUCE", ("allreduce", kind, 1), lambda: body_allreduce(kind, w),
                               [flat_in(t)] + _factor_block(opts.reduceOp, kind, jdt, "reduce"), [t])
            if self._rank == opts.rootRank:
                store(t, o)
        return self._work([t])

    def broadcast(self, tensors, opts):
        src = opts.rootRank
        ts = [t for t in tensors if t.numel()]
        if ts:
            w = self._size
            if fused.recording(self) and fused.record_written(
                    self, "BROADCAST", ("broadcast", src, len(ts)), lambda: body_broadcast(src, w), ts, ts):
                return self._work(list(tensors))
            outs = self.launch("BROADCAST", ("broadcast", src, len(ts)), lambda: body_broadcast(src, w),
                               [flat_in(t) for t in ts], ts)
            if self._rank != src:
                for t, o in zip(ts, outs):
                    store(t, o)
        return self._work(list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self._size:
                raise ValueError(f"torchtpu.distributed: all_gather needs {self._size} output tensors, got {len(outs)}")
            if t.numel():
                w = self._size
                (g,) = self.launch("ALLGATHER", ("allgather", 1), lambda: body_allgather(w), [flat_in(t)], [t])
                n = t.numel()
                for i, o in enumerate(outs):
                    store(o, g[i * n:(i + 1) * n])
        return self._work(output_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def _allgather_base(self, output, input, opts=None):
        if input.numel() * self._size != output.numel():
            raise ValueError(
                f"torchtpu.distributed: all_gather_into_tensor: output has {output.numel()} elements, "
                f"expected {self._size} x {input.numel()}")
        if input.numel():
            w = self._size
            if fused.recording(self) and fused.record_written(
                    self, "ALLGATHER_BASE", ("allgather", 1), lambda: body_allgather(w), [input], [output]):
                return self._work([output])  # in the defer_and_fuse region (FSDP2's all-gather)
            (g,) = self.launch("ALLGATHER_BASE", ("allgather", 1), lambda: body_allgather(w), [flat_in(input)],
                               [input])
            store(output, g)
        return self._work([output])

    all_gather_single = _allgather_base

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return self._work(list(outputs))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def _reduce_scatter_flat(self, name, output, flat, ts, op, what):
        kind = reduce_kind(op, dtype_of(flat), what)
        w = self._size
        (o,) = self.launch(name, ("reduce_scatter", kind, 1), lambda: body_reduce_scatter(kind, w),
                           [flat] + _factor_block(op, kind, dtype_of(flat), what), ts)
        store(output, o)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = ReduceOp.SUM if opts is None else opts.reduceOp
        for out, ins in zip(output_tensors, input_lists):
            if len(ins) != self._size:
                raise ValueError(f"torchtpu.distributed: reduce_scatter needs {self._size} inputs, got {len(ins)}")
            if out.numel():
                flat = jnp.concatenate([flat_in(t) for t in ins])
                self._reduce_scatter_flat("REDUCE_SCATTER", out, flat, ins, op, "reduce_scatter")
            else:
                _check_empty(op, [out], "reduce_scatter")
        return self._work(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = ReduceOp.SUM if opts is None else opts.reduceOp
        what = "reduce_scatter_tensor"
        if output.numel() * self._size != input.numel():
            raise ValueError(
                f"torchtpu.distributed: reduce_scatter_tensor: input has {input.numel()} elements, "
                f"expected {self._size} x {output.numel()}")
        if output.numel():
            kind = reduce_kind(op, jaxenv.to_jax_dtype(input.dtype), what)
            w = self._size
            if not (fused.recording(self) and fused.record_written(
                    self, "REDUCE_SCATTER_BASE", ("reduce_scatter", kind, 1), lambda: body_reduce_scatter(kind, w),
                    [input] + _factor_tensor(op, kind, input.dtype, what), [output])):
                self._reduce_scatter_flat("REDUCE_SCATTER_BASE", output, flat_in(input), [input], op, what)
        else:
            _check_empty(op, [output], what)
        return self._work([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return self._work(list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _alltoall_flat(self, name, flat, send, recv, ts):
        """send/recv: element counts per peer (this rank's)."""
        w = self._size
        even = len(set(send)) == 1 and len(set(recv)) == 1 and send[0] == recv[0]
        # The collective program must be the same on every rank: uneven chunks are padded
        # here to the largest chunk anywhere in the group (agreed first), and cut after.
        m = send[0] if even else self._max_over_group(max(max(send), max(recv)))
        if not even:
            flat = pad_chunks(tuple(int(v) for v in send), m)(flat)
        (o,) = self.launch(name, ("alltoall",), lambda: body_alltoall(w), [flat], ts)
        if not even:
            o = unpad_chunks(tuple(int(v) for v in recv), m)(o)
        return o

    def _max_over_group(self, v: int) -> int:
        x = jax.device_put(np.array([v], dtype=np.int64), jaxenv.device())
        w = self._size
        (o,) = self.launch("ALLREDUCE(max, split sizes)", ("allreduce", "max", 1), lambda: body_allreduce("max", w),
                           [x], [])
        return int(np.asarray(o)[0])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        w = self._size
        if output.numel() == 0 and input.numel() == 0 and not output_split_sizes and not input_split_sizes:
            return self._work([output])
        inner_in = math.prod(input.shape[1:]) if input.dim() else 1
        inner_out = math.prod(output.shape[1:]) if output.dim() else 1
        if input_split_sizes:
            send = [s * inner_in for s in input_split_sizes]
        else:
            send = [input.numel() // w] * w
        if output_split_sizes:
            recv = [s * inner_out for s in output_split_sizes]
        else:
            recv = [output.numel() // w] * w
        if sum(send) != input.numel() or sum(recv) != output.numel():
            raise ValueError("torchtpu.distributed: all_to_all_single split sizes do not add up to the tensor sizes")
        o = self._alltoall_flat("ALLTOALL_BASE", flat_in(input), send, recv, [input])
        store(output, o)
        return self._work([output])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        send = [t.numel() for t in input_tensors]
        recv = [t.numel() for t in output_tensors]
        flat = jnp.concatenate([flat_in(t) for t in input_tensors])
        o = self._alltoall_flat("ALLTOALL", flat, send, recv, input_tensors)
        off = 0
        for t in output_tensors:
            store(t, o[off:off + t.numel()])
            off += t.numel()
        return self._work(output_tensors)

    def gather(self, output_tensors, input_tensors, opts):
        (t,) = input_tensors
        dst = opts.rootRank
        if t.numel():
            w = self._size
            (g,) = self.launch("GATHER", ("allgather", 1), lambda: body_allgather(w), [flat_in(t)], [t])
            if self._rank == dst:
                n = t.numel()
                for i, o in enumerate(output_tensors[0]):
                    store(o, g[i * n:(i + 1) * n])
        return self._work(output_tensors[0] if output_tensors else [])

    def scatter(self, output_tensors, input_tensors, opts):
        (t,) = output_tensors
        src = opts.rootRank
        if t.numel():
            w = self._size
            if self._rank == src:
                flat = jnp.concatenate([flat_in(x) for x in input_tensors[0]])
            else:
                flat = zeros(w * t.numel(), t.dtype)
            (o,) = self.launch("SCATTER", ("scatter", src), lambda: body_scatter(src, w), [flat], [t])
            store(t, o)
        return self._work([t])

    def barrier(self, opts=None):
        x = jax.device_put(np.zeros(1, np.int32), jaxenv.device())
        w = self._size
        self.launch("BARRIER", ("allreduce", "sum", 1), lambda: body_allreduce("sum", w), [x], [])
        return self._work(None, block=True)
