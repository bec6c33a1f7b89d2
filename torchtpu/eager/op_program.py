"""One op signature's program and its executables (the strict executor's unit of caching).

The program reads every input view out of its storage buffer, runs the lowering,
and either returns the outputs flat or (in-place ops) casts the result to the
mutated tensor's dtype and writes it into its storage, all inside one jax.jit. The
same traceable program is a node of defer_and_fuse regions (eager/recordable.py).
"""
from __future__ import annotations

import math
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import metrics
from ..config import startup
from ..ops import checks as _checks
from ..ops import registry
from ..ops._common import scalar_type_name
from ..ops.registry import Lowering
from ..runtime import cache as _caches
from ..runtime import donation, rng
from ..runtime import executables as _executables
from ..runtime import leaf as _leaf
from ..runtime.jaxenv import to_torch_dtype
from . import extents, memory_format, scalars
from .op_args import TENSOR, decode, target_specs


class Compiled:
    """An op signature's executable and what tracing it learned (a Recordable)."""

    __slots__ = ("fn", "program", "outs", "structure", "updated", "ran", "key", "partial", "donating", "checks", "used", "hit", "direct", "rec", "__weakref__")

    def __init__(self):
        self.fn = None  # jax.jit(program), compiled on first strict call
        self.program = None  # the traceable function, reused inside fused regions
        self.outs = None  # [(shape, torch dtype, strides or None: contiguous)] of functional outputs
        self.structure = None  # "none" | "one" | "tuple" | "list"
        self.updated = None  # storage indices an in-place op writes (known after a trace)
        self.ran = False  # fn has run once (so XLA compiled it): later runs are cache hits
        self.key = None  # its runtime/signature.Signature: the cache key
        self.partial = None  # storages an in-place op writes only part of, in big buffers
        self.donating = None  # donation pattern -> jit that may overwrite those buffers
        self.checks = ()  # the device-side checks its lowering declared (learned at trace)
        self.used = 0  # the op clock at its last call: the cache evicts the least recent
        self.hit = None  # (fn, outs, structure): its strict cache hit in C++ (executor._plan_hit)
        self.direct = None  # fn's executable's call without jax.jit's dispatch (runtime/direct.py)
        self.rec = None  # (outs, structure, updated, ...): its defer_and_fuse record in C++ (executor._plan_record)

    def shape_free_key(self):
        """The signature without sizes, strides and offsets (runtime/signature.py)."""
        return self.key.shape_free()


def _cast_to(x, dtype, op_name, target_name):
    src = to_torch_dtype(x.dtype)
    dst = to_torch_dtype(dtype)
    if src != dst and not torch.can_cast(src, dst):
        raise RuntimeError(
            f"{op_name}: result type {_pretty(src)} can't be cast to the desired output type "
            f"{_pretty(dst)} (argument '{target_name}')"
        )
    return x.astype(dtype)


def _pretty(dt: torch.dtype) -> str:
    return scalar_type_name(dt)


def build(low: Lowering, pos, kw, leaves, store_specs, compiled: Compiled, layouts=None, bucketed=None):
    """The op's traceable program over (storage buffers, runtime scalars, rng data).
    `layouts`: per output, (shape, strides) CPU lays it out in where not contiguous
    (eager/memory_format.py); such an output leaves in that physical order. `bucketed`: an
    in-place op over bucket windows (eager/extents.py), the true sizes riding last."""
    mode = low.mode
    nruntime = sum(1 for lf in leaves if lf.offset is None)
    nsizes = bucketed[3] if bucketed is not None else 0
    # a weak reference: the executable (compiled.fn) holds this closure, and a cycle would
    # keep an evicted executable's compiled code alive until a full garbage collection
    ref = weakref.ref(compiled)

    def program(bufs, scalars, rngdata):
        compiled = ref() or Compiled()  # (gone: a trace whose findings nobody reads)
        bufs = list(bufs)
        for i, (numel, bdt) in enumerate(store_specs):
            if bufs[i] is None:
                bufs[i] = jnp.zeros((numel,), bdt)
        if nsizes:  # a bucketed call's true sizes ride last
            scalars, sizes = scalars[:len(scalars) - nsizes], scalars[len(scalars) - nsizes:]
        if nruntime:  # runtime offsets ride after the op's own scalars
            scalars, ofs = scalars[:len(scalars) - nruntime], iter(scalars[len(scalars) - nruntime:])
            offsets = [lf.offset if lf.offset is not None else next(ofs) for lf in leaves]
        else:
            offsets = [lf.offset for lf in leaves]
        kept = None
        if nsizes:
            ti, pads, fits, _ = bucketed
            got = [extents.read(bufs, lf, off, p, f, sizes)
                   for lf, off, p, f in zip(leaves, offsets, pads, fits)]
            vals = [g[0] for g in got]
            kept = got[ti][1:]  # the written window as stored, and its true extent
        else:
            vals = [_leaf.read(bufs, lf, off) for lf, off in zip(leaves, offsets)]
        it = iter(scalars)
        args = [decode(s, vals, it) for s in pos]
        kwargs = {name: decode(s, vals, it) for name, s in kw}
        result = registry.apply(low, args, kwargs, rng.key(*rngdata) if low.random else None)
        if mode == "inplace":
            return (), _write_back(low, result, pos, kw, leaves, offsets, bufs, kept)
        if result is None:
            compiled.structure = "none"
            return (), {}
        if isinstance(result, (tuple, list)):
            compiled.structure = "tuple" if isinstance(result, tuple) else "list"
            outs = list(result)
        else:
            compiled.structure = "one"
            outs = [result]
        # None inside a tuple is an output not asked for (output_mask): an undefined tensor
        outs = [None if o is None else jnp.asarray(o) for o in outs]
        compiled.outs = [None if o is None else (tuple(o.shape), to_torch_dtype(o.dtype), None) for o in outs]
        if layouts is not None:
            outs = _lay_out(compiled, outs, layouts)
        return tuple(o.reshape(-1) for o in outs if o is not None), {}

    return program


def _lay_out(compiled, outs, layouts):
    """Each output with a layout in its physical order; compiled.outs carries its strides."""
    for i, (o, layout) in enumerate(zip(outs, layouts)):
        if o is not None and layout is not None and layout[0] == o.shape:
            outs[i] = memory_format.physical(o, layout[1])
            compiled.outs[i] = compiled.outs[i][:2] + (layout[1],)
    return outs


def _write_back(low, result, pos, kw, leaves, offsets, bufs, kept=None):
    """Write in-place results into their storages; returns the updated buffers. `kept`: (the
    written window as stored, its true extent's mask) of a bucketed call: the padding keeps
    its values."""
    target = low.mutated[0]
    targets, single = target_specs(low, pos, kw)
    results = [result] if single else list(result)
    touched = {}
    for tspec, r in zip(targets, results):
        lf = leaves[tspec[1]]
        shape = lf.shape
        r = jnp.asarray(r)
        if r.shape != shape:
            try:
                bshape = jnp.broadcast_shapes(r.shape, shape)
            except ValueError:
                bshape = None
            if bshape != shape:
                raise RuntimeError(
                    f"{low.name}: output with shape {list(shape)} doesn't match the broadcast "
                    f"shape {list(bshape or r.shape)}"
                )
        r = _cast_to(r, lf.dtype, low.name, target)
        if kept is not None:
            r = jnp.where(kept[1], jnp.broadcast_to(r, shape), kept[0])
        _leaf.write(bufs, lf, r, offsets[tspec[1]])
        touched[lf.slot] = True
    return {s: bufs[s] for s in touched}


PACKED_DTYPES = tuple(np.dtype(d) for d in scalars.DTYPES)
_RNG_AVALS = (jax.ShapeDtypeStruct((), np.uint32),) * 3


def abstract(compiled: Compiled, entries, random: bool) -> None:
    """Learn output shapes/dtypes and written storages by tracing once, without running.

    Traced through the op's own jit with the avals a later call will have, so a strict
    call (or a per-op replay of a region) reuses this trace instead of tracing again."""
    _, updated, _ = _out_info(compiled, entries, random)
    compiled.updated = tuple(sorted(updated))
    metrics.bump("abstract_evals")


def _out_info(compiled: Compiled, entries, random: bool) -> tuple:
    """(outputs, updated storages, check flags) of one call, as avals, by tracing its jit."""
    bufs = tuple(
        None if e.buf is None else jax.ShapeDtypeStruct((e.numel,), e.dtype) for e in entries
    )
    counts = [0, 0, 0, 0]
    for c in compiled.fn.codes:
        counts[c] += 1
    packed = tuple(
        jax.ShapeDtypeStruct((n,), PACKED_DTYPES[k]) if n else None for k, n in enumerate(counts)
    ) if any(counts) else None  # (eager/scalars.pack: no scalars pack to None)
    return compiled.fn.trace(bufs, packed, _RNG_AVALS if random else ()).out_info


class EmptyProgram:
    """An op executable whose every input and output has no elements: its results are
    empty buffers put on the device, with no XLA program compiled. FakeTensorMode runs ops
    on a graph's constant tensors for real while Dynamo traces (a model's `torch.tensor([])`
    cloned and lifted: two programs compiled per traced graph), and empty caches and masks
    reach eager ops the same way; each was a compile (tens of ms on XLA:CPU) for nothing."""

    __slots__ = ("jitted", "codes", "outs", "updated")

    def __init__(self, jitted, outs, updated):
        self.jitted = jitted  # the op's jit, for what traces it (abstract, regions)
        self.codes = jitted.codes
        self.outs = tuple(None if o is None else (o.shape, o.dtype) for o in outs)
        self.updated = {s: (u.shape, u.dtype) for s, u in updated.items()}

    def trace(self, *args):
        return self.jitted.trace(*args)

    def __call__(self, bufs, packed, rngdata):
        from ..runtime import placement

        device = placement.jax_device()
        put = lambda shape, dtype: jax.device_put(np.empty(shape, dtype), device)  # noqa: E731
        return (tuple(None if o is None else put(*o) for o in self.outs),
                {s: put(*u) for s, u in self.updated.items()}, None)


def empty_program(compiled: Compiled, entries, random: bool) -> bool:
    """Before an executable's first strict run: whether it is an EmptyProgram now (no
    element in, none out, no random state, no check flags)."""
    if random or any(e.numel for e in entries if e.buf is not None):
        return False
    outs, updated, flags = _out_info(compiled, entries, random)
    if flags is not None or any(o is not None and math.prod(o.shape) for o in (*outs, *updated.values())):
        return False
    compiled.fn = EmptyProgram(compiled.fn, outs, updated)
    metrics.bump("empty_programs")
    return True


# An op whose shapes keep changing (attention over a KV cache that grows each decoded
# token) compiles a new executable per shape, each run a few times at most. From the
# FAST_AFTER-th shape of one op on, those compile without LLVM's optimizations: a third
# less XLA compile time for programs whose run time is dispatch anyway. On XLA:CPU they
# also take the older loop emitters instead of the MLIR fusion emitters, which cost 2-3x
# the compile time of a one-op program (x * 0.5: 23 vs 11 ms; q @ k.T + softmax: 62 vs
# 24 ms, both at -O0) and whose run-time gains do not matter for a program run a few times.
FAST_AFTER = startup.fast_compile_after
_FAST_OPTIONS = {"xla_backend_optimization_level": 0}
_FAST_OPTIONS_CPU = dict(_FAST_OPTIONS, xla_cpu_use_fusion_emitters=False)
shapes_seen: dict = _caches.register("eager op shapes seen", {})  # shape-free key -> executables made for it
_executables.ops.on_clear(shapes_seen.clear)


def fast_options() -> dict:
    """XLA compiler options for a program run a few times at most (see FAST_AFTER)."""
    from ..runtime.jaxenv import platform

    return _FAST_OPTIONS_CPU if platform() == "cpu" else _FAST_OPTIONS


def jit_packed(program, codes, fast: bool = False, compiled: Compiled | None = None):
    """jax.jit of `program` taking its runtime scalars packed (see eager/scalars.py);
    it returns (outputs, updated storages, packed device-side check flags or None)."""

    ref = weakref.ref(compiled) if compiled is not None else None  # no cycle: see build

    def packed_program(bufs, packed, rngdata):
        return _with_checks(ref() if ref is not None else None, program, bufs,
                            tuple(scalars.unpack(packed, codes)), rngdata)

    fn = jax.jit(packed_program, compiler_options=fast_options()) if fast else jax.jit(packed_program)
    fn.codes = codes
    return fn


def _with_checks(compiled, program, bufs, scalars_, rngdata):
    """Trace `program` collecting its lowering's device-side checks into one flag output."""
    with _checks.collect() as c:
        outs, updated = program(bufs, scalars_, rngdata)
    if c is None:
        return outs, updated, None
    if compiled is not None:
        compiled.checks = tuple(c.checks)
    return outs, updated, c.packed()


def fast_compile(compiled: Compiled) -> bool:
    """Whether this new executable compiles without optimizations (see FAST_AFTER)."""
    skey = compiled.shape_free_key()
    n = shapes_seen[skey] = shapes_seen.get(skey, 0) + 1
    if n > FAST_AFTER:
        metrics.bump("fast_compiles")
        return True
    return False


# An in-place write into part of a big storage (a gradient copied into DDP's bucket, a
# KV-cache slot) builds a whole new buffer unless XLA may overwrite the old one. When
# nothing but the storage holds the old buffer, hand it over (donate) and the write costs
# the view's size, not the storage's.
DONATE_MIN_ELEMENTS = 1 << 16


def partial_writes(low: Lowering, pos, kw, leaves, entries) -> tuple:
    """Storages the in-place op writes through a view smaller than a big storage."""
    out = set()
    for tspec in target_specs(low, pos, kw)[0]:
        if tspec is None or tspec[0] != TENSOR:
            continue
        lf = leaves[tspec[1]]
        e = entries[lf.slot]
        if e.numel >= DONATE_MIN_ELEMENTS and math.prod(lf.shape) < e.numel:
            out.add(lf.slot)
    return tuple(sorted(out))


def donating(compiled: Compiled, donate: tuple):
    """The op's executable that may overwrite the buffers at the slots in `donate`."""
    fn = compiled.donating.get(donate)
    if fn is None:
        program, codes = compiled.program, compiled.fn.codes
        ref = weakref.ref(compiled)

        def packed_program(donated, kept, packed, rngdata):
            bufs = donation.merge(donated, kept, donate)
            return _with_checks(ref(), program, tuple(bufs), tuple(scalars.unpack(packed, codes)), rngdata)

        fn = compiled.donating[donate] = jax.jit(packed_program, donate_argnums=(0,))
    return fn
