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
are outputs: buffers nobody holds are never computed.
"""
from __future__ import annotations

import os
import sys
import threading
import weakref

import jax

from .. import metrics
from ..runtime import rng
from . import scalars as _scalars

_lock = threading.RLock()
MAX_OPS = int(os.environ.get("TORCHTPU_DEFER_MAX_OPS", "4096"))


class Pending:
    """A buffer that a recorded op will produce: (node index, output key)."""

    __slots__ = ("node", "key", "graph")

    def __init__(self, node: int, key, graph):
        self.node = node
        self.key = key
        self.graph = graph


class Failed:
    """A buffer whose computation failed at materialization; reading it re-raises."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error

    def raise_(self):
        raise RuntimeError(
            f"torchtpu: this tensor's value was lost because computing it failed earlier: "
            f"{type(self.error).__name__}: {self.error}"
        ) from self.error


class _Node:
    __slots__ = ("program", "refs", "nscalars", "rng", "origin", "name")

    def __init__(self, program, refs, nscalars, rng, origin, name):
        self.program = program
        self.refs = refs
        self.nscalars = nscalars
        self.rng = rng
        self.origin = origin
        self.name = name


class _Graph:
    def __init__(self):
        self.nodes: list[_Node] = []
        self.inputs: list = []
        self.input_index: dict[int, int] = {}
        self.scalars: list = []
        self.rngs: list = []
        self.fingerprint: list = []
        self.written: list = []


_graph = _Graph()
_fused_cache: dict = {}

_SKIP_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (sys.modules["torch"], sys.modules["torchtpu"])
)


def _origin():
    """The user's (file, line, function) that issued the current op, if any."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP_DIRS) and not fn.startswith("<frozen"):
            return (fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def pending_count() -> int:
    return len(_graph.nodes)


def record(compiled, key, entries, dyn, low, make_output):
    """Record one op; returns its output entries' Pendings via `make_output`."""
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
        rngdata = rng.next_key_data() if low.random else None
        if rngdata is not None:
            g.rngs.append(rngdata)
        g.nodes.append(_Node(compiled.program, refs, len(dyn), rngdata is not None, _origin(), low.name))
        g.scalars.extend(dyn)
        g.fingerprint.append((compiled, refs))  # compiled objects live in the op cache: hash by identity
        written = g.written
        if low.mode == "inplace":
            for s in compiled.updated:
                e = entries[s]
                p = Pending(j, ("u", s), g)
                e.buf = p
                written.append((weakref.ref(e), p))
            result = None
        else:
            result = []
            k = 0
            for meta in compiled.outs:
                if meta is None:  # an output not asked for
                    result.append(None)
                    continue
                p = Pending(j, k, g)
                t, e = make_output(meta[0], meta[1], p)
                written.append((weakref.ref(e), p))
                result.append(t)
                k += 1
        if len(g.nodes) >= MAX_OPS:
            flush("size_cap")
        return result


def _make_fused(nodes, out_refs, codes):
    programs = [(n.program, n.refs, n.nscalars, n.rng, n.origin, n.name) for n in nodes]

    def fused(inputs, packed, rngs):
        scalars = _scalars.unpack(packed, codes)
        vals = {}
        si = 0
        ri = 0
        for j, (program, refs, ns, has_rng, origin, name) in enumerate(programs):
            bufs = tuple(
                None if r is None else (inputs[r[1]] if r[0] == 1 else vals[(r[1], r[2])]) for r in refs
            )
            rngdata = rngs[ri] if has_rng else ()
            ri += has_rng
            try:
                outs, updated = program(bufs, tuple(scalars[si:si + ns]), rngdata)
            except Exception as e:
                where = f"{origin[0]}:{origin[1]} in {origin[2]}" if origin else "(no user frame: backward)"
                e.add_note(f"torchtpu: raised by deferred op {name}, issued at {where}")
                raise
            si += ns
            for k, o in enumerate(outs):
                vals[(j, k)] = o
            for s, b in updated.items():
                vals[(j, ("u", s))] = b
        return tuple(vals[r] for r in out_refs)

    return jax.jit(fused)


def flush(reason: str) -> None:
    """Materialize every pending value (compiling the region once per fingerprint)."""
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
        fkey = (tuple(g.fingerprint), out_refs, codes)
        fn = _fused_cache.get(fkey)
        if fn is None:
            fn = _make_fused(g.nodes, out_refs, codes)
            _fused_cache[fkey] = fn
            metrics.bump("compiles")
            metrics.bump("region_compiles")
        else:
            metrics.bump("cache_hits")
        try:
            results = fn(tuple(g.inputs), _scalars.pack(g.scalars, codes), tuple(g.rngs))
        except Exception as err:
            _fused_cache.pop(fkey, None)
            for e, _ in live:
                e.buf = Failed(err)
            raise
        for (e, _), r in zip(live, results):
            e.buf = r
        metrics.bump("executions")
        metrics.bump("regions_executed")
        metrics.bump("region_ops", len(g.nodes))
        metrics.bump(f"materialize:{reason}")


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    from . import modes

    if modes.get() == "defer_and_fuse":
        flush("optimizer_step")


def install_hooks() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_on_optimizer_step)
