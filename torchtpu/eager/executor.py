"""Strict eager: each ATen op runs at once as its own compiled XLA executable.

A call is flattened into (storage buffers, tensor leaves, runtime scalars, static
arguments: eager/op_args.py). The static part is the cache key (runtime/signature.py) of
the op's executable (eager/op_program.py), which reads every input view out of its
storage buffer, runs the lowering and, for in-place ops, writes the result back into
the mutated storage, all inside one jax.jit. JAX's async dispatch keeps this
asynchronous. In defer_and_fuse mode the same executable is recorded instead of run
(eager/deferred.py).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.autograd import profiler as _tprof

from .. import metrics
from ..ops import checks as _checks
from ..ops.registry import Lowering
from ..runtime import cache as _exe_cache
from ..runtime import checks as _pending_checks
from ..runtime import direct, donation, launcher, leaf, pending, placement, precision, rng, tensors
from ..runtime.executables import clock
from ..runtime.executables import ops as _cache
from ..runtime.jaxenv import CARRIED as _CARRIED, CARRIED_SEEN as _CARRIED_SEEN
from ..runtime.signature import Signature
from . import argcheck, carried, deferred, extents, growth, memory_format, modes, scalars
from .op_args import Flat, flatten, scan
from .op_errors import describe, user_error
from .op_program import PACKED_DTYPES as _PACKED_DTYPES  # noqa: F401  (tests build avals with it)
from .op_program import Compiled, abstract, build, donating, empty_program, fast_compile, jit_packed, partial_writes
from .origin import user_frame, where
from .recordable import count_run

__all__ = ["execute", "cache_size", "clear_cache", "count_run", "Compiled", "jit_packed"]


_SPREAD = placement.SPREAD
_signature = tuple.__new__  # a Signature without NamedTuple's Python-level __new__ (per op call)


def _flush_for_precision():
    deferred.flush("matmul precision changed")


# eager/dynamism.py's execute, installed by torchtpu.mark_dynamic (it needs this module, so
# it plugs itself in rather than be imported here); it serves every call while tensors of a
# dim marked dynamic exist
dynamic = None
# eager/dynamism.py's vary_args, installed the same way: an index of index_select/embedding/
# x[..., idx] whose length keeps changing becomes dynamic before the call, a copy_ source padded
vary_args = None
_VARYING_ARGS = frozenset({"index_select", "embedding", "index.Tensor", "copy_"})
# eager/dynamism.py's vary_factory: arange(n) whose length keeps changing, dynamic
vary_factory = None
# the "dynamic" interceptor again, and the storages dynamic tensors live in ("marked"), where
# csrc/hit.cpp's gate reads them: while the interceptor is on, a call none of whose tensors is
# over such a storage is served there as usual (else execute() hands it to the interceptor)
DYNAMIC = [None, None]


def intercept(name: str, fn) -> None:
    """Install (None: remove) an interceptor: code of a layer above that must see calls of
    this one (eager/dynamism.py needs the executor, so it plugs in here instead of being
    imported). The only way interceptors are set:

    - "dynamic":      fn(low, args, kwargs, serve, execute) serves every op call while tensors
                      of a dynamic dim exist
    - "vary_args":    fn(low, args, kwargs) -> args, for index_select/embedding/copy_: an index
                      whose length keeps changing becomes dynamic before the call; a small
                      source copied into views of varying extent is padded to their bucket
    - "vary_factory": fn(low, args, kwargs, run) -> result or None, for arange: a range whose
                      length keeps changing is made over its bucket and handed back dynamic
    - "grow_dynamic": fn(low, a, b, d, run) serves a cat growing a tensor (eager/growth.py)
    - "on_grown":     fn(t, d, n, bucket, step) after a bucketed growth (eager/growth.py)
    - "after_flush":  fn() after each defer_and_fuse region (eager/deferred.py)
    - "marked":       not a function: the dict whose keys are weak references to the storage
                      entries dynamic tensors live in (eager/dynamism.py's WeakKeyDictionary's)
    """
    global dynamic, vary_args, vary_factory
    if name == "dynamic":
        dynamic = DYNAMIC[0] = fn
    elif name == "vary_args":
        vary_args = fn
    elif name == "vary_factory":
        vary_factory = fn
    elif name in ("grow_dynamic", "on_grown"):
        growth.intercept(name, fn)
    elif name == "after_flush":
        deferred.intercept(name, fn)
    elif name == "marked":
        DYNAMIC[1] = fn
    else:
        raise ValueError(f"executor.intercept: no interceptor named {name!r}")


def execute(low: Lowering, args, kwargs):
    if not _CARRIED_SEEN[0]:
        # no carried dtype (complex32, uint4, ...) in the process yet, so the kernel entries did
        # not look for one: a call that names the first (dtype=torch.complex32, float16 promoted
        # with a complex scalar) had its lowering compute on the carrier; its kernel entry
        # serves it again through eager/carried.py (a dtype= one before it runs: a deferred
        # call traces nothing when recorded)
        if kwargs and kwargs.get("dtype") in _CARRIED:
            _CARRIED_SEEN[0] = True
            raise carried.FirstSeen(low.name)
        try:
            res = _execute_placed(low, args, kwargs)
        except Exception:
            if _CARRIED_SEEN[0] and carried.involved(args, kwargs):
                raise carried.FirstSeen(low.name) from None
            raise
        if _CARRIED_SEEN[0] and carried.involved(args, kwargs):
            raise carried.FirstSeen(low.name)
        return res
    return _execute_placed(low, args, kwargs)


def _execute_placed(low: Lowering, args, kwargs):
    if _SPREAD[0] or (kwargs and placement.names_other(kwargs.get("device"))):
        # more than tpu:0 in use: the call runs on its tensors' (or its device='s) device
        with placement.on(placement.call_index(low.name, args, kwargs)):
            return _execute_here(low, args, kwargs)
    return _execute_here(low, args, kwargs)


def _execute_here(low: Lowering, args, kwargs):
    if vary_args is not None and low.name in _VARYING_ARGS:
        args = vary_args(low, args, kwargs)
    if dynamic is not None:
        return dynamic(low, args, kwargs, _serve, _execute)
    return _serve(low, args, kwargs)


def _serve(low: Lowering, args, kwargs):
    name = low.name
    if name == "cat":  # a tensor growing token by token: see eager/growth.py
        return growth.cat(low, args, kwargs, _execute)
    if name == "arange" and vary_factory is not None:  # a range whose length keeps changing
        got = vary_factory(low, args, kwargs, _execute)
        if got is not None:
            return got
    return _execute(low, args, kwargs)


# A call's quick key (op_args.scan) finds a signature seen before from its tensors' metadata,
# without building its Signature: the op cache's by_quick_key.
_quick = _cache.by_quick_key
_MODE = modes.state
_chit = tensors.hit  # csrc/hit.cpp: a planned strict hit in one C++ call (None: not built)
_crec = tensors.record  # csrc/record.h: a planned defer_and_fuse record in one C++ call
_Bucketed = extents.Bucketed


def _execute(low: Lowering, args, kwargs):
    precision.sync(_flush_for_precision)  # float32 matmul precision: part of every jit's key
    q = None
    if not low.random and not _SPREAD[0]:
        q = scan(low, args, kwargs, (low.name, low.mode, _checks.enabled_cell[0], torch.get_default_dtype()))
        if q is not None:
            compiled = _quick.get(q[0])
            if compiled is not None:
                hit = _quick_hit(low, compiled, q[1], args, kwargs)
                if hit is not _SLOW:
                    return hit
    return _full(low, args, kwargs, q)


def _quick_hit(low, compiled, flat, args, kwargs):
    """Serve a call found by its quick key (`flat` has no leaves); _SLOW: the full path must."""
    if flat.offsets:
        flat.dyn += flat.offsets
    if type(compiled) is _Bucketed:  # a view written over its bucket: the true sizes ride last
        if not compiled.fits(flat.offsets):
            return _SLOW
        flat.dyn += compiled.sizes
        metrics.bump("bucketed_view_ops")
        compiled = compiled.compiled
    elif compiled.hit and _MODE["mode"] == "strict" and not _tprof._is_profiler_enabled:
        hit = _chit(compiled, flat.entries, scalars.pack_cached(flat.dyn, compiled.fn.codes))
        if hit is not NotImplemented:
            return _finish(low, compiled, args, kwargs, None) if low.mode == "inplace" else hit
    return _launch(low, compiled, flat, args, kwargs, None, quick=True)


def resume(low: Lowering, args, kwargs, key, compiled, entries, offsets, dyn, tensors):
    """A call csrc/hit.cpp's fast() walked and did not serve: on from its quick key (`compiled`
    found by it, or None), as execute() goes on from there."""
    try:
        if compiled is not None:
            if type(compiled) is not _Bucketed and compiled.updated is not None and _MODE["mode"] == "defer_and_fuse":
                # recorded (what _launch does for a traced signature, without a Flat)
                compiled.used = next(clock)
                if offsets:
                    dyn += offsets
                res = _record(low, compiled, entries, dyn, args, kwargs)
            else:
                res = _quick_hit(low, compiled, Flat.scanned(entries, offsets, dyn, tensors), args, kwargs)
                if res is _SLOW:
                    res = _full(low, args, kwargs, (key, None))
        else:
            res = _full(low, args, kwargs, (key, None))
    except Exception:
        if _CARRIED_SEEN[0] and carried.involved(args, kwargs):
            raise carried.FirstSeen(low.name) from None
        raise
    if _CARRIED_SEEN[0] and carried.involved(args, kwargs):
        raise carried.FirstSeen(low.name)
    return res


def _full(low: Lowering, args, kwargs, q):
    """The call flattened whole: its Signature, its executable (built on a miss), its run.
    `q`: its quick key (None: it has none), remembered for the signature."""
    gen = None
    if low.random:  # a generator= is state, not part of the program: its seed/offset are inputs
        args, kwargs, gen = rng.split_generator(args, kwargs)
    flat, pos, kw = flatten(low, args, kwargs)
    # a view whose extent varies: its program runs over a bucket, the true sizes ride last
    bucketed = extents.plan(low, flat, pos, kw) if low.mode == "inplace" else None
    if flat.offsets:
        flat.dyn += flat.offsets
    if bucketed is not None:
        flat.leaves, bucketed, sizes, planned = bucketed
        flat.dyn += sizes
    entries = flat.entries
    store_specs = flat.specs()
    inited = tuple([e.buf is not None for e in entries])
    # the default dtype decides result dtypes (uint8 + 5.5, int / int, 1j * x): part of the key
    key = _signature(Signature, (low.name, low.mode, pos, kw, tuple(flat.leaves), store_specs, inited,
                                 (_checks.enabled_cell[0], torch.get_default_dtype(), bucketed)))
    compiled = _cache.get(key)
    if compiled is None:
        cplx = argcheck.complex_into_real(args, kwargs)
        if low.own_schema or cplx:  # CPU's argument checks, once per signature
            argcheck.check(low.overload, args, kwargs, ask_cpu=cplx)
        else:
            argcheck.check_dtypes(low.overload, args, kwargs)
        compiled = Compiled()
        compiled.key = key
        compiled.program = build(low, pos, kw, flat.leaves, store_specs, compiled,
                                 memory_format.result_strides(low, args, kwargs), bucketed)
        compiled.fn = jit_packed(compiled.program, scalars.layout(flat.dyn), fast_compile(compiled), compiled)
        _cache.admit(key, compiled)
    res = _launch(low, compiled, flat, args, kwargs, gen)
    if q is not None:
        # a view written exact or bucketed runs the same way at its next call of these sizes
        # (extents.varying decides per distinct shape), so its quick key may skip the plan
        _cache.remember(q[0], key, compiled, None if bucketed is None else _Bucketed(compiled, sizes, planned))
    return res


_SLOW = object()  # _launch: this hit needs the full path (state the executable lacks yet)


def _launch(low, compiled, flat, args, kwargs, gen, quick=False):
    """Run (strict) or record (defer_and_fuse) the call's executable. `quick`: found by the
    quick key, so `flat` has no leaves: what needs them (the first run of the executable in
    this mode) answers _SLOW instead."""
    compiled.used = next(clock)
    if modes.state["mode"] == "defer_and_fuse":
        if compiled.updated is None:
            if quick:
                return _SLOW
            try:
                abstract(compiled, flat.entries, low.random)
            except Exception as err:
                _cache.drop(compiled.key)
                raise user_error(err, low, flat.tensors, args, kwargs) from err
        if compiled.rec and not _SPREAD[0]:  # (a call fast() did not take: a carried dtype seen, say)
            outs = _crec(compiled, flat.entries, flat.dyn, low.name)
            if outs is not NotImplemented:
                return _finish(low, compiled, args, kwargs, None) if low.mode == "inplace" else outs
        return _record(low, compiled, flat.entries, flat.dyn, args, kwargs, gen)
    if quick and compiled.partial is None:
        return _SLOW
    return _run_strict(low, compiled, compiled.key, flat, args, kwargs, gen)


def _record(low, compiled, entries, dyn, args, kwargs, gen=None):
    """defer_and_fuse's record in Python (deferred.record); the signature's later records are
    planned for csrc/record.h."""
    outs = deferred.record(compiled, entries, dyn, low, gen)
    if compiled.rec is None and _crec is not None:
        compiled.rec = _plan_record(low, compiled)
    return _finish(low, compiled, args, kwargs, outs)


def _run_strict(low, compiled, key, flat, args, kwargs, gen=None):
    mode = modes.state["mode"]
    entries = flat.entries
    rngdata = rng.next_key_data(gen) if low.random else ()
    bufs = tuple([pending.concrete(e, "strict_op") for e in entries])
    donate = ()
    if compiled.partial is None:
        compiled.partial = partial_writes(low, key.pos, key.kw, flat.leaves, entries) \
            if low.mode == "inplace" and low.mutated else ()
        compiled.donating = {}
    if compiled.partial:
        # held by the tuple and the storage entry only
        donate = tuple(i for i in compiled.partial if donation.exclusively_held(bufs, i, holders=1))
    what = lambda: describe(low, flat.tensors)  # noqa: E731  (only on the slow paths)
    try:
        if not compiled.ran and empty_program(compiled, entries, low.random):
            compiled.ran = True  # (no program to compile: its runs count as hits)
        if donate:
            kept = list(bufs)
            bufs = None
            donated = donation.split(kept, donate)
            outs, updated, flags = launcher.launch(
                donating(compiled, donate), (donated, kept, scalars.pack_cached(flat.dyn, compiled.fn.codes), rngdata),
                what, not compiled.ran, _RELEASE, _release_all, low.name,
                None if compiled.ran else (_cache, key))
            del donated
            metrics.bump("donated_writes")
        else:
            call = (bufs, scalars.pack_cached(flat.dyn, compiled.fn.codes), rngdata)
            outs, updated, flags = launcher.launch(
                compiled.fn, call,
                what, not compiled.ran, _RELEASE, _release_all, low.name,
                None if compiled.ran else (_cache, key),
                None if low.random or _chit is None else functools.partial(_plan_direct, compiled, call))
        if mode == "debug":
            jax.block_until_ready((outs, updated))
            if modes.debug_nans():
                _check_nans(low, flat, outs, updated)
    except torch.OutOfMemoryError:
        _cache.drop(key)
        raise
    except Exception as err:
        _cache.drop(key)
        raise user_error(err, low, flat.tensors, args, kwargs) from err
    count_run(compiled)
    metrics.bump("executions")
    if compiled.updated is None:
        compiled.updated = tuple(sorted(updated))
    if low.mode == "inplace":
        leaf.commit(entries, updated)
        if flags is not None:
            _flagged(compiled, mode, [(entries[s], b) for s, b in updated.items()], flags)
        elif compiled.hit is None and _chit is not None and not low.random and not compiled.checks \
                and not compiled.partial:
            compiled.hit = _plan_in_place(low, compiled)
        return _finish(low, compiled, args, kwargs, None)
    if compiled.structure == "none":
        if flags is not None:  # an assertion (_assert_async): a check and nothing else
            _flagged(compiled, mode, [], flags)
        return None
    it = iter(outs)
    if flags is None:
        results = [None if o is None else tensors.empty(o[0], o[1], next(it), o[2]) for o in compiled.outs]
        if compiled.hit is None and _chit is not None and not low.random and not compiled.checks:
            compiled.hit = _plan_hit(compiled)
        return _finish(low, compiled, args, kwargs, results)
    results, written = [], []
    for o in compiled.outs:
        if o is None:
            results.append(None)
            continue
        t, e = tensors.empty_with_entry(o[0], o[1], next(it), o[2])
        results.append(t)
        written.append((e, e.buf))
    _flagged(compiled, mode, written, flags)
    return _finish(low, compiled, args, kwargs, results)


# Calls csrc/hit.cpp's gate sends to execute() whatever their arguments: their executor
# path looks at them before the quick key (eager/growth.py's cat, a varying arange or index).
_OWN_PATH = _VARYING_ARGS | {"cat", "arange"}


def fast_path(low: Lowering):
    """(fast, state): `fast(state, args, kwargs)` serves a call of `low` whole in C++ where it
    is a planned strict cache hit, hands it to resume() with its quick key where not, and
    answers NotImplemented where execute() must see it first; None: execute() serves every
    call of `low` (a random op, one with its own path, or the extension was not built)."""
    if _fast is None or low.random or low.name in _OWN_PATH:
        return None
    return _fast, (low, low.name, low.mode, low.scan_info)


def _configure_fast():
    if _chit is None:
        return None
    from ..runtime import _hit
    from ..runtime.jaxenv import CARRIED
    _hit.configure_fast(_quick, _MODE, _SPREAD, _CARRIED_SEEN, DYNAMIC, _checks.enabled_cell, CARRIED,
                        _tprof, lambda: precision.sync(_flush_for_precision), scalars.pack_cached,
                        resume, torch.get_float32_matmul_precision,
                        functools.partial(np.asarray, dtype=np.int64), _Bucketed, scalars.exact_packs())
    return _hit.fast


# graph_fast(quick, args): a compiled graph's call in one C++ call (compile/runtime.py; the
# gate above is configured here, where the eager kernels configure it)
graph_fast = None if _chit is None else tensors.native_graph_fast


_STRUCTURES = {"one": 0, "tuple": 1, "list": 2}


def _plan_hit(compiled):
    """What csrc/hit.cpp needs to serve the op's later strict hits (its functional outputs of
    dtypes stored as themselves, no check flags, no random state), or False: the Python path
    serves them."""
    plan = []
    for o in compiled.outs:
        if o is None:
            plan.append(None)
            continue
        shape, dtype, strides = o
        jdt = tensors.PLAIN.get(dtype)
        if jdt is None:
            return False
        plan.append((tuple(shape), dtype, jdt, math.prod(shape), None if strides is None else tuple(strides)))
    return (compiled.fn, tuple(plan), _STRUCTURES[compiled.structure], compiled.fn.codes, -1, None,
            compiled.direct)


def _plan_direct(compiled, call):
    """At the program's compile, while JAX holds its lowering: how a hit calls its executable
    without jax.jit's dispatch (runtime/direct.py), or None. Not asked for a signature that
    gets no hit plan (device-side checks, a partial in-place write: known once it traced)."""
    if not compiled.checks and not compiled.partial:
        compiled.direct = direct.plan(compiled.fn, call)


def _plan_record(low, compiled):
    """What csrc/record.h needs to record the op's later calls in defer_and_fuse: (outs as
    _plan_hit's, structure, updated as ((slot, ("u", slot)), ...), returned, name), or False:
    deferred.record records them (a random op, an assertion, an output of a carried dtype)."""
    if low.random:
        return False
    if low.mode == "inplace":
        i = low.returned_index
        name = low.mutated[0] if low.mutated and i >= 0 else None
        return ((), 3, tuple((s, ("u", s)) for s in compiled.updated), i, name)
    if compiled.outs is None or compiled.structure == "none":
        return False
    hit = _plan_hit(compiled)
    return False if hit is False else (hit[1], hit[2], (), -1, None)


def _plan_in_place(low, compiled):
    """_plan_hit for an in-place op (no donation: it writes no part of a big storage): the
    program's writes become its storages' buffers, the written argument is the result."""
    i = low.returned_index  # (-1: returns nothing; past the call's positional arguments: by name)
    return (compiled.fn, (), 3, compiled.fn.codes, i, low.mutated[0] if i >= 0 else None, compiled.direct)


def cache_size() -> int:
    return len(_cache)


def clear_cache() -> None:
    """Drop every strict op executable (and the fused regions built over them)."""
    _cache.clear()


_RELEASE = (clear_cache,)  # what a compile on a short heap may drop first


def _release_all() -> int:
    """Out of memory compiling or running an op: give back every cached executable; how many."""
    n = cache_size()
    clear_cache()
    _exe_cache.evict({}, ())
    return n


def _flagged(compiled, mode, writes, flags) -> None:
    """Keep the op's check flags for the next host read (at once in debug mode)."""
    _pending_checks.add(flags, compiled.checks, where(user_frame()), writes)
    if mode == "debug":
        _pending_checks.raise_pending()


def _finish(low, compiled, args, kwargs, results):
    if low.mode == "inplace":
        i = low.returned_index
        if i < 0:
            return None
        return args[i] if i < len(args) else kwargs[low.mutated[0]]
    structure = compiled.structure
    if structure == "none":
        return None
    if structure == "one":
        return results[0]
    return tuple(results) if structure == "tuple" else list(results)


def _check_nans(low, flat, outs, updated) -> None:
    for o in list(outs) + list(updated.values()):
        if jnp.issubdtype(o.dtype, jnp.inexact) and not bool(jnp.isfinite(o).all()):
            raise FloatingPointError(
                f"torchtpu debug: {describe(low, flat.tensors)} produced NaN or Inf (TORCHTPU_DEBUG_NANS=1)"
            )


_fast = _configure_fast()
