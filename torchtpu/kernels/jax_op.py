"""torchtpu.jax_op: a jittable JAX function (jnp code, a Pallas kernel, a Tokamax or Helion
kernel) as a torch.library custom op on "tpu".

The op is an entry of the one lowering table (ops/registry.py), so every executor serves it
as it serves an ATen op: strict eager (one executable per signature), debug, defer_and_fuse
(a node of the fused region) and torch.compile (lowered inline into the graph's program).
Its backward is a second op, "<name>_vjp", whose lowering is the JAX vjp of the function
(a `jax.custom_vjp` in it, such as a Pallas backward kernel, is used as written), run as a
program of its own. Its fake (meta) kernel is `jax.eval_shape` of the function.

Pallas: XLA:CPU cannot compile a `pallas_call`; on the CPU platform the function is traced
with Pallas's interpret mode forced on (interpret=None, the default), so the same kernel
runs here and compiles natively on a TPU or GPU.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..ops import registry
from ..runtime import cache as _caches
from ..runtime.jaxenv import numpy_to_torch, to_jax_dtype, to_torch_dtype, torch_to_numpy
from . import schema as _schema

_lock = threading.Lock()
OPS: dict[str, "JaxOp"] = {}  # "mylib::swiglu" -> its registration


class JaxOp:
    """What jax_op registered for one name: the function, its signature and its ops."""

    def __init__(self, name: str, fn: Callable, sig: _schema.Signature, interpret):
        self.name = name
        self.fn = fn
        self.sig = sig
        self.interpret = interpret
        self.opdef = None  # the torch.library CustomOpDef, callable like the function
        self.vjp_name = name + "_vjp"

    # --- calling the user's function on JAX values -------------------------------------

    def _interpret_context(self):
        interpret = self.interpret
        if interpret is None:
            from ..runtime.jaxenv import platform

            interpret = platform() == "cpu"
        if interpret is False:
            return contextlib.nullcontext()
        return _pallas_interpret(interpret)

    def call(self, args: list, kwargs: dict, lowered: bool = True):
        """fn on JAX values (tensors) and static values, arguments in schema order; returns
        its outputs as a tuple of arrays, checked against the schema. lowered=False: for
        jax.eval_shape only (nothing is compiled, so the platform is not asked for: asking
        starts the XLA runtime, which must wait for dist.init_process_group)."""
        args, kwargs = self._statics(args, kwargs)
        with self._interpret_context() if lowered else contextlib.nullcontext():
            out = self.fn(*args, **kwargs)
        return self._outputs(out)

    def _statics(self, args, kwargs):
        params = self.sig.params
        by_name = {p.name: p for p in params}
        kwargs = {k: _static(by_name[k], v) for k, v in kwargs.items()}
        pos = []
        for p, a in zip(params, args):
            if p.kwarg_only:
                kwargs[p.name] = _static(p, a)
            else:
                pos.append(_static(p, a))
        return pos, kwargs

    def _outputs(self, out) -> tuple:
        n = self.sig.num_outputs
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if n == 1 and isinstance(out, (tuple, list)) and len(out) != 1:
            raise RuntimeError(
                f"{self.name}: the function returned {len(outs)} values but its schema returns one "
                "Tensor; annotate the return as tuple[jax.Array, ...] or pass num_outputs="
            )
        if n is not None and n > 1 and len(outs) != n:
            raise RuntimeError(f"{self.name}: the function returned {len(outs)} values, its schema {n}")
        for o in outs:
            if not isinstance(o, (jax.Array, np.ndarray)) and not hasattr(o, "aval"):
                raise RuntimeError(f"{self.name}: the function returned {type(o).__name__}, not an array")
        return tuple(jnp.asarray(o) for o in outs)

    # --- the lowerings ------------------------------------------------------------------

    def forward_lowering(self, *args, **kwargs):
        outs = self.call(list(args), kwargs)
        if self.sig.returns == "Tensor":
            return outs[0]
        return list(outs) if self.sig.returns == "Tensor[]" else outs

    def vjp_lowering(self, *args):
        """args: every forward argument (positional), the cotangents, which tensor leaves
        need a gradient. Returns those gradients, in leaf order."""
        n = len(self.sig.params)
        fargs, cotangents, needs = list(args[:n]), args[n], args[n + 1]
        leaves = _leaves(self.sig.params, fargs)
        wanted = [pos for pos, need in zip(leaves, needs) if need]

        def f(*diff):
            a = [list(v) if isinstance(v, (list, tuple)) and self.sig.params[i].type.startswith("Tensor[")
                 else v for i, v in enumerate(fargs)]
            for (i, j), v in zip(wanted, diff):
                if j is None:
                    a[i] = v
                else:
                    a[i][j] = v
            return self.call(a, {})

        primals = [fargs[i] if j is None else fargs[i][j] for i, j in wanted]
        # the pullback traces a custom_vjp's backward (a Pallas kernel) too: same context
        with self._interpret_context():
            outs, pullback = jax.vjp(f, *primals)
            cts = tuple(
                np.zeros(o.shape, jax.dtypes.float0) if not jnp.issubdtype(o.dtype, jnp.inexact)
                else jnp.asarray(c).astype(o.dtype)
                for o, c in zip(outs, cotangents)
            )
            return [jnp.asarray(g) for g in pullback(cts)]

    # --- fake (meta) kernels --------------------------------------------------------------

    def forward_fake(self, *args, **kwargs):
        device = _device_of(args)
        shapes = self.out_shapes(args, kwargs)
        outs = [torch.empty(s.shape, dtype=to_torch_dtype(s.dtype), device=device) for s in shapes]
        if self.sig.returns == "Tensor":
            return outs[0]
        return list(outs) if self.sig.returns == "Tensor[]" else tuple(outs)

    def out_shapes(self, args, kwargs) -> tuple:
        """The outputs' shapes and dtypes (jax.eval_shape, cached per signature)."""
        return _eval_shape(self, _key(args, kwargs))

    def vjp_fake(self, *args):
        n = len(self.sig.params)
        fargs, needs = args[:n], args[n + 1]
        leaves = _leaves(self.sig.params, list(fargs))
        out = []
        for (i, j), need in zip(leaves, needs):
            if need:
                t = fargs[i] if j is None else fargs[i][j]
                out.append(torch.empty_like(t, memory_format=torch.contiguous_format))
        return out


def _pallas_interpret(value):
    """Trace under Pallas's interpret mode: every pl.pallas_call in the function runs as
    ordinary XLA ops (True: the generic interpreter; or an InterpretParams object)."""
    from jax._src import config

    flag = config.pallas_tpu_interpret_mode_context_manager

    @contextlib.contextmanager
    def ctx():
        prev = flag.swap_local(value)
        try:
            yield
        finally:
            flag.set_local(prev)

    return ctx()


def _static(param: _schema.Param, v):
    """A value as the function expects it: tuples for int[]/float[]/bool[] (the dispatcher
    hands lists), a list of arrays for Tensor[]."""
    if v is None:
        return None
    t = param.type
    if t.endswith("[]") or t.endswith("[]?"):
        return list(v) if t.startswith("Tensor") else tuple(v)
    if t.startswith("ScalarType") and isinstance(v, torch.dtype):
        return to_jax_dtype(v)
    return v


def _leaves(params, args) -> list[tuple[int, int | None]]:
    """Positions of the tensor values among the arguments: (argument, index in a list)."""
    out = []
    for i, p in enumerate(params):
        if not p.tensor or i >= len(args) or args[i] is None:
            continue
        if p.type == "Tensor[]":
            out.extend((i, j) for j in range(len(args[i])))
        else:
            out.append((i, None))
    return out


def _device_of(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, torch.Tensor):
                    return x.device
    return torch.device("tpu")


def _abstract(a):
    """An argument as part of a hashable signature: a tensor by shape and dtype (a symbolic
    size is specialized: int() guards on it, so another size traces again), the rest by value."""
    if isinstance(a, torch.Tensor):
        return ("T", tuple(int(s) for s in a.shape), a.dtype)
    if isinstance(a, (list, tuple)):
        if any(isinstance(x, torch.Tensor) for x in a):
            return ("L", tuple(_abstract(x) for x in a))  # a tensor list
        return ("V", tuple(int(x) if isinstance(x, torch.SymInt) else x for x in a))
    if isinstance(a, torch.SymInt):
        return ("V", int(a))
    return ("V", a)


def _key(args, kwargs) -> tuple:
    return tuple(_abstract(a) for a in args), tuple((k, _abstract(v)) for k, v in kwargs.items())


def _concrete(k, arrays: list, tensor_like):
    """A signature entry back as a value; tensors become tensor_like(shape, dtype) and are
    collected in `arrays` as (path, value)."""
    tag, v = k[0], k[1]
    if tag == "T":
        return tensor_like(v, k[2])
    if tag == "L":
        return [_concrete(x, arrays, tensor_like) for x in v]
    return v


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, to_jax_dtype(dtype))


@functools.lru_cache(maxsize=4096)
def _eval_shape_cached(op: JaxOp, key: tuple):
    pos_key, kw_key = key
    vals = [_concrete(k, [], _sds) for k in pos_key]
    kw = {name: _concrete(k, [], _sds) for name, k in kw_key}
    arrays = [i for i, k in enumerate(pos_key) if k[0] in ("T", "L")]

    def f(*xs):
        a = list(vals)
        for i, x in zip(arrays, xs):
            a[i] = x
        return op.call(a, kw, lowered=False)

    return jax.eval_shape(f, *[vals[i] for i in arrays])


_caches.register("jax_op output shapes", _eval_shape_cached)


def _eval_shape(op: JaxOp, key: tuple):
    try:
        return _eval_shape_cached(op, key)
    except RuntimeError as err:
        if op.name in str(err):
            raise
        raise RuntimeError(f"{op.name}: {err}") from err
    except Exception as err:
        raise RuntimeError(f"{op.name}: {type(err).__name__}: {err}") from err


# --- autograd -----------------------------------------------------------------------------


def _setup_context(op: JaxOp):
    params = op.sig.params

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        args = list(inputs)
        for p in params[len(args):]:
            args.append((keyword_only_inputs or {}).get(p.name, p.default))
        leaves = _leaves(params, args)
        tensors = [args[i] if j is None else args[i][j] for i, j in leaves]
        ctx.save_for_backward(*tensors)
        held = {i for i, _ in leaves} | {i for i, p in enumerate(params) if p.type == "Tensor[]"}
        ctx.jax_args = [None if i in held else a for i, a in enumerate(args)]
        ctx.jax_lists = [i for i, p in enumerate(params) if p.type == "Tensor[]"]
        ctx.jax_leaves = leaves
        ctx.jax_leaf_grad = [t.requires_grad and (t.is_floating_point() or t.is_complex()) for t in tensors]
        outs = list(output) if isinstance(output, (tuple, list)) else [output]
        ctx.jax_outs = [(tuple(o.shape), o.dtype) for o in outs]
        frozen = [o for o in outs if not (o.is_floating_point() or o.is_complex())]
        if frozen:
            ctx.mark_non_differentiable(*frozen)

    return setup_context


def _backward(op: JaxOp, vjp):
    params = op.sig.params

    def backward(ctx, *grads):
        if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
            grads = tuple(grads[0])  # a Tensor[] output
        tensors = ctx.saved_tensors
        leaves = ctx.jax_leaves
        nig = ctx.needs_input_grad
        needs = []
        for (i, j), want in zip(leaves, ctx.jax_leaf_grad):
            flag = nig[i] if i < len(nig) else True
            if isinstance(flag, (list, tuple)):
                flag = flag[j] if j is not None and j < len(flag) else any(flag)
            needs.append(bool(flag) and want)
        result: list[Any] = [None] * len(params)
        args = list(ctx.jax_args)
        for i in ctx.jax_lists:
            args[i] = []
            result[i] = [None] * sum(1 for li, _ in leaves if li == i)
        if not any(needs):
            return tuple(result)
        for (i, j), t in zip(leaves, tensors):
            if j is None:
                args[i] = t
            else:
                args[i].append(t)
        device = tensors[0].device
        cts = [g if g is not None else torch.zeros(s, dtype=d, device=device)
               for g, (s, d) in zip(grads, ctx.jax_outs)]
        got = iter(vjp(*args, cts, needs))
        for (i, j), need in zip(leaves, needs):
            g = next(got) if need else None
            if j is None:
                result[i] = g
            else:
                result[i][j] = g
        return tuple(result)

    return backward


# --- running on CPU tensors ---------------------------------------------------------------


def _host_kernel(op: JaxOp, lowering: Callable):
    """The op on CPU tensors: the same function through JAX on the host CPU."""
    cache: dict = {}

    def kernel(*args, **kwargs):
        key = _key(args, kwargs)
        fn = cache.get(key)
        flat = []

        def strip(v):
            if isinstance(v, torch.Tensor):
                flat.append(torch_to_numpy(v))
                return ("T", len(flat) - 1)
            if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
                return ("L", [strip(x) for x in v])
            return ("V", v)

        spec = [strip(a) for a in args]
        kspec = {k: strip(v) for k, v in kwargs.items()}
        if fn is None:
            def build(vals, s):
                if s[0] == "T":
                    return vals[s[1]]
                if s[0] == "L":
                    return [build(vals, x) for x in s[1]]
                return s[1]

            def program(*vals):
                return lowering(*[build(vals, s) for s in spec], **{k: build(vals, s) for k, s in kspec.items()})

            fn = cache[key] = jax.jit(program)
        host = contextlib.nullcontext() if op.interpret is False else _pallas_interpret(
            True if op.interpret is None else op.interpret)
        with host:
            with jax.default_device(jax.devices("cpu")[0]):
                out = fn(*flat)
        if isinstance(out, (list, tuple)):
            res = [numpy_to_torch(np.asarray(o)) for o in out]
            return res if isinstance(out, list) else tuple(res)
        return numpy_to_torch(np.asarray(out))

    return kernel


# --- registration -------------------------------------------------------------------------

_NOT_JITTABLE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def _probe(op: JaxOp) -> None:
    """Trace fn once on small float32 arrays: a function that cannot be traced at all (it
    converts arrays to numpy, branches on their values, calls torch) fails here, at
    registration. Other errors (these shapes do not suit it) are left to the first call."""
    args = []
    for p in op.sig.params:
        if p.kwarg_only:
            break
        if p.default is not inspect.Parameter.empty:
            break
        if p.type == "Tensor[]":
            args.append([jax.ShapeDtypeStruct((8, 8), jnp.float32)] * 2)
        elif p.tensor:
            args.append(jax.ShapeDtypeStruct((8, 8), jnp.float32))
        else:
            return  # a static without a default: no value to probe with
    try:
        jax.eval_shape(lambda *a: op.call(list(a), {}, lowered=False), *args)
    except _NOT_JITTABLE as err:
        raise TypeError(
            f"torchtpu.jax_op({op.name!r}): {getattr(op.fn, '__name__', op.fn)!r} is not jittable: "
            f"{type(err).__name__}: {str(err).splitlines()[0]}"
        ) from err
    except TypeError as err:
        if "Tracer" in str(err) or "tracer" in str(err):
            raise TypeError(
                f"torchtpu.jax_op({op.name!r}): {getattr(op.fn, '__name__', op.fn)!r} is not jittable "
                f"(it handed a JAX tracer to non-JAX code): {str(err).splitlines()[0]}"
            ) from err
    except Exception:
        pass


def _check_name(name: str) -> tuple[str, str]:
    ns, sep, opname = name.partition("::")
    if not sep:
        raise ValueError(f"torchtpu.jax_op: name {name!r} must be 'namespace::op' (e.g. 'mylib::swiglu')")
    if not ns.isidentifier() or not opname.isidentifier() or ns == "aten":
        raise ValueError(f"torchtpu.jax_op: name {name!r}: namespace and op must be identifiers, not aten")
    for candidate in (opname, opname + "_vjp"):
        try:
            getattr(getattr(torch.ops, ns), candidate)
        except (AttributeError, RuntimeError):
            continue
        raise RuntimeError(f"torchtpu.jax_op: an operator named {ns}::{candidate} is already registered")
    return ns, opname


def register(name: str, fn: Callable, *, num_outputs: int | None = None, interpret=None,
             probe: bool = True):
    if not callable(fn):
        raise TypeError(f"torchtpu.jax_op({name!r}): {fn!r} is not callable")
    if isinstance(fn, torch._ops.OpOverload) or getattr(fn, "__module__", "") in ("torch", "torch.nn.functional"):
        raise TypeError(f"torchtpu.jax_op({name!r}): {fn!r} is a torch function, not a JAX one")
    with _lock:
        ns, opname = _check_name(name)
        sig = _schema.infer(name, fn, num_outputs)
        op = JaxOp(name, fn, sig, interpret)
        if probe:
            _probe(op)
        opdef = torch.library.custom_op(name, mutates_args=(), schema=sig.schema())(
            _host_kernel(op, op.forward_lowering))
        vjp_schema = "(" + ", ".join(
            [f"{p.type} {p.name}" for p in sig.params] + ["Tensor[] cotangents", "bool[] needs"]
        ) + ") -> Tensor[]"
        vjpdef = torch.library.custom_op(name + "_vjp", mutates_args=(), schema=vjp_schema)(
            _host_kernel(op, op.vjp_lowering))
        opdef.register_fake(op.forward_fake)
        vjpdef.register_fake(op.vjp_fake)
        opdef.register_autograd(_backward(op, vjpdef), setup_context=_setup_context(op))
        statics = [p.name for p in sig.params if not p.tensor]
        # entries of the one lowering table: the eager executors, fused regions and compiled
        # graphs serve them like any ATen op
        registry.lower(name, static=statics, variants=False)(op.forward_lowering)
        registry.lower(name + "_vjp", static=statics + ["needs"], variants=False)(op.vjp_lowering)
        op.opdef = opdef
        op.vjpdef = vjpdef
        OPS[name] = op
    opdef.jax_fn = fn
    return opdef
