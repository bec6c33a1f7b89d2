"""Collectives inside compiled graphs: in the program ("fat") or between programs ("skinny").

Dynamo and aot_autograd turn `dist.all_reduce`, DTensor's and FSDP2's communication
and DDP's python reducer into `_c10d_functional` ops. In-graph (the default), a
graph holding them runs as one SPMD program over the process group's mesh (one
XLA device per process): each rank's inputs are its blocks of global arrays,
every collective is an XLA collective inside the program, and XLA may overlap it
with the compute around it. Skinny (`TORCHTPU_COLLECTIVES=skinny` or
`torchtpu.set_collectives("skinny")`) cuts the graph at each
collective: the pieces between them are compiled programs, and each collective
runs on its own through the process group, one executable per collective, as
the eager path does. A graph whose collectives cannot share one SPMD program
(several groups, uneven all_to_all splits) also takes the skinny path.
"""
from __future__ import annotations

import hashlib
import operator

import torch

from .. import config
from ..metrics import bump
# shared with fused regions and the process group (spmd/); compile/graph.py and
# compile/runtime.py reach them through this module, torchtpu.set_collectives too
from ..spmd.functional import LOWERINGS
from ..spmd.mesh import Context, tpu_group
from ..spmd.mode import get_collectives, set_collectives  # noqa: F401 - re-exported
from ..spmd.program import spmd  # noqa: F401 - re-exported

funcol = torch.ops._c10d_functional



def _group_arg(node) -> str | None:
    """The group name a collective node names (its last string argument)."""
    for a in reversed(list(node.args) + list(node.kwargs.values())):
        if isinstance(a, str) and node.target is not funcol.wait_tensor.default:
            return a
    return None


def is_collective(node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace in ("_c10d_functional", "_c10d_functional_autograd", "c10d")
            and node.target is not funcol.wait_tensor.default)


def collective_nodes(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if is_collective(n)]


def why_not_in_graph(gm: torch.fx.GraphModule) -> str | None:
    """None if every collective of the graph can live in one SPMD program, else why not."""
    nodes = collective_nodes(gm)
    names = {_group_arg(n) for n in nodes}
    if len(names) != 1 or None in names:
        return f"collectives over {len(names)} process groups"
    for n in nodes:
        if n.target not in LOWERINGS:
            return f"{n.target} has no in-graph lowering"
        if n.target is funcol.all_to_all_single.default:
            out_splits, in_splits = n.args[1], n.args[2]
            if len(set(out_splits)) > 1 or len(set(in_splits)) > 1:
                return "all_to_all_single with uneven splits (each rank's shapes differ)"
    if tpu_group(names.pop()) is None:
        return "the process group is not a torchtpu ('tpu') group"
    return None


def _describe(n) -> str:
    def arg(a):
        v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if isinstance(v, torch.Tensor):
            return f"{tuple(v.shape)}:{str(v.dtype).removeprefix('torch.')}"
        return repr(a) if not isinstance(a, torch.fx.Node) else "?"
    g = _group_arg(n)
    return f"{n.target._opname}({', '.join(arg(a) for a in n.args if a != g)})"


def context_of(gm: torch.fx.GraphModule) -> Context | None:
    nodes = collective_nodes(gm)
    if not nodes:
        return None
    ops = [_describe(n) for n in nodes]
    what = f"a compiled graph with {', '.join(ops)}"
    return Context(tpu_group(_group_arg(nodes[0])), what, hashlib.sha1(repr(ops).encode()).hexdigest()[:16])


# ---- the skinny path: compiled pieces between collectives ---------------------------------------

class _Piece(torch.nn.Module):
    """A compiled piece of a split graph, called like the submodule it replaces."""

    def __init__(self, compiled, single: bool):
        super().__init__()
        self.compiled = compiled
        self.single = single

    def forward(self, *args):
        out = self.compiled(list(args))
        return out[0] if self.single else tuple(out)


class SkinnyGraph:
    """An aot graph cut at its collectives: compute pieces compiled, collectives eager."""

    def __init__(self, gm: torch.fx.GraphModule, label: str, compile_piece):
        from torch.fx.passes.split_module import split_module

        self._boxed_call = True
        part = {}
        pid = 0
        for n in gm.graph.nodes:
            if n.op in ("placeholder", "output", "get_attr"):
                continue
            if is_collective(n):
                pid += 1
                part[n] = pid
                pid += 1
            elif n.target is operator.getitem and _issued(n.args[0]):
                # one result of a coalesced collective (a list): picked where it was issued, so
                # no compiled piece is handed the list
                part[n] = part[n.args[0]]
            elif n.target is funcol.wait_tensor.default and _issued(n.args[0]):
                # waited on where it was issued, so PyTorch's registry of in-flight work sees it
                part[n] = part[n.args[0]]
            else:
                part[n] = pid
        split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
        self.pieces = 0
        for name, sub in list(split.named_children()):
            if any(is_collective(n) for n in sub.graph.nodes):
                continue  # runs eagerly: the process group's one-executable collectives
            single = _tuple_output(sub)
            self.pieces += 1
            setattr(split, name, _Piece(compile_piece(sub, f"{label}.{name}"), single))
        self.split = split
        bump("skinny_graphs")

    def __call__(self, args):
        out = self.split(*args)
        args.clear()
        return list(out)


def _issued(a) -> bool:
    """Whether `a` is a collective's node or one result of a coalesced one."""
    if not isinstance(a, torch.fx.Node):
        return False
    if a.op == "call_function" and a.target is operator.getitem:
        a = a.args[0]
    return isinstance(a, torch.fx.Node) and is_collective(a)


def _tuple_output(sub: torch.fx.GraphModule) -> bool:
    """Make the submodule return a tuple (CompiledGraph's convention); True if it returned one value."""
    out = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
    if isinstance(out.args[0], (tuple, list)):
        return False
    out.args = ((out.args[0],),)
    sub.recompile()
    return True


# ---- bucketing --------------------------------------------------------------------------------

# DDP's reducer makes its first bucket small (1 MB: the last layers' gradients, ready
# first, so their reduction can start early); TORCHTPU_FIRST_BUCKET_MB does the same here.
# By default it is as big as the others: on XLA:CPU a second collective cost more than the
# overlap it allowed (bench dist, small GPT).
BUCKET_BYTES = int(config.startup.bucket_mb * (1 << 20))
FIRST_BUCKET_BYTES = int(config.startup.first_bucket_mb * (1 << 20))


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def bucket_all_reduces(gm: torch.fx.GraphModule) -> int:
    """Fuse the graph's independent all_reduces into few big ones; returns how many remain.

    DDP's python reducer (compiled autograd) all-reduces each gradient on its own: 30
    collectives for the small GPT, and each XLA:CPU collective costs milliseconds however
    small (36 of them on 529K floats: 137 ms; one on their concatenation: 8 ms). As DDP's
    own reducer does, flatten, concatenate up to BUCKET_BYTES, reduce once, split back.
    The all_reduces' consumers move after the fused ones; nothing else changes order."""
    graph = gm.graph
    ars = [n for n in graph.nodes if n.op == "call_function" and n.target is funcol.all_reduce.default]
    if len(ars) < 2:
        return len(ars)
    after: set = set()  # nodes that read an all_reduce's result, directly or not
    for n in graph.nodes:
        if n.op != "output" and (n in ars or any(a in after for a in n.all_input_nodes)):
            after.add(n)
    free = [a for a in ars if not any(i in after for i in a.all_input_nodes)
            and isinstance(a.args[0].meta.get("val"), torch.Tensor)
            and len(a.users) == 1 and next(iter(a.users)).target is funcol.wait_tensor.default]
    if len(free) < 2:
        return len(ars)
    groups: dict = {}
    for a in free:
        v = a.args[0].meta["val"]
        groups.setdefault((a.args[1], a.args[2], v.dtype), []).append(a)
    buckets = []
    for (op, group, dtype), members in groups.items():
        cur, size = [], 0
        for a in members:
            nbytes = a.args[0].meta["val"].numel() * a.args[0].meta["val"].element_size()
            if cur and size + nbytes > (BUCKET_BYTES if buckets else FIRST_BUCKET_BYTES):
                buckets.append((op, group, dtype, cur))
                cur, size = [], 0
            cur.append(a)
            size += nbytes
        buckets.append((op, group, dtype, cur))
    buckets = [b for b in buckets if len(b[3]) > 1]
    if not buckets:
        return len(ars)
    aten = torch.ops.aten
    order = {n: i for i, n in enumerate(graph.nodes)}
    for op, group, dtype, members in buckets:
        # each bucket is reduced as soon as its last gradient exists, so in one program
        # XLA may run it while the rest of the backward computes (skinny cannot)
        cursor = max((a.args[0] for a in members), key=order.__getitem__)
        flats = []
        sizes = []
        for a in members:
            v = a.args[0].meta["val"]
            sizes.append(v.numel())
            with graph.inserting_after(cursor):
                f = graph.call_function(aten.reshape.default, (a.args[0], [-1]))
            f.meta["val"] = _meta((v.numel(),), dtype)
            flats.append(f)
            cursor = f
        total = sum(sizes)
        with graph.inserting_after(cursor):
            cat = graph.call_function(aten.cat.default, (flats,))
        cat.meta["val"] = _meta((total,), dtype)
        with graph.inserting_after(cat):
            ar = graph.call_function(funcol.all_reduce.default, (cat, op, group))
        ar.meta["val"] = _meta((total,), dtype)
        with graph.inserting_after(ar):
            wt = graph.call_function(funcol.wait_tensor.default, (ar,))
        wt.meta["val"] = _meta((total,), dtype)
        with graph.inserting_after(wt):
            parts = graph.call_function(aten.split_with_sizes.default, (wt, sizes))
        parts.meta["val"] = [_meta((k,), dtype) for k in sizes]
        cursor = parts
        for i, a in enumerate(members):
            wait = next(iter(a.users))
            v = a.args[0].meta["val"]
            with graph.inserting_after(cursor):
                piece = graph.call_function(operator.getitem, (parts, i))
            piece.meta["val"] = _meta((sizes[i],), dtype)
            with graph.inserting_after(piece):
                back = graph.call_function(aten.reshape.default, (piece, list(v.shape)))
            back.meta["val"] = wait.meta.get("val", _meta(tuple(v.shape), dtype))
            cursor = back
            wait.replace_all_uses_with(back)
            graph.erase_node(wait)
            graph.erase_node(a)
    # everything that reads a reduced value goes to the end, in its order
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for n in [n for n in graph.nodes if n in after and n.op != "output"]:
        output.prepend(n)
    graph.lint()
    gm.recompile()
    bump("all_reduce_buckets", len(buckets))
    return len(collective_nodes(gm))
