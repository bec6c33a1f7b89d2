"""torch.cond, while_loop, scan, map and associative_scan on tpu tensors in the eager modes.

strict and debug run PyTorch's own eager implementation of the higher-order op (a
branch chosen by reading the predicate on the host, a Python loop of device ops), as
a CUDA user sees it. defer_and_fuse records the higher-order op as one node of the
region: the op is traced once per signature (make_fx on fake tensors, so the branches
and bodies become ATen graphs) and the traced graph is lowered with the compiler's
graph machinery to lax.cond / lax.while_loop / lax.scan. Nothing is read back, so a
loop over device data stays inside the region's program.

These are PrivateUse1 kernels of the higher-order ops, reached below autograd:
PyTorch's autograd wrappers (cond and scan backward) call the op again with their
backward graphs, recorded the same way.
"""
from __future__ import annotations

import threading

import torch
from torch._C import DispatchKey
from torch._higher_order_ops.associative_scan import associative_scan_op
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.map import map_impl
from torch._higher_order_ops.scan import scan_op
from torch._higher_order_ops.while_loop import while_loop_op

from .. import metrics
from ..runtime import executables
from ..runtime import leaf as _leaf
from ..runtime import storage
from ..runtime.signature import NodeOp, Signature
from . import deferred, modes
from .op_program import Compiled, jit_packed

OPS = (cond_op, while_loop_op, scan_op, map_impl, associative_scan_op)

# How a traced ATen graph becomes a program over JAX values: compile/'s decomposition
# table and graph.Program. compile/ sits above eager/, so it installs them here when it
# is imported (torchtpu imports it); defer_and_fuse control flow is their only user here.
_graph_lowering: dict = {}


def install_graph_lowering(decompositions, program) -> None:
    """`decompositions()`: the table make_fx decomposes with; `program(gm)`: the graph as a
    callable (inputs, rngdata) -> (outputs, mutated) with `n_random`."""
    _graph_lowering["decompositions"] = decompositions
    _graph_lowering["program"] = program


class _HopCompiled(Compiled):
    """A traced higher-order op in the form deferred.record takes any op's executable."""

    __slots__ = ("node", "low")


_cache = executables.control_flow
_lock = threading.Lock()


def _fingerprint(fn):
    """A branch or body, by content: PyTorch builds a new GraphModule for the same code on
    every call (backward graphs, eager torch.cond), and each must not trace again."""
    if isinstance(fn, torch.fx.GraphModule):
        consts = []
        for n in fn.graph.nodes:
            if n.op == "get_attr":
                v = getattr(fn, n.target)
                consts.append(_fingerprint(v) if isinstance(v, torch.fx.GraphModule) else id(v))
        return ("gm", fn.code, tuple(consts))
    return ("fn", id(fn))


def _signature(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.dtype)
    if callable(x):
        return ("F", _fingerprint(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_signature(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _signature(v)) for k, v in x.items()))
    return ("V", type(x).__name__, x)


def _deferrable(leaves) -> bool:
    """Every tensor on tpu: a CPU operand (a loop counter) keeps PyTorch's own path."""
    return all(t.device.type == "tpu" for t in leaves if isinstance(t, torch.Tensor))


class _Node:
    """The higher-order op traced for one signature, as a region node's program."""

    def __init__(self, op, args, kwargs, tensors):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx

        if not _graph_lowering:
            raise RuntimeError("torchtpu: control flow under defer_and_fuse needs torchtpu.compile imported")
        spec = torch.utils._pytree.tree_flatten((args, kwargs))[1]
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

        def call(*ts):
            vals = list(leaves)
            for p, t in zip(positions, ts):
                vals[p] = t
            a, k = torch.utils._pytree.tree_unflatten(vals, spec)
            return op(*a, **k)

        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        mode = FakeTensorMode(shape_env=ShapeEnv())  # while_loop's tracing asks for one
        fakes = [mode.from_tensor(t.detach(), static_shapes=True) for t in tensors]
        with torch._C._AutoDispatchBelowAutograd():
            gm = make_fx(call, tracing_mode="fake", decomposition_table=_graph_lowering["decompositions"]())(*fakes)
        self.gm = gm
        self.program = _graph_lowering["program"](gm)
        out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        # the op's own output structure (a tuple: autograd.Function wraps only tuple outputs)
        flat, self.out_spec = torch.utils._pytree.tree_flatten(
            torch.utils._pytree.tree_map_only(torch.fx.Node, lambda n: n.meta.get("val"), out.args[0]))
        if not all(isinstance(v, torch.Tensor) for v in flat):
            raise NotImplementedError(f"torchtpu: {op.name()} returning non-tensors under defer_and_fuse")
        self.outs = [(tuple(v.shape), v.dtype) for v in flat]
        self.random = self.program.n_random > 0


def _record(op, args, kwargs):
    tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    flat = _leaf.Leaves()
    for t in tensors:
        flat.add(t, storage.lookup(t))
    entries = flat.entries
    leaves = tuple(flat.leaves)
    specs = flat.specs()
    # the operator object itself is part of its program (two ops of one name can differ)
    key = Signature(f"higher_order.{op.name()}", "functional", (op, _signature(args), _signature(kwargs)), (),
                    leaves, specs, ())
    compiled = _cache.get(key)
    if compiled is None:
        with _lock:
            compiled = _cache.get(key)
            if compiled is None:
                compiled = _compile(op, key, args, kwargs, tensors, leaves, specs)
                _cache.admit(key, compiled)
    compiled.used = next(executables.clock)
    outs = deferred.record(compiled, entries, [], compiled.low)
    metrics.bump("control_flow_nodes")
    return torch.utils._pytree.tree_unflatten(list(outs), compiled.node.out_spec)


def _compile(op, key, args, kwargs, tensors, leaves, specs):
    """The traced op in the form deferred.record takes any op's executable."""
    import jax.numpy as jnp

    node = _Node(op, args, kwargs, tensors)
    program_fn = node.program

    def program(bufs, scalars, rngdata):
        bufs = [jnp.zeros((n,), dt) if b is None else b for b, (n, dt) in zip(bufs, specs)]
        inputs = [_leaf.read(bufs, lf) for lf in leaves]
        outs, _ = program_fn(inputs, rngdata)
        outs = torch.utils._pytree.tree_leaves(outs)
        return tuple(jnp.asarray(o).reshape(-1) for o in outs), {}

    c = _HopCompiled()
    c.program = program
    c.fn = jit_packed(program, ())
    c.outs = node.outs
    c.structure = "tuple"
    c.updated = ()
    c.key = key
    c.node = node
    c.low = NodeOp(key.op, random=node.random)
    return c


def _kernel(op, dense):
    def kernel(*args, **kwargs):
        if modes.state["mode"] == "defer_and_fuse" and _deferrable(torch.utils._pytree.tree_leaves((args, kwargs))):
            return _record(op, args, kwargs)
        return dense(*args, **kwargs)

    return kernel


def register() -> None:
    """Serve the higher-order ops for tpu tensors: PyTorch's eager kernel in strict and debug,
    one recorded node in defer_and_fuse."""
    for op in OPS:
        dense = op.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
        if dense is None:
            continue
        op.py_impl(DispatchKey.PrivateUse1)(_kernel(op, dense))
