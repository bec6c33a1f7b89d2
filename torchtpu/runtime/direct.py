"""A jitted program's executable, called without jax.jit's dispatch.

A strict cache hit calls the op's `jax.jit` function on buffers whose shapes and dtypes its
quick key has already fixed. jax.jit's C++ dispatch then does it all again: it parses the
arguments, flattens their pytree, reads JAX's configuration, builds and hashes a call
signature, looks it up in its cache, checks each array's layout, then executes and unflattens
the outputs. Measured on a 16x16 add (`python -m torchtpu.bench eager`'s op, one process,
best of 7 x 3000): the jitted call 4.7-4.9 us, the same executable's `execute_sharded` plus
its result handlers 3.3-3.6 us; in a whole strict `a + b` of ~11 us, the dispatch outside
PJRT's execute was ~22 % of the time (perf, call graphs).

`plan(fn, args)` lowers and compiles the jitted function for the arguments its first call
just compiled for, right after that call (launcher's `compiled` hook), while JAX's tracing,
lowering and compilation caches still answer without compiling (lowerings.shed() drops the
lowering next; asked after that, XLA compiles the program again), and keeps the executable,
its result handlers and output pytree: ~0.3 ms once per signature, and ~1-1.5 us less host
time on each hit. Nothing runs (asking jit's cache-miss handler instead would run the program
again, and a host callback in it: a fallback op ran twice). csrc/hit.cpp's serve() then calls
`execute_sharded(flat)`, `consume_with_handlers(handlers)` and `unflatten(outs)` itself.
Anything the fast path would not cover (effects, host callbacks, pruned or relaid-out
arguments, a non-array argument) plans None, and a call under another float32 matmul
precision than the plan's (jax.jit keys its cache on JAX's config, which follows torch's
setting) goes to the jitted function: those calls are served as before.
"""
from __future__ import annotations

import jax
import torch

try:  # JAX internals (jax is pinned; a different layout plans nothing)
    from jax._src.interpreters import pxla as _pxla
except ImportError:  # pragma: no cover
    _pxla = None


def plan(fn, args: tuple) -> tuple | None:
    """(execute_sharded, handlers, unflatten, precision, form) for calls of the jitted `fn` on
    arguments of the same types as `args` (the ones it just ran on) under torch's float32
    matmul precision now, or None."""
    if _pxla is None or not hasattr(fn, "lower"):
        return None
    leaves = jax.tree_util.tree_leaves(args)
    if not all(isinstance(x, jax.Array) for x in leaves):
        return None
    try:
        compiled = fn.lower(*args).compile()
        exe = compiled._executable
        call = exe.unsafe_call
    except Exception:
        return None
    if not isinstance(exe, _pxla.MeshExecutable) or not isinstance(call, _pxla.ExecuteReplicated) \
            or call.ordered_effects or call.has_unordered_effects or call.has_host_callbacks or call.mut \
            or len(exe._kept_var_idx) != len(leaves) or any(lay is not None for lay in exe._dispatch_in_layouts):
        return None
    return (call.xla_executable.execute_sharded, list(call.out_handler.handlers), compiled.out_tree.unflatten,
            _PRECISION[torch.get_float32_matmul_precision()], _flat_form(compiled.out_tree))


def _flat_form(tree) -> tuple | None:
    """(n, slots) where the program returns `((n arrays), {slot: array, ...}, None)`, an eager
    op's program (its outputs, its in-place writes, no check flags), its leaves in that order:
    csrc/hit.cpp then builds that from the executable's outputs without calling `unflatten`
    (a pytree call, ~3 % of a strict 16x16 add). None: another form, unflattened."""
    n = tree.num_leaves
    try:
        made = tree.unflatten(list(range(n)))
    except Exception:
        return None
    if not (type(made) is tuple and len(made) == 3 and type(made[0]) is tuple and type(made[1]) is dict
            and made[2] is None):
        return None
    outs, written = made[0], made[1]
    slots = tuple(written)
    if list(outs) + [written[s] for s in slots] != list(range(n)) or \
            not all(type(s) is int for s in slots) or jax.tree_util.tree_structure(made) != tree:
        return None
    return len(outs), slots


# torch's float32 matmul precision (at::Float32MatmulPrecision's order), which JAX's default
# matmul precision follows (runtime/precision.py): part of jax.jit's own cache key, so an
# executable planned under one setting is called only under it (csrc/hit.cpp compares)
_PRECISION = {"highest": 0, "high": 1, "medium": 2}
