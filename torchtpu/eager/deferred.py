"""defer_and_fuse: ops are recorded, not run; a region compiles to one XLA executable.

Recording never touches JAX: an op's output shapes come from the per-signature
cache the strict executor fills (abstract evaluation once per signature), and
its outputs are storages whose buffer is a `Pending` promise. A region is
materialized when a value is needed on the host (.cpu(), .item(), printing,
bool(t)), on torch.tpu.synchronize(), after each optimizer step, when a strict
op needs a pending input, or when the region grows past a cap. The fused
program is cached by the fingerprint of its op signatures and wiring; Python
scalars and RNG counters are runtime inputs, so a changing learning rate or
step counter never recompiles. Only storages still alive at materialization
are outputs: buffers nobody holds are never computed. A region whose shapes keep
changing (decoding with a growing KV cache) is replayed op by op instead of
compiled fused: see the compile-storm guard below.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import metrics
from ..config import startup
from ..ops import checks as _checks
from ..runtime import cache as _caches
from ..runtime import checks as _pending_checks
from ..runtime import donation, executables, inflight, launcher, leaf, pending, placement, program_timing, rng, tensors
from ..runtime.pending import Failed, Pending
from ..spmd.program import spmd as _spmd
from ..spmd.region_runner import CollectiveRegionRunner
from . import modes, region_plan
from . import scalars as _scalars
from .origin import user_frame as _origin
from .origin import where as _where
from .op_program import fast_options
from .recordable import Recordable, RecordedOp, count_run

_lock = threading.RLock()
_SPREAD = placement.SPREAD
MAX_OPS = startup.defer_max_ops


class _Node:
    # (csrc/record.h makes nodes without calling __init__, writing these slots itself: keep
    # __init__ a plain store of its arguments, and the slots in this order)
    __slots__ = ("program", "refs", "nscalars", "rng", "origin", "name", "compiled", "collective")

    def __init__(self, program, refs, nscalars, rng, origin, name, compiled, collective=False):
        self.program = program
        self.refs = refs
        self.nscalars = nscalars
        self.rng = rng  # (seed lo, seed hi, counter) of a random op, else None
        self.origin = origin
        self.name = name
        self.compiled = compiled
        self.collective = collective  # recorded by record_collective: runs in recorded order


class _Graph:
    __slots__ = ("nodes", "inputs", "input_index", "scalars", "rngs", "written",
                 "fresh", "fresh_per_key", "churn", "collectives", "overwritten", "device")

    def __init__(self):
        self.nodes: list[_Node] = []
        self.inputs: list = []
        self.input_index: dict[int, int] = {}
        self.scalars: list = []
        self.rngs: list = []
        self.written: list = []
        self.fresh: set = set()  # op signatures never run in a fused region nor replayed
        self.fresh_per_key: dict = {}  # shape-free key -> fresh signatures of it in this region
        self.churn = False  # a region that will never repeat: replay it op by op
        self.collectives = None  # the group context of the collectives recorded in it, if any
        self.overwritten: set = set()  # indices of inputs an in-place op replaced in their storage
        self.device = 0  # the tpu device its ops run on (one program runs on one device)


_graph = _Graph()


class RegionKey(NamedTuple):
    """What a fused region's program is compiled for (its executables.regions key)."""

    nodes: tuple      # per node, (its op executable, where each input comes from)
    outputs: tuple    # (node, output) of each buffer the region leaves behind
    scalars: tuple    # the runtime scalars' layout (eager/scalars.py)
    donated: tuple    # the inputs XLA may overwrite

# Compile-storm guard. A region whose op signatures keep changing shape (greedy decoding
# with a growing KV cache) never repeats: compiling it fused is wasted work (a minute for
# 32 decoded tokens recorded as one 1259-op region on XLA:CPU). When one op (by its shape-free key) shows CHURN fresh signatures in one
# region, the region is replayed op by op with each op's own executable (those for
# length-independent ops repeat across steps, as in strict), and every key with a fresh
# signature in it is marked churning. Later regions holding a fresh signature of a
# churning key are replayed as well; a signature seen again after a replay is a stable
# shape and fuses normally.
CHURN = startup.defer_churn
# bounded as the eager op executables they hold (unbounded, they kept evicted ones alive)
_fused_sigs = _caches.register("fused signatures", _caches.LRUSet(_caches.limit("total")))  # ran in a fused region
_replayed = _caches.register("replayed signatures", _caches.LRUSet(_caches.limit("total")))  # ran in a replayed one
_churning = _caches.register("churning keys", _caches.LRUSet(_caches.limit("total")))  # shape-free keys seen churning


def forget_signatures() -> None:
    _fused_sigs.clear()
    _replayed.clear()
    _churning.clear()


executables.ops.on_clear(forget_signatures)  # they hold op executables


def pending_count() -> int:
    return len(_graph.nodes)


def record(compiled: Recordable, entries, dyn, low: RecordedOp, generator=None, collective: bool = False):
    """Record one op over storage `entries` with runtime scalars `dyn`; returns its
    outputs (new tensors over Pending buffers; None for an in-place op). A random op
    draws from `generator` (the default generator when None)."""
    if _SPREAD[0]:  # a region runs on one device: an op on another starts a new one
        index = placement.active_index()
        if _graph.nodes and _graph.device != index:
            flush("device_changed")
        _graph.device = index
    with _lock:
        g = _graph
        refs = []
        for e in entries:
            b = e.buf
            tb = type(b)
            if tb is Pending:
                refs.append((0, b.node, b.key))
            elif b is None:
                refs.append(None)
            elif tb is Failed:
                b.raise_()
            else:
                i = g.input_index.get(id(b))
                if i is None:
                    i = len(g.inputs)
                    g.input_index[id(b)] = i
                    g.inputs.append(b)
                refs.append((1, i))
        refs = tuple(refs)
        j = len(g.nodes)
        rngdata = rng.next_key_data(generator) if low.random else None
        if rngdata is not None:
            g.rngs.append(rngdata)
        g.nodes.append(_Node(compiled.program, refs, len(dyn), rngdata, _origin(), low.name, compiled, collective))
        if dyn:
            g.scalars.extend(dyn)
        if compiled not in _fused_sigs and compiled not in _replayed and compiled not in g.fresh:
            g.fresh.add(compiled)
            skey = compiled.shape_free_key()
            n = g.fresh_per_key[skey] = g.fresh_per_key.get(skey, 0) + 1
            if n >= CHURN:
                _churning.add(skey)
                g.churn = True
            elif skey in _churning:
                g.churn = True
        written = g.written
        if low.mode == "inplace":
            for s in compiled.updated:
                e = entries[s]
                r = refs[s]
                if r is not None and r[0] == 1:
                    g.overwritten.add(r[1])
                p = Pending(j, ("u", s))
                e.buf = p
                written.append((weakref.ref(e), p))
            result = None
        elif compiled.outs is None:  # an assertion (_assert_async): a node for its check only
            result = None
        else:
            result = []
            k = 0
            for meta in compiled.outs:
                if meta is None:  # an output not asked for
                    result.append(None)
                    continue
                p = Pending(j, k)
                t, e = tensors.empty_with_entry(meta[0], meta[1], p, *meta[2:])  # [2]: strides (None: contiguous)
                written.append((weakref.ref(e), p))
                result.append(t)
                k += 1
        if len(g.nodes) >= MAX_OPS:
            flush("size_cap")
        elif g.churn and len(g.fresh) >= CHURN and g.collectives is None:
            # (not with collectives: a rank's fresh signatures can differ from its peers',
            # and every rank must cut the same region)
            flush("compile_storm")
        return result


def _configure_native() -> None:
    """csrc/record.h records a planned op (executor._plan_record) as record() does, in C++,
    over this module's state: the region (`_graph`, replaced by each flush, and MAX_OPS are
    read from the module's dict per call), the lock, the node and buffer types, the signature
    sets and origin's code cache."""
    if tensors.native is None:
        return
    from . import origin
    tensors.native.configure_record(globals(), _lock, _Node, Pending, _fused_sigs.members, _replayed.members,
                                    origin.internal_code, origin.is_internal)


_configure_native()


# How a region with collectives is agreed on across ranks and launched: the process group
# (distributed/, a layer above) installs it with its first group, so eager never imports it.
_collective_runner: CollectiveRegionRunner | None = None


def set_collective_region_runner(runner: CollectiveRegionRunner | None) -> None:
    """Install (None: remove) what runs regions holding collectives (distributed/fused.py)."""
    global _collective_runner
    _collective_runner = runner


def _region_runner() -> CollectiveRegionRunner:
    if _collective_runner is None:
        raise RuntimeError(
            "torchtpu: defer_and_fuse: a collective was recorded into a region, but no runner for regions "
            "with collectives is installed (torchtpu.distributed installs it when a 'tpu' process group is "
            "created: dist.init_process_group('tpu'))")
    return _collective_runner


def record_collective(compiled, entries, low, ctx):
    """Record a collective over group context `ctx`; the region then runs as one SPMD
    program over that group's mesh (a region holds one group's collectives)."""
    _region_runner()  # fail here, at the user's collective, not at a later host read
    with _lock:
        if _graph.collectives is not None and _graph.collectives is not ctx:
            flush("collective_group")
        _graph.collectives = ctx
        return record(compiled, entries, [], low, collective=True)


def flush_collectives(reason: str) -> None:
    """Materialize the region if it holds collectives: a collective issued on its own must
    not overtake one recorded earlier (a scatter's receivers touch no pending input)."""
    if _graph.collectives is not None:
        flush(reason)


def _note(e: BaseException, node) -> None:
    origin = node.origin
    where = f"{origin[0]}:{origin[1]} in {origin[2]}" if origin else "(no user frame: backward)"
    e.add_note(f"torchtpu: raised by deferred op {node.name}, issued at {where}")


def _after(bufs, last):
    """`bufs` made to depend on `last` (the previous collective's result) without changing a
    value, so the collective reading them starts after that one on every rank.

    XLA schedules independent collectives in an order of its choosing, and it chooses per
    program: ranks whose region programs differ elsewhere (each reads its own shard) paired
    different collectives (gloo: "144 vs 68"), and two of one size would have swapped data.
    A data dependency is the order XLA keeps (an optimization barrier is removed before
    scheduling). The first element of one input gets -0.0 added, derived from `last` through
    a multiply by zero, which XLA does not fold for floats (NaN * 0 is NaN, so the value is
    made finite first): x + -0.0 is x for every x, signed zeros and NaN included."""
    p = last.reshape(-1)[:1]
    p = (p.real if jnp.iscomplexobj(p) else p).astype(jnp.float32)
    zero = -jnp.abs(jnp.where(jnp.isfinite(p), p, 0.0) * 0.0)[0]
    out = list(bufs)
    for i, b in enumerate(out):
        if b is None or not b.size:
            continue
        flat = b.reshape(-1)
        if flat.dtype == jnp.bool_:
            first = flat[0] | (zero != 0)
        elif jnp.iscomplexobj(flat):  # -0.0 in both parts: a +0.0 imaginary part would flip a -0.0
            z = zero.astype(flat.real.dtype)
            first = flat[0] + jax.lax.complex(z, z)
        else:
            first = flat[0] + zero.astype(flat.dtype)
        out[i] = flat.at[0].set(first).reshape(b.shape)
        return tuple(out)
    return bufs


def _make_fused(nodes, out_refs, codes, donate, group=None, fast=False):
    programs = [(n.program, n.refs, n.nscalars, n.rng is not None, n) for n in nodes]
    declared: list = []  # the region's device-side checks, learned at trace

    def fused(donated, kept, packed, rngs):
        inputs = donation.merge(donated, kept, donate)
        scalars = _scalars.unpack(packed, codes)
        vals = {}
        si = 0
        ri = 0
        last = None  # the previous collective's result
        with _checks.collect() as checks:
            for j, (program, refs, ns, has_rng, node) in enumerate(programs):
                bufs = tuple(
                    None if r is None else (inputs[r[1]] if r[0] == 1 else vals[(r[1], r[2])]) for r in refs
                )
                if node.collective:
                    if last is not None:
                        bufs = _after(bufs, last)
                rngdata = rngs[ri] if has_rng else ()
                ri += has_rng
                try:
                    with _checks.scope(node.name, node=j):
                        outs, updated = program(bufs, tuple(scalars[si:si + ns]), rngdata)
                except Exception as e:
                    _note(e, node)
                    raise
                si += ns
                for k, o in enumerate(outs):
                    vals[(j, k)] = o
                for s, b in updated.items():
                    vals[(j, ("u", s))] = b
                if node.collective:
                    last = next((o for o in (*outs, *updated.values()) if o is not None and o.size), last)
        results = tuple(vals[r] for r in out_refs)
        # one packed flag array for the whole region, after its outputs
        flags = checks.packed() if checks is not None else None
        declared[:] = checks.checks if checks is not None else ()
        return results if flags is None else results + (flags,)

    if group is not None:
        return _Fused(_spmd(fused, group, bool(donate)), declared)
    optimized = jax.jit(fused, donate_argnums=(0,) if donate else ())
    if not fast:
        return _Fused(optimized, declared)
    return _Fused(jax.jit(fused, donate_argnums=(0,) if donate else (), compiler_options=fast_options()),
                  declared, optimized)


class _Fused:
    """A region's executable and the device-side checks it declares. One compiled fast
    (unoptimized, `optimized` then holds the optimized jit) is compiled again optimized
    once the time it spent running reaches what that compile is expected to cost
    (TIER_UP x its own fast compile): a region at a new bucket runs once at a bucket edge,
    or a bucket's steady decode step, whose -O0 code cost ~2 ms a token more than optimized
    code for a tiny Llama on XLA:CPU (never worth ~4 s of compiling in 256 tokens) but ran a
    static-cache decode at 22 tok/s instead of 52 where the cache was bigger. Its first run
    is timed (the compile), its second waits for its outputs (the run); later runs count."""

    __slots__ = ("fn", "checks", "used", "optimized", "runs", "compile_s", "run_s")

    def __init__(self, fn, checks, optimized=None):
        self.fn = fn
        self.checks = checks
        self.used = 0  # the flush count at its last run: the cache evicts the least recent
        self.optimized = optimized
        self.runs = 0
        self.compile_s = self.run_s = 0.0

    def __call__(self, *args):
        if self.optimized is None:
            return self.fn(*args)
        self.runs += 1
        if self.runs > 2 and (self.runs - 2) * self.run_s >= TIER_UP * self.compile_s:
            self.fn, self.optimized = self.optimized, None
            metrics.bump("regions_reoptimized")
            metrics.bump("compiles")  # it compiles at this call
            return self.fn(*args)
        t0 = time.perf_counter() if self.runs <= 2 else 0.0
        out = self.fn(*args)
        if self.runs == 1:
            self.compile_s = time.perf_counter() - t0
        elif self.runs == 2:
            jax.block_until_ready(out)
            self.run_s = time.perf_counter() - t0
        return out


def _donatable(inputs) -> tuple:
    """Inputs only the region still holds: every storage that had one was overwritten in
    the region (a parameter, an optimizer state), so XLA may update it in place."""
    if not DONATE:
        return ()
    return tuple(i for i in range(len(inputs)) if donation.exclusively_held(inputs, i))


# Off unless TORCHTPU_DEFER_DONATE=1. Until issue 14 the test here was `sys.getrefcount(b)
# == 3` inside `enumerate(inputs)`, whose reused result tuple holds one more reference, so
# it never held and no region ever donated; turning it on is a change of its own (XLA warns
# about donated buffers no output can reuse, such as a CPU scalar operand's).
DONATE = startup.defer_donate


def _replay(g, inputs, out_refs):
    """Run a region op by op with each op's own executable (the compile-storm guard)."""
    vals = {}
    scalars = g.scalars
    si = 0
    flagged = []
    for j, node in enumerate(g.nodes):
        c = node.compiled
        bufs = tuple(
            None if r is None else (inputs[r[1]] if r[0] == 1 else vals[(r[1], r[2])]) for r in node.refs
        )
        ns = node.nscalars
        dyn = scalars[si:si + ns]
        si += ns
        args = (bufs, _scalars.pack(dyn, c.fn.codes), node.rng if node.rng is not None else ())
        try:
            if c.ran:
                got = c.fn(*args)
            else:  # its first run compiles it: launched as every compile is (heap room, bytes kept)
                got = launcher.launch(c.fn, args, what=lambda: node.name, compiling=True, account=_owner(c))
        except Exception as e:
            _note(e, node)
            raise
        outs, updated = got[0], got[1]
        if len(got) > 2 and got[2] is not None:
            flagged.append((got[2], c.checks, _where(node.origin)))
        count_run(c)
        metrics.bump("executions")
        _replayed.add(c)
        for k, o in enumerate(outs):
            vals[(j, k)] = o
        for s, b in updated.items():
            vals[(j, ("u", s))] = b
    return tuple(vals[r] for r in out_refs), flagged


# A long region is cut into chunks that repeat (eager/region_plan.py) when it holds a loop's
# iterations; the cut is chosen once per region fingerprint (None: compile it whole).
_cuts = _caches.register("region cuts", _caches.LRU(_caches.limit("regions")))
executables.ops.on_clear(_cuts.clear)  # its keys and chunks hold op executables


def _chunks(fkey, g):
    """The chunks a new region runs as, or None (compile it whole)."""
    if len(g.nodes) < region_plan.MIN_OPS:
        return None
    chunks = _cuts.get(fkey, False)
    if chunks is False:
        starts = region_plan.choose_cuts([n.compiled for n in g.nodes])
        # each with its program's key, made once (the region's scalar layout is its key's)
        chunks = None if starts is None else tuple(
            (c, RegionKey(c.nodes, c.local_outputs, fkey.scalars[c.first_scalar:c.stop_scalar], ()))
            for c in region_plan.plan(fkey.nodes, fkey.outputs, [n.nscalars for n in g.nodes], starts))
        _cuts[fkey] = chunks
    return chunks


def _admit(key, fn):
    """A new region program `fn` kept under `key` (it compiles at its first call)."""
    executables.regions.admit(key, fn)
    metrics.bump("compiles")
    metrics.bump("region_compiles")
    return fn


def _run_chunks(g, inputs, out_refs, chunks):
    """Run a region as its chunks, each a region of its own (compiled once per fingerprint,
    so an iteration met again is a cache hit); the values one leaves feed the later ones."""
    vals = {}
    flagged = []
    for c, key in chunks:
        part = g.nodes[c.start:c.stop]
        fn = executables.regions.get(key)
        fresh = fn is None
        if fresh:
            local = [_Node(n.program, refs, n.nscalars, n.rng, n.origin, n.name, n.compiled)
                     for n, (_, refs) in zip(part, c.nodes)]
            # A chunk the region repeats HOT times or more (a loop's iteration) compiles optimized: it keeps
            # running (a 32-layer forward's layer chunk unoptimized ran the forward at 2x
            # its time). The others (a prefill, a bucket edge, the loop's end) run a few
            # times: compiled without XLA's optimizations, as a bucketed region at a new
            # edge is, and optimized once their runs pay for it (_Fused's TIER_UP).
            fn = _admit(key, _make_fused(local, key.outputs, key.scalars, (), None, c.repeats < region_plan.HOT))
        else:
            metrics.bump("cache_hits")
        fn.used = next(executables.clock)
        bufs = [inputs[r[1]] if r[0] == 1 else vals[(r[1], r[2])] for r in c.sources]
        args = ([], bufs, _scalars.pack(g.scalars[c.first_scalar:c.stop_scalar], key.scalars),
                tuple(n.rng for n in part if n.rng is not None))
        last = part[-1].origin
        what = lambda: f"a chunk of {len(part)} ops of a region" + (f" ending at {_where(last)}" if last else "")  # noqa: E731,B023
        timing = lambda: program_timing.region_name([n.name for n in part])  # noqa: E731,B023
        try:
            results = launcher.launch(fn, args, what=what, compiling=fresh, release=(executables.regions.clear,),
                                      timing=timing, account=(executables.regions, key) if fresh else None)
        except Exception:
            executables.regions.drop(key)
            raise
        del args, bufs
        if len(results) > len(c.outputs):  # the chunk's packed check flags
            flagged.append((results[-1], fn.checks, [n.origin for n in part]))
        for r, v in zip(c.outputs, results):
            vals[r] = v
        for r in c.done:  # (a loop's old values go as they would inside one program)
            del vals[r]
        metrics.bump("executions")
    return tuple(vals[r] for r in out_refs), flagged


def _owner(c):
    """(the cache holding the op executable `c`, its key there), or None."""
    key = getattr(c, "key", None)
    if key is None:
        return None
    for cache in (executables.ops, executables.control_flow):
        try:
            if cache.get(key) is c:
                return cache, key
        except TypeError:  # an unhashable key: not one of these caches'
            return None
    return None


def flush(reason: str) -> None:
    """Materialize every pending value (compiling the region once per fingerprint).

    The region runs with the user's torch dispatch modes set aside: its lowering calls
    torch itself (dtype promotion, host-side tensors), and a flush that no dispatched op
    triggers (a synchronize, a compiled graph reading a pending input) would otherwise show
    those calls to whatever mode is active, such as selective activation checkpointing's,
    which counts the ops of a block to replay them in backward.

    Taken under the lock even when nothing is recorded: another thread's flush swaps in
    an empty region before it runs the old one (the lock held, the GIL let go while XLA
    runs), and a caller whose Pending is one of that region's must wait for its arrays,
    not return and read the Pending as if it were one (3 threads recording at once read a
    Pending through numpy: "cannot reshape array of size 1")."""
    with _lock:
        if not _graph.nodes:
            return
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            if placement.spread():
                with placement.on(_graph.device):
                    _flush(reason)
            else:
                _flush(reason)


def _flush(reason: str) -> None:
    global _graph
    with _lock:
        g = _graph
        if not g.nodes:
            return
        _graph = _Graph()
        live = []
        seen = set()
        for wr, p in g.written:
            e = wr()
            if e is not None and e.buf is p and id(e) not in seen:
                seen.add(id(e))
                live.append((e, p))
        out_refs = tuple((p.node, p.key) for _, p in live)
        codes = _scalars.layout(g.scalars)
        inputs = g.inputs
        g.inputs = None
        g.input_index = None
        donate = _donatable(inputs) if not g.churn else ()
        # (compiled objects live in the op cache: they hash by identity)
        fkey = RegionKey(tuple([(n.compiled, n.refs) for n in g.nodes]), out_refs, codes, donate)
        fn = executables.regions.get(fkey)
        # a region with collectives is never replayed on one rank's own judgement (its fresh
        # signatures can differ from a peer's): every rank fuses it, or all replay it together
        replay = fn is None and g.churn and g.collectives is None
        fresh = fn is None
        # (not a training step's region, ended by its optimizer step: it runs every step, and
        # whole it runs fastest; a 24-layer GPT's step took 20 ms whole, 30 ms as 33 chunks)
        chunks = (_chunks(fkey, g) if fresh and not replay and not donate and g.collectives is None
                  and reason != "optimizer_step" else None)
        last = g.nodes[-1].origin if g.nodes else None
        what = lambda: f"a fused region of {len(g.nodes)} ops" + (f" ending at {_where(last)}" if last else "")  # noqa: E731
        timing = lambda: program_timing.region_name([n.name for n in g.nodes])  # noqa: E731
        try:
            if g.collectives is not None and not replay:
                replay = not _region_runner().agree(g.collectives, fkey, g.nodes)
            flagged = ()
            if replay:
                results, flagged = launcher.launch(_replay, (g, inputs, out_refs), what=what, compiling=False,
                                                   timing=timing)
                metrics.bump("regions_replayed")
                if g.churn:
                    # every op that brought a new shape into a storm is suspect from now on
                    _churning.update(g.fresh_per_key)
            elif chunks:
                results, flagged = _run_chunks(g, inputs, out_refs, chunks)
                metrics.bump("regions_chunked")
                _fused_sigs.update(g.fresh)
            else:
                if fn is None:
                    fn = _admit(fkey, _make_fused(g.nodes, out_refs, codes, donate, g.collectives,
                                                  _reshaped(g.nodes, out_refs)))
                else:
                    metrics.bump("cache_hits")
                fn.used = next(executables.clock)
                donated = donation.split(inputs, donate)
                args = (donated, inputs, _scalars.pack(g.scalars, codes), tuple(g.rngs))
                if g.collectives is not None:
                    runner = _region_runner()
                    results = launcher.launch(lambda *a: runner.run(g.collectives, fkey, g.nodes, fn, a), args,
                                              what=what, compiling=fresh, release=(executables.regions.clear,), timing=timing)
                    metrics.bump("regions_with_collectives")
                else:
                    results = launcher.launch(fn, args, what=what, compiling=fresh, release=(executables.regions.clear,),
                                              timing=timing, account=(executables.regions, fkey) if fresh else None)
                if len(results) > len(out_refs):  # the region's packed check flags
                    flagged = ((results[-1], fn.checks, [n.origin for n in g.nodes]),)
                    results = results[:len(out_refs)]
                del args
                del donated
                metrics.bump("executions")
                _fused_sigs.update(g.fresh)
        except Exception as err:
            executables.regions.drop(fkey)
            for e, _ in live:
                e.buf = Failed(err)  # an out-of-memory error is torch's already (runtime/launcher.py)
            raise
        leaf.commit([e for e, _ in live], dict(enumerate(results)))
        for i in g.overwritten:
            # a buffer the region replaced in its storage: the region's program may not
            # have read it (jax.jit drops unread arguments), so synchronize() waits for it
            inflight.replaced(inputs[i])
        for flags, declared, where in flagged:
            # a tripped check loses the region's outputs: they hold XLA's clamped values
            _pending_checks.add(flags, declared, where, [(e, r) for (e, _), r in zip(live, results)])
        metrics.bump("regions_executed")
        metrics.bump("region_ops", len(g.nodes))
        metrics.bump(f"materialize:{reason}")
    if after_flush is not None:
        after_flush()


# eager/dynamism.py's cross_edges: growing tensors move to their next bucket together between
# regions, when every one of them is computed (it imports this module, hence the hook)
after_flush = None


def intercept(name: str, fn) -> None:
    """Install (None: remove) the region interceptor `name` ("after_flush"); called through
    eager/executor.intercept, the one place interceptors are installed."""
    global after_flush
    if name != "after_flush":
        raise ValueError(f"deferred.intercept: no interceptor named {name!r}")
    after_flush = fn


# A region of bucketed ops (a decode step over a KV cache padded to a power-of-two bucket:
# eager/dynamism.py, eager/growth.py) is compiled again at each bucket edge with the same ops
# and wiring, only the bucket changed. Those recompiles skip XLA's optimizations (op_program's
# fast options): a fraction of an optimized compile, and little run time lost on a program that
# runs only until the next edge. The first shape of a structure, the one a warm-up compiles,
# stays optimized; regions without bucketed ops (a training step) always compile optimized, as
# a second batch shape there runs as often as the first.
# A fast-compiled region is compiled optimized once its runs took TIER_UP x its fast compile:
# an optimized compile costs about four fast ones on XLA:CPU, so no more than about twice the
# best choice in hindsight is spent.
TIER_UP = 4.0
_structures = _caches.register("fused region structures", _caches.LRUSet(_caches.limit("regions")))


def _reshaped(nodes, out_refs) -> bool:
    """Whether this new region is a bucketed structure compiled before at another bucket
    (its ops' names and wiring; sizes and static arguments may differ)."""
    names = tuple(n.name.partition("[dynamic ")[0] for n in nodes)  # the padded lowerings' serials
    if len(names) == sum(1 for n in nodes if "[dynamic " not in n.name and n.name != "torchtpu::grow_append"):
        return False
    key = (names, tuple(n.refs for n in nodes), out_refs)
    if key in _structures:
        metrics.bump("fast_region_compiles")
        return True
    _structures.add(key)
    return False


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    if modes.get() == "defer_and_fuse":
        flush("optimizer_step")


pending.install(flush)  # runtime/ computes pending buffers through this (runtime/pending.py)


def install_hooks() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_on_optimizer_step)
