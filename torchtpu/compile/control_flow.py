"""Higher-order ops inside a compiled program: torch.cond, while_loop, scan, map and
associative_scan as XLA control flow (lax.cond, lax.while_loop, lax.scan,
lax.associative_scan), so a loop or a branch on device data stays inside the program.

A higher-order node carries its branches or body as ATen subgraphs (GraphModules held
by the parent graph). Each becomes a `graph.Program` of its own, the same machinery
that runs the parent, so subgraphs may hold any lowered op, CPU fallbacks and further
higher-order ops (nested control flow). Tensors a body closes over arrive as extra
operands (Dynamo lifts them); Python numbers among the operands (SymInts made
concrete) stay static, closed over by the traced branch.

Random ops inside a body get a key folded from the node's key and, in a loop, the
iteration number, so every iteration draws fresh numbers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from torch._higher_order_ops.associative_scan import associative_scan_op
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph
from torch._higher_order_ops.map import map_impl
from torch._higher_order_ops.scan import scan_op
from torch._higher_order_ops.while_loop import while_loop_op, while_loop_stack_output_op

from ..ops import checks
from ..runtime.jaxenv import to_jax_dtype

HOP = torch._ops.HigherOrderOperator


def _is_array(v) -> bool:
    return isinstance(v, (jax.Array, jax.core.Tracer))


def _strong(x, val):
    """`x` with the exact type of the traced value `val` (no weak type): XLA control flow
    needs a loop's carry and both branches' results to have identical types."""
    if not isinstance(val, torch.Tensor) or x is None:
        return x
    x = jax.lax.convert_element_type(jnp.asarray(x), to_jax_dtype(val.dtype))
    shape = tuple(val.shape)
    return x.reshape(shape) if all(isinstance(s, int) for s in shape) else x


def _leaves(tree):
    return torch.utils._pytree.tree_leaves(tree, is_leaf=lambda v: v is None)


class Subgraph:
    """A branch or body: its ATen graph as a function of its flat inputs."""

    def __init__(self, gm: torch.fx.GraphModule, program_of):
        self.program = program_of(gm, host_part=False)
        if self.program.mutated_inputs:
            raise NotImplementedError(
                "torchtpu compile: a control-flow body that writes its inputs in place is not supported")
        out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.out_vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else n
                         for n in _leaves(out.args[0])]
        self.in_vals = [n.meta.get("val") for n in self.program.placeholders]
        self.random = self.program.n_random > 0

    def __call__(self, inputs, key=None):
        """The body's outputs, and the device-side checks it declared: (outs, packed rows
        or None, their Checks). A body's flags are values of its own trace (one branch,
        one iteration), so the construct that calls it carries them out as outputs of its
        own (see `_carried`) and hands them to the enclosing program's collector."""
        outer = checks.active()
        with checks.collect() as body:
            outs, _ = self.program(list(inputs), (), key=key)
        outs = [_strong(o, v) for o, v in zip(_leaves(outs), self.out_vals)]
        if outer is None or body is None or not body.rows:
            return outs, None, []
        return outs, body.packed(), list(body.checks)

    def run(self, inputs, key=None):
        """Called where the body runs once, inline: its checks join the program's directly."""
        outs, packed, found = self(inputs, key)
        checks.absorb(found, packed)
        return outs

    def declared(self, *example) -> int:
        """How many check rows one call declares, learned by tracing it abstractly: a loop
        carries their flags and a branch returns them, so their number is part of the
        construct's types before the real trace."""
        if checks.active() is None:
            return 0
        box = []

        def probe(*a):
            _, packed, found = self(*a)
            box.append(len(found))
            return packed

        jax.eval_shape(probe, *example)
        return box[0]


def _no_flags(k):
    return jnp.zeros((checks.ROW * k,), jnp.int64)


class Node:
    """One higher-order node of a graph: its lowering and its subgraphs, lowered once."""

    def __init__(self, gm: torch.fx.GraphModule, node: torch.fx.Node, program_of):
        # program_of: graph.Program, passed in by it (graph.py imports this module)
        self.lowering = LOWERINGS[node.target]
        self.node = node
        self.subs: dict[int, Subgraph] = {}
        for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                mod = getattr(gm, a.target)
                if isinstance(mod, torch.fx.GraphModule):
                    self.subs[id(mod)] = Subgraph(mod, program_of)
        self.random = any(s.random for s in self.subs.values())

    def sub(self, gm) -> Subgraph:
        return self.subs[id(gm)]

    def __call__(self, args, kwargs, key):
        return self.lowering(self, key, *args, **kwargs)


def handles(target) -> bool:
    return isinstance(target, HOP) and target in LOWERINGS


def _statics(values):
    """Split operands into arrays (traced through the control flow) and a rebuild function
    that puts the static ones (Python numbers, None) back in place."""
    values = list(values)
    pos = [i for i, v in enumerate(values) if _is_array(v)]

    def rebuild(arrays):
        out = list(values)
        for i, a in zip(pos, arrays):
            out[i] = a
        return out

    return [values[i] for i in pos], rebuild


def _fold(key, i):
    return None if key is None else jax.random.fold_in(key, i)


# ---- the lowerings ------------------------------------------------------------------------

def _cond(hop, key, pred, true_fn, false_fn, operands):
    t, f = hop.sub(true_fn), hop.sub(false_fn)
    if not _is_array(pred):  # a Python bool (a SymBool made concrete): no branch to trace
        return (t if pred else f).run(operands, key)
    arrays, rebuild = _statics(operands)
    kt = t.declared(rebuild(arrays), key)
    kf = f.declared(rebuild(arrays), key)
    found = {}

    # each branch returns the flag rows of both (zeros for the other's), so that the two
    # have one output type; the taken branch's rows are the ones that can trip
    def branch(sub, name, before, after):
        def run(a):
            outs, packed, got = sub(rebuild(a), key)
            found[name] = got
            if not (kt or kf):
                return outs, None
            parts = [_no_flags(before)] + ([packed] if got else []) + [_no_flags(after)]
            return outs, jnp.concatenate(parts)
        return run

    outs, flags = jax.lax.cond(
        jnp.reshape(pred, ()).astype(jnp.bool_),
        branch(t, "t", 0, kf), branch(f, "f", kt, 0), arrays)
    if flags is not None:
        checks.absorb(found["t"] + found["f"], flags)
    return outs


def _carry(values, vals):
    return [_strong(x, v) for x, v in zip(values, vals)]


def _while_loop(hop, key, cond_fn, body_fn, carried, additional, **kwargs):
    c, b = hop.sub(cond_fn), hop.sub(body_fn)
    n = len(carried)
    if any(not _is_array(x) for x in carried):
        raise NotImplementedError(
            "torchtpu compile: while_loop with Python numbers among its carried values is not supported; "
            "carry 0-d tensors instead")
    extra = list(additional)
    init = _carry(carried, b.out_vals)
    k = b.declared(list(init) + extra, _fold(key, 1))
    found = []

    def pred(state):
        i, carry, _ = state
        # checks in the predicate are not carried (their flags would be values of a
        # function whose only output is the loop's bool): XLA's semantics there
        return jnp.reshape(c(list(carry) + extra, _fold(key, 2 * i))[0][0], ()).astype(jnp.bool_)

    def body(state):
        i, carry, flags = state
        outs, packed, got = b(list(carry) + extra, _fold(key, 2 * i + 1))
        found[:] = got
        return i + 1, outs, (checks.keep_first(flags, packed) if got else flags)

    _, out, flags = jax.lax.while_loop(pred, body, (jnp.int32(0), init, _no_flags(k)))
    assert len(out) == n
    checks.absorb(found, flags)
    return list(out)


def _while_loop_stack_output(hop, key, *args, **kwargs):
    raise NotImplementedError(
        "torchtpu compile: while_loop under autograd (torch.ops.higher_order.while_loop_stack_output) "
        "stacks one value per iteration, a length known only at run time; run the loop under "
        "torch.no_grad() or write it with scan over a fixed number of steps")


def _scan(hop, key, combine_fn, init, xs, additional):
    f = hop.sub(combine_fn)
    n = len(init)
    extra = list(additional)
    init = _carry(init, f.out_vals[:n])
    k = f.declared(list(init) + [x[0] for x in xs] + extra, _fold(key, 0))
    found = []

    def step(state, x):
        i, carry, flags = state
        outs, packed, got = f(list(carry) + list(x) + extra, _fold(key, i))
        found[:] = got
        return (i + 1, outs[:n], checks.keep_first(flags, packed) if got else flags), outs[n:]

    (_, carry, flags), ys = jax.lax.scan(step, (jnp.int32(0), init, _no_flags(k)), list(xs))
    checks.absorb(found, flags)
    return list(carry) + list(ys)


def _map(hop, key, body_fn, xs, pos_args):
    f = hop.sub(body_fn)
    extra = list(pos_args)
    k = f.declared([x[0] for x in xs] + extra, _fold(key, 0))
    found = []

    def step(state, x):
        i, flags = state
        outs, packed, got = f(list(x) + extra, _fold(key, i))
        found[:] = got
        return (i + 1, checks.keep_first(flags, packed) if got else flags), outs

    (_, flags), ys = jax.lax.scan(step, (jnp.int32(0), _no_flags(k)), list(xs))
    checks.absorb(found, flags)
    return list(ys)


def _associative_scan(hop, key, combine_fn, xs, additional_inputs):
    f = hop.sub(combine_fn)
    n = len(xs)
    extra = list(additional_inputs)
    # the combine graph is traced on one slice (xs[0]) of each input; lax.associative_scan
    # combines whole runs of slices at a time, hence vmap over the leading dimension
    # checks inside the combine function stay XLA's semantics: its flags would be batched
    # over the vmapped slices and over the tree of combines, with no first one to report
    one = jax.vmap(lambda *ab: tuple(f(list(ab) + extra, key)[0]))

    def combine(a, b):
        return list(one(*a, *b))

    xs = [_strong(x, v) for x, v in zip(xs, [None] * n)]
    return list(jax.lax.associative_scan(combine, list(xs), axis=0))


def _invoke_subgraph(hop, key, subgraph, identifier, *operands):
    return hop.sub(subgraph).run(operands, key)


LOWERINGS = {
    cond_op: _cond,
    while_loop_op: _while_loop,
    while_loop_stack_output_op: _while_loop_stack_output,
    scan_op: _scan,
    map_impl: _map,
    associative_scan_op: _associative_scan,
    invoke_subgraph: _invoke_subgraph,
}


from .flex_attention import LOWERINGS as _FLEX  # noqa: E402

LOWERINGS.update(_FLEX)
