"""Collectives inside defer_and_fuse regions.

Two kinds reach us. DTensor and `torch.distributed._functional_collectives` issue
`_c10d_functional` ops; DDP's reducer, FSDP2 and `dist.*` calls go through the
process group's methods. In strict and debug mode both run on their own, one
program per collective. In defer_and_fuse mode a collective on tpu tensors of a
torchtpu group is recorded like any op: the region that holds it compiles to one
SPMD program over the group's mesh (as a compiled graph's collectives do), so the
collective is fused with the compute around it instead of cutting the region in
two, and a DDP step (forward, backward, bucket all-reduce, optimizer) is one program.

Every rank must run a program with the same collectives. A region's boundaries
follow host reads, which can differ between ranks (`if rank == 0:
print(loss.item())` mid-step), so before a region with collectives runs, each
rank posts a digest of its collectives to the group's store and compares it
with its peers' (as every eager collective does). Ranks that cut different
regions all see it at once and fall back together: that region is replayed op
by op and later collectives run on their own, each checked as in strict mode;
never a hang or wrong data. `torchtpu.set_collectives("skinny")` (or
`TORCHTPU_COLLECTIVES=skinny`), the switch compiled graphs obey, keeps collectives
out of regions.
"""
from __future__ import annotations

import hashlib
import sys

import torch

from ..eager import deferred, modes, scalars
from ..runtime import cache as _caches
from ..runtime import jaxenv, leaf, storage, tensors, transfer
from ..runtime.signature import NodeOp, Signature
from ..spmd.functional import LOWERINGS
from ..spmd.mesh import Context, tpu_group
from ..spmd.mode import get_collectives
from ..spmd.reduce import reduce_kind_named

funcol = torch.ops._c10d_functional
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_state = {"enabled": True}  # False once the ranks disagreed about a region (for the process)


def _in_regions() -> bool:
    return (_state["enabled"] and modes.state["mode"] == "defer_and_fuse"
            and get_collectives() == "in_graph")


def _same(x, *static):
    return tuple(x)


def _gathered(x, group_size, group_name):
    return (group_size * x[0],) + tuple(x[1:]) if x else (group_size,)


def _scattered(x, reduce_op, group_size, group_name):
    return (x[0] // group_size,) + tuple(x[1:])


# op -> (its output shape from the input's, static arguments are the rest but the group)
_OPS = {
    funcol.all_reduce.default: _same,
    funcol.all_gather_into_tensor.default: _gathered,
    funcol.reduce_scatter_tensor.default: _scattered,
    funcol.all_to_all_single.default: _same,
    funcol.broadcast.default: _same,
}


# the ops that take a reduce op (their second argument), with the name errors give them
_REDUCING = {funcol.all_reduce.default: "all_reduce", funcol.reduce_scatter_tensor.default: "reduce_scatter_tensor"}


class _Collective:
    """One collective signature as a region node: its program on this rank's block, its
    output's shape, and a standalone SPMD executable for op-by-op replay."""

    def __init__(self, key, op, ctx, static, lf: leaf.Leaf, dtype: torch.dtype, out_shape):
        self.key = key
        self.skeleton = (key.op, key.pos, lf.shape, str(dtype))  # what every rank must agree on
        self.ctx = ctx
        self.outs = [(out_shape, dtype)]
        self.updated = ()
        self.ran = False  # its standalone executable ran (replay counts compiles by it)
        lower = LOWERINGS[op]
        shape = lf.shape

        def program(bufs, scalars_, rngdata):
            return [lower(ctx, leaf.read(bufs, lf), *static).reshape(-1)], {}

        self.program = program

        def fn(bufs, packed, rngdata):
            # op by op (a replayed region): the collective as strict mode runs it, through
            # the process group, checked against the peers and watched like any
            x = leaf.read(bufs, lf).reshape(-1)
            with modes.mode("strict"):
                out = funcol.wait_tensor(op.redispatch(_CPU, tensors.empty(shape, dtype, x), *static))
                return [transfer.buffer(storage.lookup(out))], {}

        fn.codes = scalars.layout([])
        self.fn = fn

    def shape_free_key(self):
        return self.key.shape_free()

    def describe(self) -> str:
        return (f"{self.key.op.split('.')[-1]}({', '.join(map(str, self.key.pos))}) on "
                f"{self.skeleton[2]}:{str(self.outs[0][1]).removeprefix('torch.')}")


class _Written(_Collective):
    """A process group's collective (DDP's bucket all-reduce, FSDP2's all-gather and
    reduce-scatter: `dist.*` calls, not functional ones) as a region node: it reads its
    input tensors' views and writes its results into its output tensors' storages, the
    program the eager path would run (same body, same name for the cross-rank check)."""

    def __init__(self, key, pg, name, pkey, make_body, reads, writes, specs):
        self.key = key
        self.read_shapes = tuple((lf.shape, str(lf.dtype)) for lf in reads)
        self.skeleton = (name, pkey, self.read_shapes)  # not the views' offsets: each rank has its own
        self.outs = []
        self.ran = False
        self.updated = updated = tuple(sorted({lf.slot for lf in writes}))
        body = make_body()

        def read(bufs):
            return [leaf.read(bufs, lf).reshape(-1) for lf in reads]

        def write_back(bufs, outs):
            # (an output never written before, torch.empty, starts as zeros of its spec)
            bufs = list(bufs)
            for lf, o in zip(writes, outs):
                leaf.write(bufs, lf, o.reshape(lf.shape), spec=specs[lf.slot])
            return [], {s: bufs[s] for s in updated}

        def program(bufs, scalars_, rngdata):
            outs = body(*read(bufs))
            return write_back(bufs, outs if isinstance(outs, (tuple, list)) else (outs,))

        self.program = program

        def fn(bufs, packed, rngdata):
            # op by op: the eager collective itself, checked and watched
            shapes = [_Shape(lf.shape, lf.dtype) for lf in reads]
            return write_back(bufs, pg.launch(name, pkey, lambda: body, read(bufs), shapes))

        fn.codes = scalars.layout([])
        self.fn = fn

    def describe(self) -> str:
        return f"{self.key.op}{self.key.pos} on {self.read_shapes}"


_written_low = NodeOp("c10d.collective", "inplace")


def recording(pg) -> bool:
    """Whether a process-group collective of `pg` is recorded into the region."""
    return _in_regions() and pg.recording_allowed


def record_written(pg, name: str, pkey, make_body, inputs, outputs) -> bool:
    """Record `pg`'s collective `name` from `inputs` into `outputs` (tpu tensors) in the
    region; False (nothing recorded) when a tensor is not a tpu tensor of the table."""
    tensors_ = list(inputs) + list(outputs)
    if not all(t.device.type == "tpu" and t.numel() for t in tensors_):
        return False
    leaves = leaf.Leaves()
    try:
        for t in tensors_:
            leaves.add(t)
    except KeyError:
        return False
    entries, geo = leaves.entries, tuple(leaves.leaves)
    reads, writes = geo[:len(inputs)], geo[len(inputs):]
    specs = leaves.specs()
    # how many of the leaves are read decides the program too (the rest are written)
    key = Signature(name, "inplace", pkey, (), geo, specs, tuple(e.buf is not None for e in entries), (len(reads),))
    ctx = _context(pg)
    node = _nodes.get((key, id(ctx)))
    if node is None:
        node = _nodes[(key, id(ctx))] = _Written(key, pg, name, pkey, make_body, reads, writes, specs)
    deferred.record_collective(node, entries, _written_low, ctx)
    return True


_nodes = _caches.register("fused collective nodes", _caches.LRU(_caches.limit("total")))  # a memo: evictable
_ops: dict = {}
_contexts: dict = {}


def _context(pg):
    ctx = _contexts.get(id(pg))
    if ctx is None or ctx.group is not pg:
        ctx = _contexts[id(pg)] = Context(pg)
    return ctx


def _even_splits(op, args) -> bool:
    if op is not funcol.all_to_all_single.default:
        return True
    out_splits, in_splits = args[1], args[2]
    return len(set(out_splits or ())) <= 1 and len(set(in_splits or ())) <= 1


def _kernel(op):
    out_shape_of = _OPS[op]
    name = f"_c10d_functional.{op._opname}"

    def kernel(*args):
        x = args[0]
        pg = None
        if x.device.type == "tpu" and _in_regions():
            pg = tpu_group(args[-1])
        if pg is None or pg.size() == 1 or not _even_splits(op, args):
            # PyTorch's own implementation: the process group's collective (it flushes
            # the region first), with its work registered for wait_tensor
            return op.redispatch(_CPU, *args)
        if op in _REDUCING:
            # a reduce op the dtype refuses fails here, at the line that issued it, not
            # when the region is traced
            reduce_kind_named(args[1], jaxenv.to_jax_dtype(x.dtype), _REDUCING[op])
        entry = storage.lookup(x)
        static = tuple(tuple(a) if isinstance(a, list) else a for a in args[1:])
        lf = leaf.leaf_of(x, 0)
        key = Signature(name, "functional", static[:-1], (), (lf,), ((entry.numel, str(entry.dtype)),), (),
                        (x.dtype,))
        ctx = _context(pg)
        node = _nodes.get((key, id(ctx)))
        if node is None:
            node = _nodes[(key, id(ctx))] = _Collective(
                key, op, ctx, static, lf, x.dtype, out_shape_of(lf.shape, *static))
        return deferred.record_collective(node, [entry], _ops.setdefault(name, NodeOp(name)), ctx)[0]

    return kernel


_lib = None


def install() -> None:
    """Register the tpu kernels of the functional collectives and the runner of regions
    with collectives (once, with the first group)."""
    global _lib
    if _lib is not None:
        return
    deferred.set_collective_region_runner(RegionRunner())
    _lib = torch.library.Library("_c10d_functional", "IMPL")
    for op in _OPS:
        _lib.impl(op._opname, _kernel(op), "PrivateUse1")


# ---- running a region that holds collectives ------------------------------------------------

_summaries = _caches.register("fused collective summaries", _caches.LRU(_caches.limit("regions")))


def _summary(fkey, nodes) -> tuple[str, str]:
    """(digest, description) of a region's collectives, once per region signature.

    The digest is what every rank's region must agree on: its collectives (op,
    reduction, shapes, dtypes) in order. The rest of the program may differ between
    ranks (each reads its own shard at its own offset; a scatter's source rank cuts the
    chunks it sends)."""
    got = _summaries.get(fkey)
    if got is None:
        colls = [n.compiled for n in nodes if isinstance(n.compiled, _Collective)]
        digest = hashlib.sha1(repr([c.skeleton for c in colls]).encode()).hexdigest()[:16]
        what = f"a fused region of {len(nodes)} ops with " + ", ".join(c.describe() for c in colls)
        got = _summaries[fkey] = (digest, what)
    return got


class _Shape:
    """What a collective's check message says of a tensor."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape = shape
        self.dtype = dtype


def agree(ctx, fkey, nodes) -> bool:
    """Whether every rank of the group fused this region around the same collectives.

    Each rank posts its region's digest to the store under the group's next collective
    number and waits for its peers'. On a difference (a rank cut its region at a host read
    the others did not make) every rank learns it at once and falls back to the same
    thing: this region is replayed op by op and later collectives run on their own, each
    checked as in strict mode. A peer that never posts ends in the process-group timeout."""
    pg = ctx.group
    agreement = pg.agreement
    if agreement is None:  # TORCHTPU_DIST_CHECK=0
        return True
    digest, what = _summary(fkey, nodes)
    prog = f"REGION {digest}"
    seq, sigs = agreement.exchange(prog, what)
    if all(v["prog"] == prog for v in sigs.values()):
        return True
    _state["enabled"] = False
    lines = "; ".join(f"rank {r} {v['what']}" for r, v in sorted(sigs.items()))
    sys.stderr.write(
        f"torchtpu: defer_and_fuse: the ranks of group {pg.getGroupName()!r} fused different regions around "
        f"their collectives (#{seq}: {lines}), since one rank read a value on the host where the others did "
        f"not. This region runs op by op, and collectives now run on their own, as in strict mode.\n")
    return False


def run_region(ctx, fkey, nodes, fn, args):
    """Launch a fused region with collectives and hand its outputs to the distributed
    watchdog (a peer that dies mid-program ends in a timeout error, not a hang)."""
    return ctx.group.launch_watched(_summary(fkey, nodes)[1], fn, *args)


class RegionRunner:
    """What eager/deferred calls for a region holding collectives
    (spmd.region_runner.CollectiveRegionRunner); installed with the first group."""

    def agree(self, ctx, fkey, nodes) -> bool:
        return agree(ctx, fkey, nodes)

    def run(self, ctx, fkey, nodes, fn, args):
        return run_region(ctx, fkey, nodes, fn, args)
