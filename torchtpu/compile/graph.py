"""An aot_autograd graph of ATen ops, run as one function on JAX values.

Every ATen node is served by the same lowering table as eager execution
(`registry.apply`), so an op behaves identically compiled or not. What the
table does not hold is handled here by kind:

- view ops: their geometry comes from running the op on a contiguous meta
  tensor of the input's shape, then a strided read of the input's values;
  intermediate values are dense, so a view is always a read of a dense array;
- `copy_` onto a graph input: the input's new value (aot_autograd keeps
  input mutations in inference graphs), written back by the caller;
- `_to_copy`, the `empty` family, `sym_size`/`sym_stride` (dynamic shapes
  arrive as concrete Python ints: every shape compiles its own program);
- anything else runs on the CPU through `jax.pure_callback`, counted as a CPU
  fallback, or raises NotImplementedError naming the overload when fallbacks
  are off.
"""
from __future__ import annotations

import contextvars
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.lax.lax import _convert_element_type

from .. import config
from ..metrics import fallback as count_fallback
from ..eager import argcheck, op_args
from ..eager import fallback as eager_fallback
from ..ops import checks as _checks
from ..ops import registry
from ..runtime import geometry, rng
from ..runtime.jaxenv import to_jax_dtype, to_torch_dtype
from . import collectives, control_flow, out_dtype

aten = torch.ops.aten


def overload_name(op: torch._ops.OpOverload) -> str:
    """"add.Tensor" for aten ops (the lowering table's names), "prims::sum" for others."""
    ns, base = op._schema.name.split("::")
    if ns != "aten":
        base = f"{ns}::{base}"
    return base if op._overloadname == "default" else f"{base}.{op._overloadname}"


def _weak(v):
    """A Python number as the weakly typed 0-d value eager lowerings receive."""
    if isinstance(v, bool):
        return jnp.asarray(v)
    dt = np.int64 if isinstance(v, int) else np.complex128 if isinstance(v, complex) else np.float64
    return _convert_element_type(jnp.asarray(v, dt), weak_type=True)


def is_view(op: torch._ops.OpOverload) -> bool:
    rets = op._schema.returns
    if not rets:
        return False
    info = rets[0].alias_info
    return info is not None and not info.is_write


# While a program traces at one signature's sizes: each symbol Dynamo made of a size -> its value
# (Program.__call__ binds them from the inputs)
_SIZES: contextvars.ContextVar = contextvars.ContextVar("torchtpu_graph_sizes", default=None)


def _meta_of(node_or_val):
    """A node's traced value, at this call's sizes where the trace left them symbolic (a graph
    over sizes Dynamo made symbolic jits per size; a symbolic size read as an int would be the
    size it was traced at)."""
    v = node_or_val.meta.get("val") if isinstance(node_or_val, torch.fx.Node) else node_or_val
    sizes = _SIZES.get()
    if sizes and isinstance(v, torch.Tensor) and has_symbols(v):
        try:
            return at_sizes(v, sizes)
        except TypeError:  # a size no input names (data-dependent, unbacked): the traced value
            return v
    return v


def has_symbols(v) -> bool:
    return any(isinstance(n, torch.SymInt) for n in (*v.shape, *v.stride(), v.storage_offset()))


def at_sizes(v, sizes) -> torch.Tensor:
    """A meta tensor laid out as the fake `v`, its symbolic sizes, strides and offset evaluated."""
    def ev(n):
        return int(n.node.expr.subs(sizes)) if isinstance(n, torch.SymInt) else int(n)

    shape, stride, offset = [ev(n) for n in v.shape], [ev(n) for n in v.stride()], ev(v.storage_offset())
    span = offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride) if n > 0)
    return torch.empty(span, dtype=v.dtype, device="meta").as_strided(shape, stride, offset)


def bind_sizes(placeholders, inputs) -> dict:
    """Each size symbol of the graph's inputs -> its value in `inputs`: SymInt inputs, the shapes of
    arrays (inside a program) or tensors, and tensors' strides (a caller's real inputs)."""
    import sympy

    sizes = {}

    def bind(m, k):
        if isinstance(m, torch.SymInt) and isinstance(m.node.expr, sympy.Symbol):
            sizes.setdefault(m.node.expr, int(k))

    for n, x in zip(placeholders, inputs):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(x, int):
            bind(val, x)
        elif isinstance(val, torch.Tensor) and hasattr(x, "shape") and len(x.shape) == val.dim():
            for m, k in zip(val.shape, x.shape):
                bind(m, k)
            if isinstance(x, torch.Tensor):
                for m, k in zip(val.stride(), x.stride()):
                    bind(m, k)
    return sizes


class Program:
    """The graph as a traceable function: (input values, rng data) -> (outputs, {input index: new value})."""

    def __init__(self, gm: torch.fx.GraphModule, host_part: bool = True):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        # traced over sizes Dynamo made symbolic: traced values are read at each call's sizes
        self.symbolic = any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and has_symbols(v))
                            for v in (n.meta.get("val") for n in self.placeholders))
        self.n_random = 0
        self.fallback_ops: list[str] = []
        # the part of the graph that only touches CPU values (an optimizer's step counts and
        # bias corrections) runs on the host before the program, so the program never has to
        # hand values back to the CPU and nothing waits for the device
        # (not in a control-flow body: all of it runs inside the loop or branch)
        self.host = HostPart.of(gm, self.nodes) \
            if host_part and config.read("host_part") else None
        host_nodes = self.host.nodes if self.host is not None else frozenset()
        # graph inputs the program overwrites (aot_autograd's copy_ into a placeholder)
        ph = set(self.placeholders)
        self.mutated_inputs = frozenset(
            self.placeholders.index(n.args[0]) for n in self.nodes
            if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in ph
            and n not in host_nodes
        )
        self.constants = {
            n.target: _constant(getattr(gm, n.target)) for n in self.nodes if n.op == "get_attr"
        }
        # collectives: XLA collectives over the process group's mesh (the caller runs us SPMD)
        self.collectives = collectives.context_of(gm)
        # higher-order ops (cond, while_loop, scan, ...): lax control flow over their subgraphs
        self.hops = {n: control_flow.Node(gm, n, Program) for n in self.nodes
                     if n.op == "call_function" and control_flow.handles(n.target)}
        self.n_random += sum(h.random for h in self.hops.values())
        # what CPU PyTorch would refuse when the graph runs, raised when it runs (as eager does)
        self.refusal = next(filter(None, (_refusal(n) for n in self.nodes)), None)
        for n in self.nodes:
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                if n.target in collectives.LOWERINGS:
                    continue
                low = registry.LOWERINGS.get(overload_name(n.target))
                if low is not None and low.random:
                    self.n_random += 1
                elif low is None and n.target not in SPECIAL and not is_view(n.target):
                    name = overload_name(n.target)
                    if not eager_fallback.enabled():
                        raise NotImplementedError(
                            f"torchtpu compile: no lowering for aten::{name} "
                            f"(CPU fallback is disabled; see torchtpu.set_fallback)"
                        )
                    self.fallback_ops.append(name)

    def __call__(self, inputs, rngdata, host_values=(), key=None):
        """`key`: the random key itself, for a control-flow body (else made from `rngdata`)."""
        env: dict = {}
        index = {n: i for i, n in enumerate(self.placeholders)}
        mutated: dict[int, jax.Array] = {}
        base_key = (key if key is not None else rng.key(*rngdata)) if self.n_random else None
        host = self.host
        if host is not None:
            env.update(zip(host.to_device, host_values))
            skip = host.nodes
        else:
            skip = ()
        token = _SIZES.set(bind_sizes(self.placeholders, inputs) if self.symbolic else None)
        try:
            return self._walk(env, index, inputs, mutated, base_key, skip)
        finally:
            _SIZES.reset(token)

    def _walk(self, env, index, inputs, mutated, base_key, skip):
        n_random = 0
        result = None
        for node in self.nodes:
            if node in skip and node.op != "placeholder":  # a SymInt input feeds both parts
                continue
            if node.op == "placeholder":
                env[node] = inputs[index[node]]
            elif node.op == "call_function":
                args = torch.fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
                target = node.target
                hop = self.hops.get(node)
                if hop is not None:
                    env[node] = hop(args, kwargs, jax.random.fold_in(base_key, n_random) if hop.random else None)
                    n_random += hop.random
                    continue
                if target is out_dtype.OP:
                    env[node] = out_dtype.lower(*args, **kwargs)
                    continue
                if target is _WITH_EFFECTS:
                    # an op with side effects (a LinAlgError check) threaded on a token: the
                    # token passes through, the op runs as a node of its own
                    token, op, *rest = args
                    with _checks.scope(overload_name(op), where=_user_line(node)):
                        outs = self._effect(node, op, rest, kwargs)
                    env[node] = (token, *outs)
                    continue
                if not isinstance(target, torch._ops.OpOverload):
                    # operator.getitem, operator.mul on SymInts, torch.sym_* ...
                    env[node] = target(*args, **kwargs)
                    continue
                if target is aten.copy_.default and node.args[0] in index:
                    new = _copy(node, *args, **kwargs)
                    mutated[index[node.args[0]]] = new
                    env[node] = new
                    continue
                key = None
                low = registry.LOWERINGS.get(overload_name(target))
                if low is not None and low.random:
                    key = jax.random.fold_in(base_key, n_random)
                    n_random += 1
                with _checks.scope(overload_name(target), where=_user_line(node)):
                    env[node] = self._run(node, target, low, args, kwargs, key)
            elif node.op == "output":
                # a host node's output comes from the host part (None here)
                result = torch.fx.node.map_arg(node.args[0], lambda n: env.get(n))
            elif node.op == "get_attr":
                env[node] = self.constants[node.target]
        return result, mutated

    def _effect(self, node, op, args, kwargs) -> tuple:
        """The results of `op` under with_effects, as a tuple (the node's value less its token)."""
        special = EFFECTS.get(op)
        if special is not None:
            out = special(node, *args, **kwargs)
        else:
            low = registry.LOWERINGS.get(overload_name(op))
            if low is not None and not low.random:
                out = registry.apply(low, _scalars_in(low, args), _scalars_in_kw(low, kwargs), None)
            else:
                val = _meta_of(node)
                out = _cpu_callback(node, op, args, kwargs, val=tuple(val[1:]), ordered=True)
        if out is None:
            return ()
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    def _run(self, node, target, low, args, kwargs, key):
        coll = collectives.LOWERINGS.get(target)
        if coll is not None:
            return coll(self.collectives, *args, **kwargs)
        if low is not None and low.mode == "functional":
            return registry.apply(low, _scalars_in(low, args), _scalars_in_kw(low, kwargs), key)
        special = SPECIAL.get(target)
        if special is not None:
            return special(node, *args, **kwargs)
        if is_view(target):
            return _view(node, target, args, kwargs)
        if low is not None:
            # an in-place-only overload (normal_, random_) left in a functional graph: its value
            return registry.apply(low, _scalars_in(low, args), _scalars_in_kw(low, kwargs), key)
        return _cpu_callback(node, target, args, kwargs)


def _refusal(node) -> tuple | None:
    """(exception class, message) for a node eager tpu refuses as CPU PyTorch does: a device
    index this process lacks (a factory on tpu:3 must not quietly make tpu:0), a float8/float4
    call CPU's kernels do not implement. None for every other node."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    name = overload_name(node.target)
    val = node.meta.get("val")
    try:
        for t in torch.utils._pytree.tree_leaves((val, node.kwargs.get("device"))):
            if isinstance(t, torch.Tensor):
                t = t.device
            if isinstance(t, torch.device) and t.type == "tpu":
                op_args.check_device(t, f"aten::{name}")
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        err = argcheck.dtype_refusal(node.target, args, kwargs)
        if err is not None:
            raise err
        low = registry.LOWERINGS.get(name)
        if low is not None and getattr(low.check, "in_graphs", False):  # (ops/scalar_range.py's)
            low.check(*args, **kwargs)
    except Exception as err:  # noqa: BLE001  (its class and message, raised at each call)
        where = _frame(node)
        at = f"\n  (in the compiled graph, from {where})" if where else ""
        return type(err), f"{err}{at}"
    return None


def _frame(node) -> str | None:
    """The last frame of a node's recorded stack trace ('File "x.py", line 12, in f')."""
    trace = node.meta.get("stack_trace") or ""
    frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    return frames[-1] if frames else None


def _user_line(node) -> str | None:
    """The user's line that issued a graph node (its recorded stack trace's last frame)."""
    if _checks.active() is None:
        return None
    frame = _frame(node)
    if frame is None:
        return None
    # 'File "x.py", line 12, in f' -> 'x.py:12 in f'
    parts = frame[5:].split(", ")
    if len(parts) >= 3 and parts[1].startswith("line "):
        return f"{parts[0].strip(chr(34))}:{parts[1][5:]} {parts[2]}"
    return frame


def _constant(value):
    """A tensor captured in the graph (torch.tensor([...]) in user code) as a JAX constant."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from ..runtime import transfer
    from ..runtime.jaxenv import torch_to_numpy

    if not isinstance(value, torch.Tensor):
        return value
    with unset_fake_temporarily():  # the compiler runs under aot_autograd's fake mode
        if value.device.type == "tpu":
            return transfer.value(value)
        return jnp.asarray(torch_to_numpy(value))


def _scalars_in(low, args):
    out = list(args)
    infos = low.args
    for i, v in enumerate(out):
        if i < len(infos):
            out[i] = _scalar_arg(low, infos[i], v)
    return out


def _scalars_in_kw(low, kwargs):
    infos = {a.name: a for a in low.args}
    return {k: _scalar_arg(low, infos[k], v) if k in infos else v for k, v in kwargs.items()}


def _scalar_arg(low, info, v):
    if info.name in low.static:
        return v
    if info.kind in ("scalar", "tensor") and isinstance(v, (bool, int, float, complex)):
        return _weak(v)
    if info.kind == "scalar_list" and isinstance(v, (list, tuple)):
        return [_weak(x) if isinstance(x, (bool, int, float, complex)) else x for x in v]
    return v


# ---- views -----------------------------------------------------------------------------

def _meta_like(x) -> torch.Tensor:
    return torch.empty(tuple(x.shape), dtype=to_torch_dtype(x.dtype), device="meta")


def _wrap(d, n):
    return d + n if d < 0 else d


def _slice(x, dim=0, start=None, end=None, step=1):
    dim = _wrap(dim, x.ndim)
    n = x.shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    end = max(start, end)
    return jax.lax.slice_in_dim(x, start, end, step, axis=dim)


def _select(x, dim, index):
    dim = _wrap(dim, x.ndim)
    return jax.lax.index_in_dim(x, _wrap(index, x.shape[dim]), axis=dim, keepdims=False)


def _split(x, split_size, dim=0):
    dim = _wrap(dim, x.ndim)
    n = x.shape[dim]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if n else [0]
    return _split_sizes(x, sizes, dim)


def _split_sizes(x, split_sizes, dim=0):
    dim = _wrap(dim, x.ndim)
    out, pos = [], 0
    for k in split_sizes:
        out.append(jax.lax.slice_in_dim(x, pos, pos + k, axis=dim))
        pos += k
    return out


def _squeeze(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = tuple(_wrap(d, x.ndim) for d in dims if x.ndim and x.shape[_wrap(d, x.ndim)] == 1)
    return jnp.squeeze(x, dims) if dims else x


def _unsqueeze(x, dim):
    return jnp.expand_dims(x, _wrap(dim, x.ndim + 1))


def _expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


def _unbind(x, dim=0):
    dim = _wrap(dim, x.ndim)
    return [_select(x, dim, i) for i in range(x.shape[dim])]


# The views a model's graph is made of, as plain JAX ops: XLA sees a transpose or a
# reshape, not a strided read, and fuses them away.
_VIEWS = {
    aten.t.default: lambda x: x.T if x.ndim == 2 else x,
    aten.transpose.int: lambda x, dim0, dim1: jnp.swapaxes(x, dim0, dim1) if x.ndim else x,
    aten.permute.default: lambda x, dims: jnp.transpose(x, [_wrap(d, x.ndim) for d in dims]),
    aten.view.default: lambda x, size: x.reshape(size),
    aten._unsafe_view.default: lambda x, size: x.reshape(size),
    aten.reshape.default: lambda x, shape: x.reshape(shape),
    aten.expand.default: _expand,
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.default: _squeeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split_sizes,
    aten.unbind.int: _unbind,
    # Lazy conjugate and negative views: in eager a bit on the tensor that every later kernel
    # honours; in a graph the node's value is what that bit means. A geometry-only read dropped it.
    aten._conj.default: lambda x: jnp.conj(x) if jnp.iscomplexobj(x) else x,
    aten._neg_view.default: lambda x: -x,
}


def _view(node, target, args, kwargs):
    """A view of a dense value: the op's geometry on a contiguous meta tensor, then a read."""
    x = args[0]
    direct = _VIEWS.get(target)
    if direct is not None:
        return direct(*args, **kwargs)
    if target in (aten.as_strided.default,):
        return _as_strided(node, x, *args[1:], **kwargs)
    margs = [_meta_like(a) if hasattr(a, "aval") else a for a in args]  # arrays and tracers
    out = target(*margs, **kwargs)
    flat = jnp.asarray(x).reshape(-1)

    def read(m):
        return geometry.read(flat, tuple(m.shape), m.stride(), m.storage_offset(), to_jax_dtype(m.dtype))

    if isinstance(out, (list, tuple)):
        return [read(m) for m in out]
    return read(out)


def _as_strided(node, x, size, stride, storage_offset=None):
    """as_strided addresses storage, so lay the value out as the traced tensor was laid out."""
    fake = _meta_of(node.args[0])
    base_offset = fake.storage_offset()
    if geometry.is_contiguous(tuple(fake.shape), fake.stride()):
        flat = jnp.asarray(x).reshape(-1)
        span = flat.shape[0]
    else:
        span = max(
            [base_offset + 1]
            + [base_offset + sum((s - 1) * st for s, st in zip(fake.shape, fake.stride())) + 1]
        )
        flat = geometry.write(jnp.zeros((span,), x.dtype), x, tuple(fake.shape), fake.stride(), base_offset)
        base_offset = 0
    off = (storage_offset if storage_offset is not None else fake.storage_offset()) - (
        fake.storage_offset() - base_offset
    )
    return geometry.read(flat, tuple(size), tuple(stride), off, x.dtype)


# ---- ops handled by the compiler itself -----------------------------------------------------

def _to_copy(node, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    x = jnp.asarray(x)
    if dtype is not None:
        from ..ops.casts import cast  # complex -> real, float8 as CPU rounds

        x = cast(x, to_jax_dtype(dtype))
    return x


def _empty(node, *args, **kwargs):
    # Uninitialized memory may hold anything; zeros keep results deterministic.
    val = _meta_of(node)
    return jnp.zeros(tuple(val.shape), to_jax_dtype(val.dtype))


def _full_like(node, x, fill_value, **kwargs):
    val = _meta_of(node)
    from ..ops.casts import full  # the fill value cast as CPU casts it

    return full(val.shape, fill_value, to_jax_dtype(val.dtype))


def _index(node, x, indices):
    """x[indices] with static shapes: a boolean mask's true count comes from the traced shape."""
    from ..ops import indexing

    out = []
    pos = 0
    masks = [a for a in indices if a is not None and a.dtype in (jnp.bool_, jnp.uint8)]
    if masks:
        advanced = [i for i, a in enumerate(indices) if a is not None]
        adjacent = advanced == list(range(advanced[0], advanced[-1] + 1))
        start = advanced[0] if adjacent else 0
        nnz = _meta_of(node).shape[start]
    for a in indices:
        if a is not None and a.dtype in (jnp.bool_, jnp.uint8):
            out.extend(jnp.nonzero(a.astype(jnp.bool_), size=nnz, fill_value=0))
            pos += a.ndim
        else:
            out.append(a)
            pos += 1
    return indexing.INDEX.fn(x, out)


def _index_put(node, x, indices, values, accumulate=False):
    from ..ops import indexing

    return indexing.INDEX_PUT.fn(x, list(indices), jnp.asarray(values), accumulate)


def _sym_size(node, x, dim):
    return x.shape[dim]


def _sym_stride(node, x, dim):
    return geometry.contiguous_strides(x.shape)[dim]


def _sym_numel(node, x):
    return math.prod(x.shape)


def _passthrough(node, x, *args, **kwargs):
    return x


def _copy(node, dst, src, non_blocking=False):
    # copy_'s value is the `copy` lowering's (broadcast, cast, complex -> real)
    return registry.LOWERINGS["copy"].fn(dst, src)


SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.empty.memory_format: _empty,
    aten.empty_strided.default: _empty,
    aten.new_empty.default: _empty,
    aten.new_empty_strided.default: _empty,
    aten.empty_like.default: _empty,
    aten.full_like.default: _full_like,
    torch.ops.prims.convert_element_type.default: lambda node, x, dtype: _to_copy(node, x, dtype=dtype),
    aten.index.Tensor: _index,
    aten.index_put.default: _index_put,
    aten.sym_size.int: _sym_size,
    aten.sym_stride.int: _sym_stride,
    aten.sym_numel.default: _sym_numel,
    aten.sym_storage_offset.default: lambda node, x: 0,
    aten.copy_.default: _copy,
    aten._assert_tensor_metadata.default: lambda node, *a, **k: None,
    aten._assert_scalar.default: lambda node, *a, **k: None,
    aten.detach.default: _passthrough,
    aten.alias.default: _passthrough,
    aten.lift_fresh.default: _passthrough,
    aten.contiguous.default: _passthrough,
    # a collective's value is ready when the program's is
    torch.ops._c10d_functional.wait_tensor.default: _passthrough,
}


def _linalg_check_errors(node, info, api_name, is_matrix):
    """LAPACK's info != 0 raises torch.linalg.LinAlgError on CPU; here a device-side check (as
    CUDA's linalg errors surface at a later synchronization), CPU's own message for the first
    failing batch element."""
    info = jnp.asarray(info)
    if _checks.active() is None:
        return None
    shape = tuple(info.shape)
    flat = info.reshape(-1)
    bad = flat != 0

    def message(v, at):
        host = torch.zeros(shape, dtype=torch.int32)
        host.view(-1)[at] = v
        try:
            torch.ops.aten._linalg_check_errors(host, api_name, is_matrix=is_matrix)
        except Exception as e:  # noqa: BLE001  (CPU's error is the message wanted)
            return str(e)
        return f"{api_name}: info {v}"

    _checks.report(jnp.any(bad), _checks.first(bad, flat), jnp.argmax(bad) if flat.size else 0,
                   exc=torch.linalg.LinAlgError, message=message)
    return None


_WITH_EFFECTS = torch.ops.higher_order.with_effects
# what with_effects may wrap that the compiler serves itself
EFFECTS = {
    aten._linalg_check_errors.default: _linalg_check_errors,
}


# ---- the host part ---------------------------------------------------------------------------

def _on_host(val) -> bool:
    if isinstance(val, torch.Tensor):
        return val.device.type == "cpu"
    if isinstance(val, (list, tuple)):
        return all(_on_host(v) for v in val)
    return isinstance(val, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool))


class HostPart:
    """The nodes of a graph that read only CPU inputs and make only CPU values, as one
    generated Python function run with PyTorch on the CPU before the program.

    Its results that device nodes read become program inputs; its copy_ into CPU inputs
    (step += 1) happen on the host directly, after the program's inputs were taken."""

    def __init__(self, nodes, to_device, outputs, fn, host_only):
        self.nodes = nodes            # host nodes, placeholders included
        self.to_device = to_device    # host nodes device nodes read (program inputs, in order)
        self.outputs = outputs        # host nodes that are graph outputs
        self.fn = fn                  # (*graph inputs) -> (*to_device, *outputs)
        self.host_only = host_only    # indices of graph inputs the program never reads

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, nodes) -> "HostPart | None":
        host: set = set()
        for n in nodes:
            if n.op == "placeholder":
                if _on_host(n.meta.get("val")):
                    host.add(n)
            elif n.op == "call_function":
                ins = n.all_input_nodes
                target = n.target
                if (ins and all(i in host for i in ins) and _on_host(n.meta.get("val"))
                        and not (isinstance(target, torch._ops.OpOverload)
                                 and torch.Tag.nondeterministic_seeded in target.tags)):
                    host.add(n)
        computed = [n for n in nodes if n in host and n.op == "call_function"]
        if not computed:
            return None
        out_node = next(n for n in reversed(nodes) if n.op == "output")
        graph_outs = set(out_node.all_input_nodes)
        to_device = [n for n in computed
                     if any(u not in host and u.op != "output" for u in n.users)]
        outputs = [n for n in computed if n in graph_outs]
        g = torch.fx.Graph()
        env: dict = {}
        for n in nodes:
            if n.op == "placeholder":
                # every graph input, so the function takes the call's arguments as they are
                env[n] = g.placeholder(n.name)
            elif n in host:
                env[n] = g.node_copy(n, lambda a: env[a])
        g.output(tuple(env[n] for n in to_device + outputs))
        fn = torch.fx.GraphModule(gm, g)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        host_only = frozenset(i for i, n in enumerate(placeholders)
                              if n in host and all(u in host for u in n.users))
        return cls(frozenset(host), to_device, outputs, fn, host_only)


# ---- CPU fallback inside a compiled program ------------------------------------------------

def _cpu_callback(node, target, args, kwargs, val=None, ordered=False):
    """Run the op on the CPU from inside the program (jax.pure_callback), counted. `val`: its
    traced value when not the node's; `ordered`: an op run for its side effects (under
    with_effects), kept in program order even with no outputs (jax.experimental.io_callback)."""
    name = overload_name(target)
    val = _meta_of(node) if val is None else val
    flat_out, out_tree = torch.utils._pytree.tree_flatten(val)
    shapes = [
        jax.ShapeDtypeStruct(tuple(v.shape), to_jax_dtype(v.dtype)) for v in flat_out
        if isinstance(v, torch.Tensor)
    ]
    leaves, in_tree = torch.utils._pytree.tree_flatten((args, kwargs))
    arr_pos = [i for i, v in enumerate(leaves) if isinstance(v, jax.Array) or isinstance(v, jax.core.Tracer)]

    def host(*arrays):
        from ..runtime.jaxenv import numpy_to_torch, torch_to_numpy

        count_fallback(name)
        vals = list(leaves)
        for p, a in zip(arr_pos, arrays):
            vals[p] = numpy_to_torch(np.asarray(a))
        a2, k2 = torch.utils._pytree.tree_unflatten(vals, in_tree)
        a2 = torch.utils._pytree.tree_map(
            lambda v: v.to("cpu") if isinstance(v, torch.device) else v, a2)
        k2 = {k: (torch.device("cpu") if isinstance(v, torch.device) else v) for k, v in k2.items()}
        out = target(*a2, **k2)
        outs = [o for o in torch.utils._pytree.tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        return tuple(torch_to_numpy(o.detach()).reshape(s.shape) for o, s in zip(outs, shapes))

    if ordered:
        from jax.experimental import io_callback

        res = io_callback(host, tuple(shapes), *[leaves[p] for p in arr_pos], ordered=True)
    else:
        res = jax.pure_callback(host, tuple(shapes), *[leaves[p] for p in arr_pos])
    it = iter(res)
    rebuilt = [next(it) if isinstance(v, torch.Tensor) else v for v in flat_out]
    return torch.utils._pytree.tree_unflatten(rebuilt, out_tree)

