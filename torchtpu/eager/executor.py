"""Strict eager: each ATen op runs at once as its own compiled XLA executable.

A call is flattened into (storage buffers, tensor geometries, runtime scalars,
static arguments). The static part is the cache key; the executable reads every
input view out of its storage buffer, runs the lowering, casts to PyTorch's
result dtype and, for in-place ops, writes the result back into the mutated
storage, all inside one jax.jit. JAX's async dispatch keeps this asynchronous.
"""
from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import metrics
from ..ops import registry
from ..ops.registry import Lowering
from ..ops import checks as _checks
from ..runtime import checks as _pending_checks
from ..runtime import cache as _exe_cache
from ..runtime import donation, geometry, precision, program_timing, rng, storage, tensors
from . import argcheck, deferred, growth, modes, scalars
from ..runtime.jaxenv import TORCH_TO_JAX as _T2J
from ..runtime.jaxenv import to_jax_dtype, to_torch_dtype
from ..runtime.storage import _table

_SCALARS = (bool, int, float, complex)


class _Compiled:
    __slots__ = ("fn", "program", "outs", "structure", "updated", "ran", "key", "partial", "donating", "checks", "used", "__weakref__")

    def __init__(self):
        self.fn = None  # jax.jit(program), compiled on first strict call
        self.program = None  # the traceable function, reused inside fused regions
        self.outs = None  # [(shape, torch dtype)] of functional outputs
        self.structure = None  # "none" | "one" | "tuple" | "list"
        self.updated = None  # storage indices an in-place op writes (known after a trace)
        self.ran = False  # fn has run once (so XLA compiled it): later runs are cache hits
        self.key = None  # the cache key (geometry, static args): see shape_free_key
        self.partial = None  # storages an in-place op writes only part of, in big buffers
        self.donating = None  # donation pattern -> jit that may overwrite those buffers
        self.checks = ()  # the device-side checks its lowering declared (learned at trace)
        self.used = 0  # the op clock at its last call: the cache evicts the least recent

    def shape_free_key(self):
        """The cache key without sizes, strides and offsets: calls of one op that differ
        only in geometry share it (a growing KV cache gives one such key many keys)."""
        name, mode, pos, kw, leaves, specs, inited = self.key[:7]
        return (name, mode, pos, kw, tuple((lf[0], len(lf[1]), lf[4]) + lf[5:] for lf in leaves),
                tuple(sp[1] for sp in specs), inited) + self.key[7:]


_cache: dict = {}
_cache_lock = threading.Lock()


class _HostEntry:
    """A 0-dim CPU tensor used as an operand: it rides along as a device value."""

    __slots__ = ("buf", "numel", "dtype")

    def __init__(self, t: torch.Tensor):
        from ..runtime.jaxenv import torch_to_numpy

        a = torch_to_numpy(t.reshape(1))
        self.buf = jnp.asarray(a)
        self.numel = 1
        self.dtype = self.buf.dtype


class _Flat:
    """One call, flattened."""

    __slots__ = ("entries", "entry_index", "leaves", "dyn", "tensors", "offsets")

    def __init__(self):
        self.entries = []
        self.entry_index = {}
        self.leaves = []
        self.dyn = []
        self.tensors = []
        self.offsets = []  # nonzero storage offsets of the leaves whose offset is None

    def tensor(self, t: torch.Tensor, low: Lowering):
        if t.is_cpu:
            if t.dim() != 0:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, tpu:0 and cpu! (when checking arguments for {low.name})"
                )
            entry = _HostEntry(t)
            shape, stride, offset = (), (), 0
        else:
            try:
                entry = _table[t.untyped_storage()._cdata]
            except KeyError:
                if t.device.type != "tpu":
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, tpu:0 and {t.device}! (when checking arguments for {low.name})"
                    ) from None
                raise
            shape, stride, offset = tuple(t.shape), t.stride(), t.storage_offset()
            if 1 in shape:  # a size-1 dim's stride is never used: keep it out of the key
                stride = tuple([0 if n == 1 else s for n, s in zip(shape, stride)])
        k = id(entry)
        si = self.entry_index.get(k)
        if si is None:
            si = len(self.entries)
            self.entry_index[k] = si
            self.entries.append(entry)
        dt = t.dtype
        if offset:  # a runtime value (after the op's scalars), not part of the key
            self.offsets.append(offset)
            offset = None
        leaf = (si, shape, stride, offset, _T2J[dt])
        if t.is_neg() or (dt.is_complex and t.is_conj()):
            # lazy conjugate/negative views: the bit lives on the tensor, not the storage
            leaf += (("conj" if t.is_conj() else "") + ("neg" if t.is_neg() else ""),)
        self.leaves.append(leaf)
        self.tensors.append(t)
        return ("T", len(self.leaves) - 1)

    def encode(self, v, info, low):
        if isinstance(v, torch.Tensor):
            return self.tensor(v, low)
        if v is None:
            return None
        kind = info.kind if info is not None else "other"
        if isinstance(v, _SCALARS):
            # A Python number where a Tensor is expected is a wrapped scalar: a runtime value too.
            if kind in ("scalar", "scalar_list", "tensor") and info.name not in low.static:
                self.dyn.append(v)
                return ("S", type(v))
            return ("V", v)
        if isinstance(v, (list, tuple)):
            if kind == "scalar_list" and info.name not in low.static:
                return ("L", tuple(self.encode(x, info, low) for x in v))
            if v and any(isinstance(x, torch.Tensor) for x in v) or kind in ("tensor_list", "opt_tensor_list"):
                return ("L", tuple(self.encode(x, info, low) for x in v))
            return ("V", tuple(v))
        return ("V", v)


def _decode(spec, vals, scalars):
    if spec is None:
        return None
    tag = spec[0]
    if tag == "T":
        return vals[spec[1]]
    if tag == "S":
        return next(scalars)
    if tag == "L":
        return [_decode(s, vals, scalars) for s in spec[1]]
    v = spec[1]
    return list(v) if isinstance(v, tuple) else v


def _flatten(low: Lowering, args, kwargs) -> tuple[_Flat, tuple, tuple]:
    flat = _Flat()
    infos = low.args
    pos = []
    i = 0
    for a in args:
        info = infos[i] if i < len(infos) else None
        pos.append(flat.encode(a, info, low))
        i += 1
    kw = []
    if kwargs:
        names = {a.name: a for a in infos}
        for name, v in kwargs.items():
            kw.append((name, flat.encode(v, names.get(name), low)))
    return flat, tuple(pos), tuple(kw)


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
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long", torch.int32: "Int",
            torch.bool: "Bool", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.complex64: "ComplexFloat", torch.uint8: "Byte", torch.int8: "Char",
            torch.int16: "Short", torch.complex128: "ComplexDouble"}.get(dt, str(dt))


def _build(low: Lowering, pos, kw, leaves, store_specs, compiled: _Compiled):
    mode = low.mode
    arg_names = [a.name for a in low.args]

    nruntime = sum(1 for leaf in leaves if leaf[3] is None)
    # a weak reference: the executable (compiled.fn) holds this closure, and a cycle would
    # keep an evicted executable's compiled code alive until a full garbage collection
    ref = weakref.ref(compiled)

    def program(bufs, scalars, rngdata):
        compiled = ref() or _Compiled()  # (gone: a trace whose findings nobody reads)
        bufs = list(bufs)
        for i, (numel, bdt) in enumerate(store_specs):
            if bufs[i] is None:
                bufs[i] = jnp.zeros((numel,), bdt)
        if nruntime:  # runtime offsets ride after the op's own scalars
            scalars, ofs = scalars[:len(scalars) - nruntime], iter(scalars[len(scalars) - nruntime:])
            offsets = [leaf[3] if leaf[3] is not None else next(ofs) for leaf in leaves]
        else:
            offsets = [leaf[3] for leaf in leaves]
        vals = [_read_leaf(bufs, leaf, off) for leaf, off in zip(leaves, offsets)]
        it = iter(scalars)
        args = [_decode(s, vals, it) for s in pos]
        kwargs = {name: _decode(s, vals, it) for name, s in kw}
        result = registry.apply(low, args, kwargs, rng.key(*rngdata) if low.random else None)
        if mode == "inplace":
            return (), _write_back(low, result, pos, kw, leaves, offsets, bufs, arg_names)
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
        compiled.outs = [None if o is None else (tuple(o.shape), to_torch_dtype(o.dtype)) for o in outs]
        return tuple(o.reshape(-1) for o in outs if o is not None), {}

    return program


def _read_leaf(bufs, leaf, offset):
    x = geometry.read(bufs[leaf[0]], leaf[1], leaf[2], offset, leaf[4])
    if len(leaf) > 5:
        if "conj" in leaf[5]:
            x = jnp.conj(x)
        if "neg" in leaf[5]:
            x = -x
    return x


def _write_back(low, result, pos, kw, leaves, offsets, bufs, arg_names):
    """Write in-place results into their storages; returns the updated buffers."""
    target = low.mutated[0]
    idx = arg_names.index(target)
    spec = pos[idx] if idx < len(pos) else dict(kw)[target]
    if spec[0] == "T":
        targets, results = [spec], [result]
    else:
        targets, results = list(spec[1]), list(result)
    touched = {}
    for tspec, r in zip(targets, results):
        s, shape, stride, _, dt = leaves[tspec[1]][:5]
        off = offsets[tspec[1]]
        r = jnp.asarray(r)
        if r.shape != tuple(shape):
            try:
                bshape = jnp.broadcast_shapes(r.shape, tuple(shape))
            except ValueError:
                bshape = None
            if bshape != tuple(shape):
                raise RuntimeError(
                    f"{low.name}: output with shape {list(shape)} doesn't match the broadcast "
                    f"shape {list(bshape or r.shape)}"
                )
        r = _cast_to(r, dt, low.name, target)
        bufs[s] = geometry.write(bufs[s], r, shape, stride, off)
        touched[s] = True
    return {s: bufs[s] for s in touched}


_PACKED_DTYPES = tuple(np.dtype(d) for d in scalars._DTYPES)
_RNG_AVALS = (jax.ShapeDtypeStruct((), np.uint32),) * 3


def _abstract(compiled: _Compiled, entries, dyn, random: bool) -> None:
    """Learn output shapes/dtypes and written storages by tracing once, without running.

    Traced through the op's own jit with the avals a later call will have, so a strict
    call (or a per-op replay of a region) reuses this trace instead of tracing again."""
    bufs = tuple(
        None if e.buf is None else jax.ShapeDtypeStruct((e.numel,), e.dtype) for e in entries
    )
    counts = [0, 0, 0, 0]
    for c in compiled.fn.codes:
        counts[c] += 1
    packed = tuple(
        jax.ShapeDtypeStruct((n,), _PACKED_DTYPES[k]) if n else None for k, n in enumerate(counts)
    )
    _, updated, _ = compiled.fn.trace(bufs, packed, _RNG_AVALS if random else ()).out_info
    compiled.updated = tuple(sorted(updated))
    metrics.bump("abstract_evals")


# An op whose shapes keep changing (attention over a KV cache that grows each decoded
# token) compiles a new executable per shape, each run a few times at most. From the
# FAST_AFTER-th shape of one op on, those compile without LLVM's optimizations: a third
# less XLA compile time for programs whose run time is dispatch anyway. On XLA:CPU they
# also take the older loop emitters instead of the MLIR fusion emitters, which cost 2-3x
# the compile time of a one-op program (x * 0.5: 23 vs 11 ms; q @ k.T + softmax: 62 vs
# 24 ms, both at -O0) and whose run-time gains do not matter for a program run a few times.
FAST_AFTER = int(os.environ.get("TORCHTPU_FAST_COMPILE_AFTER", "4"))
_FAST_OPTIONS = {"xla_backend_optimization_level": 0}
_FAST_OPTIONS_CPU = dict(_FAST_OPTIONS, xla_cpu_use_fusion_emitters=False)
_shapes_seen: dict = {}


def _fast_options() -> dict:
    from ..runtime.jaxenv import platform

    return _FAST_OPTIONS_CPU if platform() == "cpu" else _FAST_OPTIONS


def _jit_packed(program, codes, fast: bool = False, compiled: _Compiled | None = None):
    """jax.jit of `program` taking its runtime scalars packed (see eager/scalars.py);
    it returns (outputs, updated storages, packed device-side check flags or None)."""

    ref = weakref.ref(compiled) if compiled is not None else None  # no cycle: see _build

    def packed_program(bufs, packed, rngdata):
        return _with_checks(ref() if ref is not None else None, program, bufs,
                            tuple(scalars.unpack(packed, codes)), rngdata)

    fn = jax.jit(packed_program, compiler_options=_fast_options()) if fast else jax.jit(packed_program)
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


def _fast_compile(compiled: _Compiled) -> bool:
    skey = compiled.shape_free_key()
    n = _shapes_seen[skey] = _shapes_seen.get(skey, 0) + 1
    if n > FAST_AFTER:
        metrics.bump("fast_compiles")
        return True
    return False


# An in-place write into part of a big storage (a gradient copied into DDP's bucket, a
# KV-cache slot) builds a whole new buffer unless XLA may overwrite the old one. When
# nothing but the storage holds the old buffer, hand it over (donate) and the write costs
# the view's size, not the storage's.
DONATE_MIN_ELEMENTS = 1 << 16


def _partial_writes(low: Lowering, pos, kw, leaves, entries) -> tuple:
    """Storages the in-place op writes through a view smaller than a big storage."""
    target = low.mutated[0]
    names = [a.name for a in low.args]
    idx = names.index(target)
    spec = pos[idx] if idx < len(pos) else dict(kw).get(target)
    if spec is None:
        return ()
    specs = [spec] if spec[0] == "T" else [x for x in spec[1] if x is not None and x[0] == "T"]
    out = set()
    for tspec in specs:
        leaf = leaves[tspec[1]]
        e = entries[leaf[0]]
        if e.numel >= DONATE_MIN_ELEMENTS and math.prod(leaf[1]) < e.numel:
            out.add(leaf[0])
    return tuple(sorted(out))


def _donating(compiled: _Compiled, donate: tuple):
    fn = compiled.donating.get(donate)
    if fn is None:
        program, codes = compiled.program, compiled.fn.codes
        ref = weakref.ref(compiled)

        def packed_program(donated, kept, packed, rngdata):
            bufs = donation.merge(donated, kept, donate)
            return _with_checks(ref(), program, tuple(bufs), tuple(scalars.unpack(packed, codes)), rngdata)

        fn = compiled.donating[donate] = jax.jit(packed_program, donate_argnums=(0,))
    return fn


def _concrete(entry):
    b = entry.buf
    tb = type(b)
    if tb is deferred.Pending:
        deferred.flush("strict_op")
        b = entry.buf
    elif tb is deferred.Failed:
        b.raise_()
    return b


def _make_output(shape, dt, buf):
    t = tensors.empty(shape, dt, buf)
    return t, storage.lookup(t)


def _describe(low: Lowering, flat: _Flat) -> str:
    ins = ", ".join(
        f"{tuple(t.shape)}:{str(t.dtype).removeprefix('torch.')}" for t in flat.tensors
    )
    return f"{low.name}({ins})"


def _user_error(err: BaseException, low: Lowering, flat: _Flat, args=None, kwargs=None) -> BaseException:
    """The error a PyTorch user expects: RuntimeError (as CPU/CUDA kernels raise for bad
    shapes) naming the op, its inputs and the user's line. Errors of our own kind pass.
    A lowering that fails in JAX (arguments no check caught) gets CPU's error if CPU
    rejects the same call."""
    if args is not None and not isinstance(err, (RuntimeError, NotImplementedError, IndexError)) \
            and low.own_schema:
        cpu = argcheck.cpu_error(low.overload, args, kwargs)
        if cpu is not None:
            err = cpu
    where = deferred._origin()
    at = f"\n  issued at {where[0]}:{where[1]} in {where[2]}" if where else ""
    if isinstance(err, (RuntimeError, NotImplementedError, FloatingPointError, IndexError)):
        err.add_note(f"torchtpu: while running {_describe(low, flat)}{at}")
        return err
    return RuntimeError(f"{_describe(low, flat)}: {type(err).__name__}: {err}{at}")


def _flush_for_precision():
    deferred.flush("matmul precision changed")


# eager/dynamism.py's execute, installed by torchtpu.mark_dynamic (it needs this module, so
# it plugs itself in rather than be imported here); it serves every call while tensors of a
# dim marked dynamic exist
dynamic = None


def execute(low: Lowering, args, kwargs):
    if dynamic is not None:
        return dynamic(low, args, kwargs, _serve, _execute)
    return _serve(low, args, kwargs)


def _serve(low: Lowering, args, kwargs):
    if low.name == "cat":  # a tensor growing token by token: see eager/growth.py
        return growth.cat(low, args, kwargs, _execute)
    return _execute(low, args, kwargs)


def _execute(low: Lowering, args, kwargs):
    precision.sync(_flush_for_precision)  # float32 matmul precision: part of every jit's key
    gen = None
    if low.random:  # a generator= is state, not part of the program: its seed/offset are inputs
        args, kwargs, gen = rng.split_generator(args, kwargs)
    flat, pos, kw = _flatten(low, args, kwargs)
    if flat.offsets:
        flat.dyn += flat.offsets
    entries = flat.entries
    store_specs = tuple([(e.numel, e.dtype) for e in entries])
    inited = tuple([e.buf is not None for e in entries])
    # the default dtype decides result dtypes (uint8 + 5.5, int / int, 1j * x): part of the key
    key = (low.name, low.mode, pos, kw, tuple(flat.leaves), store_specs, inited, _checks._enabled[0],
           torch.get_default_dtype())
    compiled = _cache.get(key)
    if compiled is None:
        if low.own_schema:
            argcheck.check(low.overload, args, kwargs)  # CPU's argument checks, once per signature
        compiled = _Compiled()
        compiled.key = key
        compiled.program = _build(low, pos, kw, flat.leaves, store_specs, compiled)
        compiled.fn = _jit_packed(compiled.program, scalars.layout(flat.dyn), _fast_compile(compiled), compiled)
        with _cache_lock:
            _cache[key] = compiled
        _admit(low.name)
    compiled.used = next(_clock)
    if modes._state["mode"] == "defer_and_fuse":
        if compiled.updated is None:
            try:
                _abstract(compiled, entries, flat.dyn, low.random)
            except Exception as err:
                _drop(key)
                raise _user_error(err, low, flat, args, kwargs) from err
        outs = deferred.record(compiled, entries, flat.dyn, low, _make_output, gen)
        return _finish(low, compiled, args, kwargs, outs)
    return _run_strict(low, compiled, key, flat, args, kwargs, gen)


def _run_strict(low, compiled, key, flat, args, kwargs, gen=None):
    mode = modes._state["mode"]
    entries = flat.entries
    rngdata = rng.next_key_data(gen) if low.random else ()
    bufs = tuple([_concrete(e) for e in entries])
    donate = ()
    if compiled.partial is None:
        compiled.partial = _partial_writes(low, key[2], key[3], flat.leaves, entries) \
            if low.mode == "inplace" and low.mutated else ()
        compiled.donating = {}
    if compiled.partial:
        # references: the entry, the tuple and getrefcount's own argument
        donate = tuple(i for i in compiled.partial if sys.getrefcount(bufs[i]) == 3)
    t0 = program_timing.start()  # nonzero only under torch.profiler
    try:
        if donate:
            kept = list(bufs)
            bufs = None
            donated = donation.split(kept, donate)
            outs, updated, flags = _donating(compiled, donate)(
                donated, kept, scalars.pack_cached(flat.dyn, compiled.fn.codes), rngdata)
            del donated
            metrics.bump("donated_writes")
        else:
            outs, updated, flags = compiled.fn(bufs, scalars.pack_cached(flat.dyn, compiled.fn.codes), rngdata)
        if mode == "debug":
            jax.block_until_ready((outs, updated))
            if modes.debug_nans():
                _check_nans(low, flat, outs, updated)
    except Exception as err:
        _drop(key)
        if _exe_cache.is_out_of_memory(err):
            # compiling (or running) ran out of memory: give back every cached executable and
            # say so, rather than let XLA try again on an exhausted heap
            n = len(_cache)
            clear_cache()
            _exe_cache.evict({}, ())
            raise torch.OutOfMemoryError(
                f"torchtpu: out of memory running {_describe(low, flat)}; released {n} cached "
                f"executables (bound them with torchtpu.set_executable_limit): {err}") from err
        raise _user_error(err, low, flat, args, kwargs) from err
    if t0:
        program_timing.ran(low.name, (outs, updated), t0, not compiled.ran)
    count_run(compiled)
    metrics.bump("executions")
    if compiled.updated is None:
        compiled.updated = tuple(sorted(updated))
    if low.mode == "inplace":
        for s, b in updated.items():
            entries[s].buf = b
        if flags is not None:
            _flagged(low, compiled, mode, [(entries[s], b) for s, b in updated.items()], flags)
        return _finish(low, compiled, args, kwargs, None)
    if compiled.structure == "none":
        if flags is not None:  # an assertion (_assert_async): a check and nothing else
            _flagged(low, compiled, mode, [], flags)
        return None
    it = iter(outs)
    results = [None if o is None else tensors.empty(o[0], o[1], next(it)) for o in compiled.outs]
    if flags is not None:
        written = [storage.lookup(t) for t in results if t is not None]
        _flagged(low, compiled, mode, [(e, e.buf) for e in written], flags)
    return _finish(low, compiled, args, kwargs, results)


def _flagged(low, compiled, mode, writes, flags) -> None:
    """Keep the op's check flags for the next host read (at once in debug mode)."""
    where = deferred._origin()
    _pending_checks.add(flags, compiled.checks, f"{where[0]}:{where[1]} in {where[2]}" if where else None,
                        writes)
    if mode == "debug":
        _pending_checks.raise_pending()


_clock = itertools.count(1)
_per_op: dict = {}  # op name -> executables of it in _cache


def _admit(name: str) -> None:
    """Keep the op cache within its bounds (runtime/cache.py): least recently used first,
    an eighth of the bound at a time so eviction stays off the per-op path."""
    n = _per_op[name] = _per_op.get(name, 0) + 1
    limits = _exe_cache._limits
    if n > limits["per_op"]:
        mine = [(k, c.used) for k, c in list(_cache.items()) if k[0] == name]
        _evict(_exe_cache.least_used(mine, max(1, limits["per_op"] // 8)))
    if len(_cache) > limits["total"]:
        _evict(_exe_cache.least_used([(k, c.used) for k, c in list(_cache.items())],
                                     max(1, limits["total"] // 8)))


def _drop(key) -> None:
    if _cache.pop(key, None) is not None:
        _per_op[key[0]] = _per_op.get(key[0], 1) - 1


def _evict(keys) -> None:
    for k in keys:
        if k in _cache:
            _per_op[k[0]] = _per_op.get(k[0], 1) - 1
    _exe_cache.evict(_cache, keys, _cache_lock)


def count_run(compiled: _Compiled) -> None:
    """Count one run of an op's own executable: its first run compiled it."""
    if compiled.ran:
        metrics.bump("cache_hits")
    else:
        compiled.ran = True
        metrics.bump("compiles")


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
                f"torchtpu debug: {_describe(low, flat)} produced NaN or Inf (TORCHTPU_DEBUG_NANS=1)"
            )


def cache_size() -> int:
    return len(_cache)


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
        _per_op.clear()
        _shapes_seen.clear()
    deferred._fused_cache.clear()  # its keys hold the dropped op executables
    deferred.forget_signatures()
