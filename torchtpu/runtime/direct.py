"""A jitted program's executable, called without jax.jit's dispatch.

A strict cache hit calls the op's `jax.jit` function on buffers whose shapes and dtypes its
quick key has already fixed. jax.jit's C++ dispatch then does it all again: it parses the
arguments, flattens their pytree, reads JAX's configuration, builds and hashes a call
signature, looks it up in its cache, checks each array's layout, then executes and unflattens
the outputs. Measured on a 16x16 add (`python -m torchtpu.bench eager`'s op, one process,
best of 7 x 3000): the jitted call 4.7-4.9 us, the same executable's `execute_sharded` plus
its result handlers 3.3-3.6 us; in a whole strict `a + b` of ~11 us, the dispatch outside
PJRT's execute was ~22 % of the time (perf, call graphs).

`plan(fn, args)` asks jax.jit for what its own fast path keeps after a call (the executable,
its output avals, shardings and pytree) by calling the jitted function's cache-miss handler
once more with the arguments its first call compiled for: JAX's tracing, lowering and
compilation caches answer it without compiling (~0.5 us of host work is the saving per call;
~0.5 ms once per signature is the cost). csrc/hit.cpp's serve() then calls
`execute_sharded(flat)`, `consume_with_handlers(handlers)` and `unflatten(outs)` itself.
Anything the fast path would not cover (effects, constants, pruned or relaid-out arguments,
a non-array argument) plans None: the jitted function serves those calls as before.
"""
from __future__ import annotations

import jax

try:  # JAX internals (jax is pinned; a different layout plans nothing)
    from jax._src.interpreters import pxla as _pxla
except ImportError:  # pragma: no cover
    _pxla = None


def plan(fn, args: tuple) -> tuple | None:
    """(execute_sharded, handlers, unflatten) for calls of the jitted `fn` on arguments of the
    same types as `args` (the ones it just ran on), or None."""
    if _pxla is None or not hasattr(fn, "_cache_miss"):
        return None
    leaves = jax.tree_util.tree_leaves(args)
    if not all(isinstance(x, jax.Array) for x in leaves):
        return None
    try:
        _, fast, rebuild = fn._cache_miss(*args)
    except Exception:
        return None
    if fast is None or rebuild or len(fast.const_args) or len(fast.kept_var_bitvec) != len(leaves) \
            or not all(fast.kept_var_bitvec) or any(lay is not None for lay in fast.in_device_local_layouts):
        return None
    handlers = [_pxla.global_aval_to_result_handler(aval, sharding, committed)
                for aval, sharding, committed in zip(fast.out_avals, fast.out_shardings, fast.out_committed)]
    return (fast.xla_executable.execute_sharded, handlers, fast.out_pytree_def.unflatten)
