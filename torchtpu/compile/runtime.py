"""Calling a compiled graph with real tensors.

Inputs go in as their storages' flat buffers; each input's view is read inside
the program, so parameters and optimizer state never leave the device and
never take an extra dispatch. One jax.jit per graph, specialized per input
signature (shapes, layouts, dtypes, values of SymInt inputs): a new shape
compiles once and is counted in torchtpu.metrics() like any compile.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import config
from ..metrics import bump
from ..ops import checks as _checks
from ..runtime import executables
from ..runtime import checks as _pending_checks
from ..runtime import direct, donation, launcher, leaf, pending, placement, precision, rng, storage, tensors, transfer
from ..runtime.jaxenv import TORCH_TO_JAX, numpy_to_torch, to_torch_dtype, torch_to_numpy
from ..eager import dynamism as _dynamism
from ..eager import executor as _executor
from ..eager import memory_format
from ..eager.op_program import FAST_AFTER
from ..eager.op_program import fast_options
from . import collectives
from . import graph as _graph

_NUMBERS = (bool, int, float)


def _signature(args, skip=frozenset()):
    """(hashable signature, buffers to pass, storage entries) of one call's inputs; inputs
    at the positions in `skip` are not passed. A tpu tensor's signature is
    ("tpu", its storage's numel and dtype, its Leaf over the buffer at its position).
    Runs on every call, hence the plain loops."""
    sig = []
    bufs = []
    entries = []
    offsets = []  # nonzero storage offsets: runtime values, not part of the signature
    table = storage.table
    for pos, a in enumerate(args):
        if pos in skip:
            sig.append(("none",))
            bufs.append(None)
            entries.append(None)
            continue
        if isinstance(a, torch.Tensor):
            if a.device.type == "cpu":
                # numpy, not a jax array: jit moves it as part of the call, one dispatch
                # fewer; a copy, since the graph may write this tensor back afterwards
                bufs.append(torch_to_numpy(a))
                bump("transfers_to_device")
                sig.append(("cpu", tuple(a.shape), TORCH_TO_JAX[a.dtype]))
                entries.append(None)
                continue
            try:
                entry = table[a.untyped_storage()._cdata]
            except KeyError:
                entry = storage.lookup(a)  # raises the explanatory error
            sig.append(("tpu", entry.numel, entry.dtype, leaf.leaf_of(a, pos, offsets)))
            b = entry.buf
            bufs.append(b if type(b) is jax.Array or isinstance(b, jax.Array) else transfer.buffer(entry))
            entries.append(entry)
        elif a is None:
            sig.append(("none",))
            bufs.append(None)
            entries.append(None)
        elif isinstance(a, _NUMBERS) or isinstance(a, torch.SymInt):
            sig.append(("number", a))
            bufs.append(None)
            entries.append(None)
        elif isinstance(a, torch.ScriptObject) or type(a).__module__.startswith("torch.distributed"):
            # an opaque handle aot_autograd threads through the graph (a DeviceMesh or a
            # process group under DTensor): the program's collectives name their group
            sig.append(("opaque", type(a).__name__))
            bufs.append(None)
            entries.append(None)
        else:
            raise TypeError(f"torchtpu compile: unsupported graph input of type {type(a).__name__}")
    return tuple(sig), bufs, entries, offsets


# calls of one signature a symbolic graph serves in buckets before that size gets its own
# program (compile/runtime.CompiledGraph._call)
EXACT_AFTER = 16


class CompiledGraph:
    """An aot_autograd graph made callable on tpu tensors (boxed calling convention)."""

    def __init__(self, gm: torch.fx.GraphModule, label: str):
        # an instance attribute: aot_autograd's wrappers copy __dict__, not class attributes
        self._boxed_call = True
        self.program = _graph.Program(gm)
        self.label = label
        out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.out_vals = [
            n.meta.get("val") if isinstance(n, torch.fx.Node) else n for n in out_node.args[0]
        ]
        self.out_nodes = [n if isinstance(n, torch.fx.Node) else None for n in out_node.args[0]]
        # outputs whose fake values are laid out otherwise than contiguous (channels_last):
        # the program writes them in that order and they get those strides, as eager's do
        self.out_strides = [memory_format.fake_strides(v) for v in self.out_vals]
        # the same for outputs whose traced strides are expressions in sizes Dynamo made
        # symbolic: evaluated per call's sizes (a jitted program per size)
        self.layouts = _SymbolicLayouts([n for n in gm.graph.nodes if n.op == "placeholder"], self.out_vals)
        # Outputs the program need not produce: an input returned unchanged (aot_autograd's
        # forward returns the parameters it saves for backward) is that input tensor itself,
        # as Inductor returns it, and a node returned twice is one tensor. Each would
        # otherwise be a copy inside the program and one more buffer to hand out per call.
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        written = {n.args[0] for n in gm.graph.nodes
                   if n.op == "call_function" and n.target is torch.ops.aten.copy_.default}
        self.reuse: dict[int, tuple[str, int]] = {}
        first: dict = {}
        for pos, (n, val) in enumerate(zip(self.out_nodes, self.out_vals)):
            if n is not None and n.op == "placeholder" and not isinstance(val, torch.Tensor):
                # an opaque input (a DeviceMesh) or a SymInt saved for backward: itself
                self.reuse[pos] = ("input", placeholders.index(n))
                continue
            if n is None or not isinstance(val, torch.Tensor):
                continue
            if n in first:
                self.reuse[pos] = ("output", first[n])
            elif n.op == "placeholder" and n not in written:
                self.reuse[pos] = ("input", placeholders.index(n))
            else:
                view = _view_of_input(n, written)
                if view is not None:
                    # a saved transposed weight: the same storage, not a transposed copy
                    self.reuse[pos] = ("view", placeholders.index(view[0])) + view[1:]
                else:
                    first[n] = pos
        self._jits = executables.graph_programs(self.label)
        self._lock = threading.Lock()
        # A graph over sizes Dynamo made symbolic that appends to an input and returns it
        # (a decode step over a cache growing each token), or that gets an input with a
        # dynamic dim, runs through the deferred executor: its growth and dynamism rules
        # keep one program per bucket of sizes (eager/growth.py, eager/dynamism.py), where
        # a jitted graph is one program per size. Other symbolic graphs jit per size.
        self.symbolic = any(_symbolic(n.meta.get("val")) for n in placeholders)
        self.grown = _grown_inputs(gm, placeholders) if self.symbolic else ()
        # Inputs with one size Dynamo made symbolic (it does so once it saw the size vary)
        # that the graph does not write: they run as dynamic copies in a bucket, so the graph
        # is one program per bucket of sizes, not one per size (varying-size policy on).
        self._served: dict = {}  # signature -> calls served in buckets (EXACT_AFTER)
        self.varying = tuple((i, d) for i, n in enumerate(placeholders) if n not in written
                             for d in [_one_symbolic_dim(n.meta.get("val"))] if d is not None) \
            if self.symbolic else ()
        self.gm = gm if self.symbolic else None  # (what the deferred route runs)
        # A graph whose calls csrc/hit.cpp can serve once a signature's program has run (fixed
        # sizes, nothing written, no host part, collectives or random state): its programs
        # by quick key, where graph_fast finds them; None: every call is _call's
        prog = self.program
        self.native = self._jits.by_quick_key if _executor.graph_fast is not None and not self.symbolic \
            and prog.host is None and prog.collectives is None and not prog.n_random \
            and not prog.mutated_inputs and prog.refusal is None else None

    def _make(self, sig, donate, out_strides=None):
        """The jitted program for one input signature, and what its trace learns
        (output shapes, which CPU inputs it mutates), filled in on first call.
        Buffers at the positions in `donate` are handed to XLA to overwrite.
        `out_strides`: the outputs' layouts at this signature's sizes (else the traced ones)."""
        program = self.program
        reuse = self.reuse
        out_strides = self.out_strides if out_strides is None else out_strides
        learned = {"out_strides": out_strides}

        def run(donated, kept, rngdata, host_values, offsets):
            bufs = donation.merge(donated, kept, donate)
            inputs = []
            # input position -> its offset where that is a runtime value (the leaf's is None)
            ofs = iter(range(len(offsets)))
            at = {i: offsets[next(ofs)] for i, s in enumerate(sig) if s[:1] == ("tpu",) and s[3].offset is None}
            for i, (s, b) in enumerate(zip(sig, bufs)):
                if s[0] == "tpu":
                    inputs.append(leaf.read(bufs, s[3], at.get(i)))
                elif s[0] == "cpu":
                    inputs.append(b)
                elif s[0] == "number":
                    inputs.append(s[1])
                else:
                    inputs.append(None)
            with _checks.collect() as checks:
                outs, mutated = program(inputs, rngdata,
                                        _unpack_host(host_values, sig[-1]) if program.host is not None else ())
            learned["checks"] = tuple(checks.checks) if checks is not None else ()
            outs = [None if i in reuse else o for i, o in enumerate(outs)]
            # the new contents of each mutated input's storage
            written = {}
            host = []
            for i, new in sorted(mutated.items()):
                if sig[i][0] == "cpu":
                    host.append((i, new))
                    continue
                leaf.write(bufs, sig[i][3], new, at.get(i))
                written[i] = bufs[i]
            # CPU inputs mutated in the graph (an optimizer's step counts) come back as one
            # array, so writing them back costs one transfer, not one per tensor
            packed = jnp.concatenate([v.reshape(-1).astype(jnp.float64 if v.dtype.kind != "c" else jnp.complex128)
                                      for _, v in host]) if host else None
            learned["host"] = [(i, tuple(v.shape), v.size) for i, v in host]
            # outputs leave flat: a reshape outside the program would be a dispatch of its own
            outs = [None if o is None else jnp.asarray(o) for o in outs]
            learned["shapes"] = [None if o is None else tuple(o.shape) for o in outs]
            flags = checks.packed() if checks is not None else None  # one flag array per program
            return [None if o is None else memory_format.physical(o, st).reshape(-1)
                    for o, st in zip(outs, out_strides)], written, packed, flags

        if program.collectives is not None:
            return collectives.spmd(run, program.collectives, bool(donate)), learned
        fast = {"compiler_options": fast_options()} if self._reshaped(sig) else {}
        return jax.jit(run, donate_argnums=(0,) if donate else (), **fast), learned

    def _deferred(self, args, own_region: bool = False) -> list:
        """Run the graph's ATen ops through the deferred executor: they record into one
        region, run as one program per bucket of the growing sizes. `own_region`: the region
        ends with the graph in defer_and_fuse too (strict ends it anyway)."""
        from ..eager import growth, modes

        bump("deferred_graph_calls")
        for i in self.grown:
            # appended to from this call on (growth starts at a cat's output otherwise,
            # one program later, and again for every graph that hands it over)
            a = args[i]
            entry = storage.table.get(a.untyped_storage()._cdata) if a.device.type == "tpu" else None
            if entry is not None:
                growth.mark_grown(entry)
        with modes.mode("defer_and_fuse"), _dynamism.graph_views():
            outs = self.gm(*args)
        if own_region:
            pending.materialize("compiled_graph")
        args.clear()
        return list(outs)

    def _reshaped(self, sig) -> bool:
        """Whether this signature compiles without XLA's optimizations: a graph over sizes
        Dynamo made symbolic (and growing none of its inputs: those defer) is specialized
        per size, each program run about once; past the graph's FAST_AFTER-th such program
        they compile at -O0, as eager ops past their FAST_AFTER-th shape do."""
        if len(self._jits) < FAST_AFTER or not any(s[:1] == ("number",) for s in sig):
            return False
        bump("fast_compiles")
        return True

    def __call__(self, args):
        if self.native is not None and type(args) is list:
            got = _graph_fast(self.native, args)
            if got is not NotImplemented:
                return got
        refusal = self.program.refusal
        if refusal is not None:
            raise refusal[0](refusal[1])
        if placement.spread():  # more than tpu:0 in use: the program runs on its tensors' device
            with placement.on(self._device(args)):
                return self._call(args)
        return self._call(args)

    def _device(self, args) -> int:
        """The one tpu device of the graph's inputs and results (XLA runs a program on one)."""
        found = {v.device.index for v in list(self.out_vals) + list(args)
                 if isinstance(v, torch.Tensor) and v.device.type == "tpu"}
        if len(found) > 1:
            raise RuntimeError(
                f"tpu compiled graph {self.label}: its tensors are on devices "
                f"{', '.join(f'tpu:{i}' for i in sorted(found))}; a compiled graph runs on one device. "
                "Compile each device's part separately (torch.compile the stage, not the whole "
                "pipeline) or move the tensors with .to() between compiled calls.")
        return found.pop() if found else placement.current()

    def _call(self, args):
        args = list(args)
        if self.symbolic and self.program.collectives is None:
            if self.grown or _dynamism.any_dynamic(args):
                return self._deferred(args)
        host = self.program.host
        mutated = self.program.mutated_inputs
        precision.sync()
        context = (torch.get_float32_matmul_precision(), _checks.enabled_cell[0])
        q = _quick_scan(args) if host is None else None
        got = None
        if q is not None:
            qkey, bufs, entries, offsets = q
            donate = _donatable(mutated, bufs, entries) if mutated else ()
            got = self._jits.by_quick_key.get((qkey, donate, context))
        if got is not None:
            bump("cache_hits")
            offsets = np.asarray(offsets, np.int64) if offsets else ()
            return self._run(got, args, bufs, entries, offsets, donate, (), ())
        if q is not None:
            # only the key: a buffer still held here would read as shared to _donatable
            q = (q[0],)
            bufs = entries = None
        sig, bufs, entries, offsets = _signature(args, host.host_only if host is not None else frozenset())
        # a view's nonzero offset rides as a runtime value: one program for every offset
        offsets = np.asarray(offsets, np.int64) if offsets else ()
        host_values = ()
        host_outs = ()
        if host is not None:
            # after _signature took its copies of the CPU inputs the program reads: the
            # host part may overwrite them (step += 1)
            got = host.fn(*args)
            n = len(host.to_device)
            host_values, layout = _pack_host(got[:n])
            host_outs = dict(zip(host.outputs, got[n:]))
            sig = sig + (layout,)
        donate = _donatable(mutated, bufs, entries) if mutated else ()
        key = (sig, donate) + context  # a new matmul precision compiles anew
        got = self._jits.get(key)
        if got is None and self.varying and self.program.collectives is None and host is None:
            # A size Dynamo made symbolic with no program of its own: the graph runs over its
            # inputs as dynamic copies in a bucket, one program per bucket; a size that keeps
            # coming back (EXACT_AFTER calls) gets its own program, a jitted call being ~10x
            # cheaper on the host than the deferred route's op-by-op recording.
            served = self._served.get(key, 0) + 1
            if served <= EXACT_AFTER:
                if len(self._served) >= 4096:
                    self._served.clear()
                self._served[key] = served
                # in defer_and_fuse, what is pending first: the graph's region is its own
                pending.materialize("compiled_graph")
                if _dynamism.vary_inputs(args, self.varying):
                    bufs = entries = None  # (held here, they would read as shared to donation)
                    return self._deferred(args, own_region=True)
            else:
                bump("graph_sizes_exact")
        if got is None:
            with self._lock:
                got = self._jits.get(key)
                if got is None:
                    ctx = self.program.collectives
                    if ctx is not None and ctx.digest:
                        # a new program with collectives: every rank must be about to run the same
                        ctx.group.check_program(f"{ctx.what} ({self.label})", ctx.digest)
                    got = self._make(sig, donate, self.layouts.strides(args, self.out_strides))
                    self._jits.admit(key, got)  # one graph over ever new shapes: oldest programs go first
                    fn = got[0]
                    bump("compiles")
                    bump("compile_graphs")
                    _maybe_dump(self, fn, [bufs[i] for i in donate],
                                [None if i in donate else b for i, b in enumerate(bufs)], host_values, offsets)
        else:
            bump("cache_hits")
        if q is not None:
            self._jits.remember((q[0], donate, context), key, got)
        return self._run(got, args, bufs, entries, offsets, donate, host_values, host_outs, key)

    def _run(self, got, args, bufs, entries, offsets, donate, host_values, host_outs, key=None):
        """Launch the program `got` (fn, what its trace learned) and hand out its results."""
        fn, learned = got
        rngdata = rng.next_key_data() if self.program.n_random else ()
        compiling = "outs" not in learned  # (filled in below after its first run)
        t0 = time.perf_counter() if compiling else None
        call_args = (donation.split(bufs, donate) if donate else (), bufs, rngdata, host_values, offsets)
        del bufs
        # what csrc/hit.cpp's graph_fast calls (no donation, random state or host values): its
        # executable without jax.jit's dispatch, planned while JAX holds the lowering
        wants_direct = compiling and self.native is not None and not donate and not rngdata and not host_values
        outs, written, packed, flags = launcher.launch(fn, call_args, what=self._what, compiling=compiling,
                                                       timing=self._what,
                                                       account=(self._jits, key) if compiling and key is not None else None,
                                                       compiled=functools.partial(_plan_direct, learned, fn, call_args)
                                                       if wants_direct else None)
        del call_args
        if compiling:
            bump("compile_ms", int((time.perf_counter() - t0) * 1000))
            learned["outs"] = self._out_plan(learned, outs)
            if self.native is not None and flags is None and not written and packed is None:
                native = _native_plan(learned["outs"])
                if native is not None:
                    learned["native"] = native
        bump("executions")
        if written:
            leaf.commit(entries, written)
        if packed is not None:
            _write_host(args, learned["host"], packed)
        results = []
        for plan, o in zip(learned["outs"], outs):
            kind = plan[0]
            if kind == _FRESH:
                results.append(tensors.empty(plan[1], plan[2], o, plan[3]))
            elif kind == _INPUT:
                results.append(args[plan[1]])
            elif kind == _OUTPUT:
                results.append(results[plan[1]])
            elif kind == _VIEW:
                base = args[plan[1]]
                results.append(tensors.alias(base, plan[2], plan[3], base.storage_offset() + plan[4]))
            elif kind == _HOST_OUT:
                results.append(host_outs[plan[1]])
            elif kind == _TO_CPU:
                results.append(numpy_to_torch(jax.device_get(o)).reshape(plan[1]))
                bump("transfers_to_host")
            elif kind == _NUMBER:
                results.append(None if o is None else o.reshape(()).item())
            else:
                results.append(None)
        args.clear()
        if flags is not None:
            reuse = self.reuse
            _flagged(learned["checks"], flags, [(entries[i], new) for i, new in written.items()],
                     [r for pos, r in enumerate(results) if pos not in reuse])
        return results

    def _what(self) -> str:
        return f"tpu compiled graph {self.label}"

    def _out_plan(self, learned, outs) -> list:
        """How each output is handed out at one signature, decided once from what the graph
        and the program's first run say (per call this was a chain of type checks)."""
        plan = []
        reuse = self.reuse
        host = self.program.host
        host_nodes = set(host.outputs) if host is not None else set()
        out_strides = learned["out_strides"]  # the layouts the program wrote at this signature's sizes
        for pos, (val, node, o, shape) in enumerate(zip(self.out_vals, self.out_nodes, outs, learned["shapes"])):
            if pos in reuse:
                kind, i, *view = reuse[pos]
                plan.append((_INPUT, i) if kind == "input" else (_OUTPUT, i) if kind == "output"
                            else (_VIEW, i, *view))
            elif node in host_nodes:
                plan.append((_HOST_OUT, node))
            elif isinstance(val, torch.Tensor) and o is None:
                # an effect token (aot_autograd threads None through the graph and drops it)
                plan.append((_NONE,))
            elif isinstance(val, torch.Tensor):
                if val.device.type == "cpu":
                    plan.append((_TO_CPU, shape))
                else:
                    st = out_strides[pos]  # (the program wrote it in that order)
                    plan.append((_FRESH, shape, to_torch_dtype(o.dtype),
                                 st if st is not None and len(st) == len(shape) else None))
            elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or isinstance(val, _NUMBERS):
                plan.append((_NUMBER,))
            else:
                plan.append((_NONE,))
        return plan


# how _run hands out each output (CompiledGraph._out_plan)
_FRESH, _INPUT, _OUTPUT, _VIEW, _HOST_OUT, _TO_CPU, _NUMBER, _NONE = range(8)
_graph_fast = _executor.graph_fast


def _native_plan(outs) -> tuple | None:
    """The output plan as csrc/hit.cpp's graph_fast reads it, or None where it has an output
    kind only _run hands out (a view, a host or CPU output, a number, a carried dtype)."""
    plan = []
    for p in outs:
        kind = p[0]
        if kind == _FRESH:
            jdt = tensors.PLAIN.get(p[2])
            if jdt is None:
                return None
            plan.append((0, tuple(p[1]), p[2], jdt, math.prod(p[1]), None if p[3] is None else tuple(p[3])))
        elif kind == _INPUT:
            plan.append((1, p[1]))
        elif kind == _OUTPUT:
            plan.append((2, p[1]))
        elif kind == _NONE:
            plan.append((3,))
        else:
            return None
    return tuple(plan)


_ArrayImpl = type(jnp.zeros(()))


def _quick_scan(args):
    """(quick key, buffers, entries, nonzero offsets) of a call whose inputs are tensors, None
    and numbers; None otherwise. Like eager/op_args.scan, read off the tensors' metadata
    without building leaves: finer than _signature's key, never coarser (a tpu input's
    storage numel and dtype, sizes, strides, whether its offset is nonzero, dtype and lazy
    bits; a CPU input's sizes and dtype; a number and its type)."""
    key, bufs, entries, offsets = [], [], [], []
    table = storage.table
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_cpu:
                bufs.append(torch_to_numpy(a))  # (as _signature: a copy, passed with the call)
                bump("transfers_to_device")
                key.append((a.shape, a.dtype))
                entries.append(None)
                continue
            entry = table.get(a.untyped_storage()._cdata)
            if entry is None:
                return None
            off = a.storage_offset()
            if off:
                offsets.append(off)
            key.append((entry.numel, entry.dtype, a.shape, a.stride(), off != 0, a.dtype, a.is_neg(), a.is_conj()))
            b = entry.buf
            bufs.append(b if type(b) is _ArrayImpl or isinstance(b, jax.Array) else transfer.buffer(entry))
            entries.append(entry)
        elif a is None:
            key.append(None)
            bufs.append(None)
            entries.append(None)
        elif type(a) in _NUMBER_TYPES:
            if a != a:
                return None
            key.append((a, type(a)))
            bufs.append(None)
            entries.append(None)
        else:
            return None
    return tuple(key), bufs, entries, offsets


_NUMBER_TYPES = frozenset(_NUMBERS)


def _donatable(mutated, bufs, entries) -> tuple:
    """Mutated inputs whose old buffer nobody else can see: XLA may update them in place.
    A buffer shared with another storage, a deferred region or a second argument is kept."""
    # held by the list and the storage entry only
    return tuple([i for i in mutated if entries[i] is not None and donation.exclusively_held(bufs, i, holders=1)])


class _SymbolicLayouts:
    """Strides of the outputs whose traced (fake) strides are expressions in sizes Dynamo made
    symbolic, at one call's sizes. Code after the graph was traced with those strides: a view
    aot_autograd regenerates from an output (as_strided with the traced strides), a model's own
    as_strided (Longformer's overlapping chunks). A contiguous output where a transposed one was
    traced would be read at the wrong places."""

    def __init__(self, placeholders, out_vals):
        self.placeholders = placeholders
        self.outs = {pos: v for pos, v in enumerate(out_vals)
                     if isinstance(v, torch.Tensor) and v.dim() >= 2 and _graph.has_symbols(v)}

    def strides(self, args, traced: list) -> list:
        """`traced` with each symbolic output's strides at these args' sizes (None: contiguous)."""
        if not self.outs:
            return traced
        sizes = _graph.bind_sizes(self.placeholders, args)
        out = list(traced)
        for pos, v in self.outs.items():
            try:
                m = _graph.at_sizes(v, sizes)
            except TypeError:  # a size no input names (data-dependent): contiguous, as before
                continue
            out[pos] = memory_format.laid_out(tuple(m.shape), m.stride())
        return out


def _grown_inputs(gm, placeholders) -> tuple:
    """Positions of the graph inputs it appends to by cat along a symbolic dim and returns
    (a KV cache, token ids): what it gets next call is that output, one step longer."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = set(a for a in out.args[0] if isinstance(a, torch.fx.Node))
    grown = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.cat.default or n not in returned:
            continue
        first = n.args[0][0] if n.args[0] else None
        if not isinstance(first, torch.fx.Node) or first.op != "placeholder":
            continue
        val = first.meta.get("val")
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        if isinstance(val, torch.Tensor) and val.dim() and isinstance(val.shape[dim % val.dim()], torch.SymInt):
            grown.append(placeholders.index(first))
    return tuple(grown)


def _one_symbolic_dim(val) -> int | None:
    """The dim of a graph input's fake tensor value that is its one symbolic size, if so."""
    if not isinstance(val, torch.Tensor):
        return None
    dims = [d for d, s in enumerate(val.shape) if isinstance(s, torch.SymInt)]
    return dims[0] if len(dims) == 1 else None


def _symbolic(val) -> bool:
    """Whether a graph input's fake value has a size Dynamo made symbolic."""
    if isinstance(val, torch.SymInt):
        return True
    return isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape)


def _flagged(declared, flags, writes, results) -> None:
    """Keep a program's check flags for the next host read; a tripped one loses the
    storages the program wrote (its outputs and mutated inputs)."""
    from ..eager import modes

    writes = list(writes)
    for t in results:
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            e = storage.table.get(t.untyped_storage()._cdata)
            if e is not None:
                writes.append((e, e.buf))
    _pending_checks.add(flags, declared, None, writes)
    if modes.get() == "debug":
        _pending_checks.raise_pending()


def _view_of_input(node, written):
    """(placeholder, shape, stride, offset from the input's) when `node` is a chain of
    same-dtype views of a tpu graph input nothing writes, else None."""
    val = node.meta.get("val")
    n = node
    while (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
           and _graph.is_view(n.target) and isinstance(n.args[0], torch.fx.Node)):
        n = n.args[0]
    if n is node or n.op != "placeholder" or n in written:
        return None
    base = n.meta.get("val")
    if (not isinstance(base, torch.Tensor) or base.device.type != "tpu" or base.dtype != val.dtype
            or any(isinstance(x, torch.SymInt) for x in (*val.shape, *val.stride(), val.storage_offset(),
                                                        base.storage_offset()))):
        return None
    return n, tuple(val.shape), tuple(val.stride()), val.storage_offset() - base.storage_offset()


def _pack_host(values) -> tuple:
    """The host part's values for the program as one array per dtype, and their layout
    (Python numbers in it, static): an optimizer step hands over two values per parameter,
    and one argument each cost more to convert and to dispatch than the work they carry."""
    groups: dict = {}
    layout = []
    for v in values:
        if isinstance(v, torch.Tensor):
            g = groups.get(v.dtype)
            if g is None:
                g = groups[v.dtype] = [len(groups), [], 0, True]
            layout.append(("t", g[0], g[2], tuple(v.shape), v.dtype))
            g[1].append(v)
            g[2] += v.numel()
            g[3] = g[3] and v.dim() == 0
        else:
            # a Python number (a SymInt the host part computed: a batch size a view needs)
            # is static, as a number graph input is: one program per value
            layout.append(("n", v))
    arrays = tuple(
        # .item() of a 0-d tensor is exact for every dtype (a float32 is a Python float)
        np.array([t.item() for t in ts], dtype=TORCH_TO_JAX[ts[0].dtype]) if scalars
        else torch_to_numpy(torch.cat([t.reshape(-1) for t in ts]))
        for _, ts, _, scalars in groups.values()
    )
    return arrays, tuple(layout)


def _unpack_host(arrays, layout) -> list:
    out = []
    for item in layout:
        if item[0] == "t":
            _, g, off, shape, _ = item
            out.append(arrays[g][off:off + math.prod(shape)].reshape(shape))
        else:
            out.append(item[1])
    return out


def _write_host(args, host, packed) -> None:
    values = numpy_to_torch(jax.device_get(packed))
    bump("transfers_to_host")
    pos = 0
    for i, shape, n in host:
        args[i].copy_(values[pos:pos + n].reshape(shape))
        pos += n


def _maybe_dump(compiled: CompiledGraph, fn, donated, kept, host_values=(), offsets=()) -> None:
    path = config.read("dump_stablehlo")
    if not path and not _dumping:
        return
    rngdata = (np.uint32(0),) * 3 if compiled.program.n_random else ()
    text = fn.lower(donated, kept, rngdata, host_values, offsets).as_text()
    for sink in _dumping:
        sink.append((compiled.label, text))
    if path:
        os.makedirs(path, exist_ok=True)
        n = len(os.listdir(path))
        with open(os.path.join(path, f"{n:04d}_{compiled.label}.stablehlo.mlir"), "w") as f:
            f.write(text)


_dumping: list[list] = []


def _plan_direct(learned: dict, fn, call_args: tuple) -> None:
    learned["direct"] = direct.plan(fn, call_args)
