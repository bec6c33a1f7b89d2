"""Dimensions of varying size: `torchtpu.mark_dynamic(t, dim, lower, upper)`.

Every size a dimension passes through is a new shape, and a new shape is a new XLA
program. A marked dimension instead lives in a buffer padded to a bucket (powers of two
from MIN_BUCKET, capped at `upper`) with its true size a runtime value, so an op over it
compiles once per bucket, not once per size. PyTorch sees the true sizes: the tensor is a
view of its first n positions (its strides are the bucket's, as a slice's would be).

The op's rule (ops/dynamism.py) says which dims of its results stay dynamic, and masks
what the padding would change (reductions, softmax, attention keys, matmul contraction,
cat along the dim); results equal the unpadded computation. A result whose dim is dynamic
is itself marked, so whole chains of ops stay in their bucket. An op with no rule for the
dims it meets raises an error naming the op and the dim: silently compiling per size is
exactly what marking the dim asked not to do. A contiguous copy (`.contiguous()`,
`.reshape` merging the dim) and a copy into a static tensor run on the true sizes.

Which tensor is dynamic is known per storage (a weak map of storage entries), and a view
of it is dynamic in the dim with the marked stride and the true size.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import threading
import weakref

import jax
import numpy as np
import torch

from ..metrics import bump
from ..ops import dynamism as rules
from ..ops.registry import ArgInfo, Lowering
from ..runtime import cache as _caches
from ..runtime import leaf as _leaf
from ..runtime import geometry, placement, storage, tensors
from ..runtime.jaxenv import to_jax_dtype
from ..runtime.storage import table
from . import executor, extents, growth, modes

MIN_BUCKET = 16


class Dyn:
    """A storage padded along one dim: that dim's stride, true size, bucket and bounds. A
    packed one (ops/dynamism.py) holds a contiguous tensor of the true sizes at its start,
    with room for the bucket: `outer` and `inner` are the numbers of elements before and
    after the dim (stride None)."""

    __slots__ = ("stride", "n", "bucket", "lower", "upper", "strict", "outer", "inner", "window")

    def __init__(self, stride, n, bucket, lower, upper, strict=True, outer=None, inner=None, window=False):
        self.stride, self.n, self.bucket = stride, n, bucket
        self.lower, self.upper, self.strict = lower, upper, strict
        self.outer, self.inner = outer, inner
        # a window of a storage others own (_window): read in buckets, never written past n
        self.window = window


_marked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # storage entry -> Dyn
# (lowering name, mode, Ctx) -> the lowering over padded inputs; bounded as one op's executables.
# Names take a serial number, not the cache's size, so a lowering made after an eviction is
# never named like a live one (executables are cached by lowering name).
_lowerings = _caches.register("dynamic lowerings", _caches.LRU(_caches.limit("per_op")))
_serial = itertools.count()


def bucket(n: int, lower: int = 0, upper: int | None = None) -> int:
    """The padded size serving true size n."""
    b = max(MIN_BUCKET, 1 << max(n - 1, 0).bit_length())
    return b if upper is None else max(n, min(b, upper))


def _find(t: torch.Tensor):
    """(dim, Dyn) when `t` is a dynamic tensor (or a view keeping the dynamic dim whole)."""
    if t.device.type != "tpu":
        return None
    entry = table.get(t.untyped_storage()._cdata)
    info = _marked.get(entry) if entry is not None else None
    if info is None:
        return None
    shape, stride = t.shape, t.stride()
    if info.inner is not None:  # packed: a contiguous view of the whole true tensor
        if t.storage_offset() != 0 or t.numel() != info.outer * info.n * info.inner or not t.is_contiguous():
            return None
        for j in range(len(shape) - 1, -1, -1):
            if shape[j] == info.n and math.prod(shape[j + 1:]) == info.inner:
                return j, info
        return None
    for j in range(len(shape) - 1, -1, -1):
        if shape[j] == info.n and stride[j] == info.stride:
            last = t.storage_offset() + (info.bucket - 1) * stride[j] + sum(
                (s - 1) * st for i, (s, st) in enumerate(zip(shape, stride)) if i != j)
            if last < entry.numel:
                return j, info
    return None


def mark_dynamic(t: torch.Tensor, dim: int, lower: int = 0, upper: int | None = None) -> torch.Tensor:
    """Declare that dim `dim` of tpu tensor `t` varies in size within [lower, upper].

    `t` moves (in place: same tensor, same sizes) into a buffer padded along `dim` to its
    bucket; views taken of it before no longer alias it. Ops over it and over the results
    that inherit the dim compile once per bucket. Returns `t`."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        raise ValueError("torchtpu.mark_dynamic: expected a tpu tensor")
    if t.dim() == 0:
        raise ValueError("torchtpu.mark_dynamic: a 0-dim tensor has no dim to mark")
    d = dim % t.dim() if -t.dim() <= dim < t.dim() else None
    if d is None:
        raise IndexError(f"torchtpu.mark_dynamic: dim {dim} out of range for a {t.dim()}-D tensor")
    n = t.shape[d]
    if lower < 0 or (upper is not None and (upper < lower or not lower <= n <= upper)) or n < lower:
        raise ValueError(f"torchtpu.mark_dynamic: size {n} of dim {d} is not within the bounds "
                         f"[{lower}, {upper}]")
    found = _find(t)
    if found is not None and found[0] == d and (upper is None or found[1].bucket <= upper):
        found[1].lower, found[1].upper, found[1].strict = lower, upper, True
        return t
    b = bucket(n, lower, upper)
    shape = list(t.shape)
    shape[d] = b
    host = t.detach().cpu()  # padded on the host: a program per true size is what marking avoids
    padded = torch.zeros(shape, dtype=t.dtype)
    padded.narrow(d, 0, n).copy_(host)
    dev = padded.to("tpu")
    tensors.set_geometry(t, dev.untyped_storage(), tuple(t.shape), _seen_strides(t.shape, dev.stride()), 0)
    _marked[storage.lookup(dev)] = Dyn(dev.stride(d), n, b, lower, upper)
    executor.intercept("dynamic", execute)  # every op call is looked at while dynamic tensors exist
    return t


def _seen_strides(shape, stride) -> tuple:
    """A bucket's strides as PyTorch shows them: a size-1 dim's stride is any, so it gets the
    one CPU's contiguous tensor of the true sizes has (a (1, n, d) result shows (n*d, d, 1),
    not (bucket*d, d, 1)). Not in 4-d and 5-d tensors, where a size-1 dim's stride tells
    channels_last from contiguous and is part of a program's key (runtime/leaf.py): there
    it would make every true size a program of its own."""
    if len(shape) in _leaf.STRIDES_KEYED_RANKS:
        return tuple(stride)
    out = list(stride)
    acc = 1
    for j in range(len(shape) - 1, -1, -1):
        if shape[j] == 1:
            out[j] = acc
        acc *= max(shape[j], 1)
    return tuple(out)


def _padded_strides(t: torch.Tensor, shape) -> tuple:
    """`t`'s strides over its padded `shape`. In 4-d and 5-d tensors a size-1 dim's stride is
    part of a program's key (runtime/leaf.py), and one that steps over a dim of the true size
    (a view `(1, n, h, d).transpose(1, 2)` has (n*h*d, d, h*d, 1)) would key every n apart:
    it steps over the padded dim instead, as in a tensor of the bucket's size. Its value is
    never read (index 0), only compared for the memory format, where the two agree."""
    st = list(t.stride())
    if len(st) not in _leaf.STRIDES_KEYED_RANKS:
        return tuple(st)
    for i, m in enumerate(t.shape):
        if m == 1:
            for j, k in enumerate(t.shape):
                if k > 1 and k != shape[j] and st[i] == st[j] * k:
                    st[i] = st[j] * shape[j]
                    break
    return tuple(st)


def _host_padded(t: torch.Tensor, entry, d: int, b: int) -> torch.Tensor:
    """A new contiguous tensor of `t`'s values padded with zeros along `d` to `b` positions,
    made from its storage's computed buffer through the host: no program, and no flush of a
    deferred region (a host read through torch would end one, at a point that may differ
    between ranks whose regions hold collectives)."""
    shape = list(t.shape)
    shape[d] = b
    return _host_room(t, entry, shape)


def _host_room(t: torch.Tensor, entry, shape) -> torch.Tensor:
    """A new contiguous tensor of sizes `shape` (each at least `t`'s) holding `t`'s values in
    its first positions and zeros after them, made through the host (see _host_padded)."""
    flat = np.asarray(entry.buf).reshape(-1)
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat[t.storage_offset():], shape=tuple(t.shape),
                                           strides=tuple(s * item for s in t.stride()), writeable=False)
    padded = np.zeros(shape, flat.dtype)
    padded[tuple(slice(0, s) for s in t.shape)] = view
    bump("transfers_to_host")
    bump("bytes_to_host", view.nbytes)
    bump("transfers_to_device")
    bump("bytes_to_device", padded.nbytes)
    buf = jax.device_put(padded.reshape(-1), placement.jax_device(entry.index))
    with placement.at(entry.index):  # on the tensor's own device, whichever op runs now
        return tensors.empty(shape, t.dtype, buf=buf)


def _padded_copy(t: torch.Tensor, entry, d: int, b: int, upper: int | None = None) -> torch.Tensor:
    """A dynamic (not strict) copy of `t`, padded along `d` to `b` positions (_host_padded),
    within `upper` if given."""
    new = _host_padded(t, entry, d, b)
    _marked[storage.lookup(new)] = Dyn(new.stride(d), t.shape[d], b, 0, upper, False)
    executor.intercept("dynamic", execute)  # every op call is looked at while dynamic tensors exist
    return tensors.alias(new, tuple(t.shape), _seen_strides(t.shape, new.stride()), 0)


class _State(threading.local):
    graph_views = False  # running a compiled graph's ATen ops eagerly (view_kernels.view)


state = _State()


@contextlib.contextmanager
def graph_views():
    """While a compiled graph's ATen ops run eagerly over dynamic tensors: a view its trace
    took of a tensor CPU lays out contiguously may meet a bucket's strides here, and gets a
    contiguous copy (the graph is functional: no write reaches an intermediate)."""
    before = state.graph_views
    state.graph_views = True
    try:
        yield
    finally:
        state.graph_views = before


# A compiled graph's inputs pad to at least this many positions: a graph costs far more to
# compile than one op, so its buckets start coarser (a prompt of 17 tokens and one of 60
# share a program; the short one computes over 64 positions, at most 4x its own).
GRAPH_MIN_BUCKET = 64


def graph_bucket(n: int) -> int:
    """The bucket of size n for a compiled graph's varying inputs and the ranges inside it."""
    return max(GRAPH_MIN_BUCKET, bucket(n))


def vary_inputs(args: list, dims) -> bool:
    """Replace, in `args`, each tpu tensor at (position, dim) of `dims` by a dynamic (not
    strict) copy padded along dim to its bucket (a compiled graph's inputs whose size Dynamo
    made symbolic: the graph then runs per bucket); whether they were. All or none: a graph
    with one input left at its true size would still be a program per size. Off with the
    varying-size policy (extents.AFTER 0)."""
    if not extents.AFTER:
        return False
    todo = []
    for i, d in dims:
        t = args[i]
        if not isinstance(t, torch.Tensor):
            continue
        entry = _computed_entry(t) if t.device.type == "tpu" and d < t.dim() else None
        if entry is None or t.shape[d] < 2 or not _paddable(t, d):
            return False
        todo.append((i, d, t, entry))
    for i, d, t, entry in todo:
        n = t.shape[d]
        # under growth_bound a size within it pads to the bound, as a tensor starting to grow
        # there does: a generate's prefill and its decode steps share that one bucket
        upper = growth.bound if growth.bound is not None and n <= growth.bound else None
        args[i] = _padded_copy(t, entry, d, growth.bucket_of(n) if upper else graph_bucket(n), upper)
        bump("dynamic_graph_inputs")
    return bool(todo)


def get_dynamism(t: torch.Tensor) -> dict:
    """{dim: (lower, upper)} of `t`'s dynamic dims ({} for a static tensor)."""
    found = _find(t) if isinstance(t, torch.Tensor) else None
    if found is None:
        return {}
    return {found[0]: (found[1].lower, found[1].upper)}


def any_dynamic(values) -> bool:
    """Whether one of `values` is a tensor with a dynamic dim (cheap while none exists)."""
    return bool(_marked) and any(isinstance(v, torch.Tensor) and _find(v) is not None for v in values)


def _scan(args, kwargs):
    found = {}
    for p in rules.tensor_paths(args, kwargs):
        f = _find(rules.get(args, kwargs, p))
        if f is not None:
            found[p] = f
    return found


def _arg_name(low: Lowering, path) -> str:
    if isinstance(path[0], str):
        return path[0]
    name = low.args[path[0]].name if path[0] < len(low.args) else str(path[0])
    return name + (f"[{path[1]}]" if len(path) > 1 else "")


def _refuse(low: Lowering, path, d, info, why: str):
    return rules.CannotHonour(
        f"torchtpu: aten.{low.name} cannot keep dim {d} of its argument '{_arg_name(low, path)}' "
        f"dynamic (size {info.n}, marked with torchtpu.mark_dynamic within [{info.lower}, "
        f"{info.upper}]): {why}")


def execute(low: Lowering, args, kwargs, serve, run):
    """Serve one op call: over padded buffers when an argument is dynamic (`run` executes
    a lowering), else as usual (`serve`)."""
    if not _marked:  # the last dynamic tensor is gone: calls go straight to the executor again
        executor.intercept("dynamic", None)
        return serve(low, args, kwargs)
    if _members and low.name == "cat" and modes.get() != "defer_and_fuse":
        cross_edges()  # before the cat reads its inputs (defer_and_fuse: after each flush)
    found = _scan(args, kwargs)
    if not found:
        return serve(low, args, kwargs)
    (p0, (d0, info)), = list(found.items())[:1]
    strict = any(i.strict for _, i in found.values())
    functional = low.functional or low
    rule = rules.rule_for(functional.name, low.fn) if low.mode != "out" else None
    rows = None  # (_second_rows) results following a second size's rows
    if any((i.n, i.bucket) != (info.n, info.bucket) for _, i in found.values()):
        every = found
        found = _one_size(rule, args, kwargs, found)
        second = None if found is None else _second_rows(
            rule, args, kwargs, {p: v for p, v in every.items() if p not in found})
        if strict and second is None:
            raise _refuse(low, p0, d0, info, "its other dynamic arguments have other sizes or buckets")
        if found is None:
            bump("dynamic_exact")
            return serve(low, args, kwargs)
        (p0, (d0, info)), = list(found.items())[:1]
        if second is not None:
            args, kwargs, rows = second
    dims = {p: d for p, (d, _) in found.items()}
    plan = None if rule is None else rule.plan(args, kwargs, dims, info.n)
    if low.mode != "functional" and any(i.inner is not None or i.window for p, (_, i) in found.items()
                                        if p == _target(low, args, kwargs)):
        # a write into (or out= over) a packed tensor or a window: on the true sizes (a packed
        # tensor holds them as is; past a window's true extent lies data that is not its own)
        bump("dynamic_exact")
        return serve(low, args, kwargs)
    if low.mode == "inplace" and plan not in (None, rules.EXACT) and plan.outs[0] is not None:
        target = _target(low, args, kwargs)
        if target not in dims and _adopt(rules.get(args, kwargs, target), plan.outs[0][0], info):
            found[target] = (plan.outs[0][0], info)
            dims[target] = plan.outs[0][0]
            plan = rule.plan(args, kwargs, dims, info.n)
    if plan not in (None, rules.EXACT) and plan.pads:
        moved = _pad_small(low, args, kwargs, plan.pads, info, found)
        if moved is not None:
            args, kwargs = moved
            dims = {p: d for p, (d, _) in found.items()}
            plan = rule.plan(args, kwargs, dims, info.n)
    if plan is rules.EXACT or (low.mode == "inplace" and plan is not None and not plan.into_static
                               and _target(low, args, kwargs) not in dims):
        bump("dynamic_exact")  # a contiguous copy, a write into a static tensor
        return serve(low, args, kwargs)
    if plan is None:
        if strict:
            raise _refuse(low, p0, d0, info, "no rule computes it over a padded bucket "
                                             "(it would compile one program per size)")
        bump("dynamic_exact")
        return serve(low, args, kwargs)
    bouts = []
    for spec in plan.outs:
        if spec is None:
            bouts.append(None)
        elif spec[1] == info.n:
            bouts.append(info.bucket)
        else:
            if spec[1] < info.lower or (info.upper is not None and spec[1] > info.upper):
                if not strict and low.name != "cat":  # (a growth past its bound breaks a promise)
                    bump("dynamic_exact")
                    return serve(low, args, kwargs)
                raise _refuse(low, p0, d0, info, f"its result has size {spec[1]} there, outside the bounds")
            b = bucket(spec[1], info.lower, info.upper)
            if spec[1] > info.n and low.name == "cat" and info.upper is not None:
                b = info.upper  # a tensor growing within a bound pads to it: one program for all sizes
            # a grown result never shrinks below its input's bucket (one moved ahead of its
            # edge by cross_edges stays there)
            bouts.append(max(b, info.bucket) if spec[1] > info.n else b)
    pargs, pkwargs = list(args), dict(kwargs)
    packed = []
    for p, (d, i) in found.items():
        t = rules.get(args, kwargs, p)
        shape = list(t.shape)
        shape[d] = info.bucket
        if i.inner is None:
            rules.put_arg(pargs, pkwargs, p, _padded_alias(t, d, info.bucket))
        else:  # the packed storage's first positions; the program unpacks the bucket
            rules.put_arg(pargs, pkwargs, p, tensors.alias(t, (i.outer * i.bucket * i.inner,), (1,), 0))
            packed.append((p, tuple(shape), d))
    for path, i in plan.sizes:  # a size list's entry of the true size: the bucket's
        sizes = list(rules.get(pargs, pkwargs, path))
        sizes[i] = info.bucket
        rules.put_arg(pargs, pkwargs, path, sizes)
    pack = _packing(low, rule, plan, args, kwargs, found)
    ctx = rules.Ctx(tuple(sorted(dims.items(), key=repr)), plan.pads, info.bucket, tuple(bouts), plan.extra,
                    tuple(sorted(packed, key=repr)), pack)
    syn = _padded_lowering(low, rule, ctx)
    pkwargs["dyn_n"] = info.n
    bump("dynamic_ops")
    res = run(syn, pargs, pkwargs)
    if low.mode == "inplace":
        return None if res is None else rules.get(args, kwargs, _target(low, args, kwargs))
    out = _results(res, plan, bouts, info, _broadcast_shape(args, kwargs) if pack else None)
    if rows is not None:
        out = _row_results(out, *rows)
    if low.name == "cat" and not info.strict and plan.extra and plan.extra[0]:
        _grew(out, plan.outs[0][0], plan.outs[0][1] - info.n)
    return out


def _one_size(rule, args, kwargs, found):
    """Of dynamic arguments of several sizes (none marked by the user: attention's few query
    rows beside its many keys), those of one size the rule serves with the others read as
    they are, the biggest size first; None when no size is served."""
    groups: dict = {}
    for p, (d, i) in found.items():
        groups.setdefault((i.n, i.bucket), {})[p] = (d, i)
    for (n, _), group in sorted(groups.items(), key=lambda kv: kv[0], reverse=True):
        plan = None if rule is None else rule.plan(args, kwargs, {p: d for p, (d, _) in group.items()}, n)
        if plan not in (None, rules.EXACT):
            return group
    return None


def _bucket_view(t: torch.Tensor, sizes: dict):
    """`t` with the dims of `sizes` ({dim: bucket}) grown to their buckets, as a static tensor:
    a window of its own storage where it fits there, else a padded copy through the host
    (small, computed buffers only); None when neither. What lies past the true extents is
    the storage's, never reaching a true result (the rules mask keys and cut rows)."""
    shape = list(t.shape)
    for d, b in sizes.items():
        shape[d] = b
    if all(s > 0 for s in t.stride()) and _room(t, shape) is not None:
        bump("dynamic_windows")
        return tensors.alias(t, shape, t.stride(), t.storage_offset())
    entry = _computed_entry(t) if t.device.type == "tpu" and t.numel() <= _MAX_MOVED else None
    if entry is not None:
        bump("dynamic_padded_args")
        return _host_room(t, entry, shape)
    return None


def _second_rows(rule, args, kwargs, rest: dict):
    """(args, kwargs, rows) with the arguments dynamic at a second size (beside the size the
    rule serves) passed as static tensors of their bucket, where the rule keeps their rows
    independent (`rows`: attention's queries beside its keys), with the static arguments of
    that size padded alike; the results along those rows are made dynamic after the call
    (_row_results). None where the rule has no such rows: they run at their true size."""
    at = getattr(rule, "rows", None)
    if at is None or len(rest) != 1:
        return None
    ((p, (d, i)),) = rest.items()
    if i.inner is not None:
        return None  # packed: its storage is no padded layout
    spec = at(args, kwargs, {p: d})
    if spec is None:
        return None
    outs, extra = spec
    pargs, pkwargs = list(args), dict(kwargs)
    rules.put_arg(pargs, pkwargs, p, _padded_alias(rules.get(args, kwargs, p), d, i.bucket))
    for q, e in extra:
        new = _bucket_view(rules.get(args, kwargs, q), {e: i.bucket})
        if new is None:
            return None
        rules.put_arg(pargs, pkwargs, q, new)
    bump("dynamic_second_rows")
    return tuple(pargs), pkwargs, (outs, i)


def _row_results(out, outs: dict, info: Dyn):
    """The results along the second size's rows (_second_rows) cut to its true size, dynamic."""
    many = isinstance(out, (tuple, list))
    items = list(out) if many else [out]
    for k, d in outs.items():
        r = items[k] if k < len(items) else None
        if r is not None and r.dim() > d and r.shape[d] == info.bucket:
            items[k] = _dynamic_result(r, d, info.n, info.bucket, info)
    if not many:
        return items[0]
    return tuple(items) if isinstance(out, tuple) else items


def _pad_small(low: Lowering, args, kwargs, pads, info: Dyn, found: dict):
    """(args, kwargs) with the static arguments the plan would pad inside the program (a
    loss's targets beside dynamic scores, a mask beside dynamic keys) replaced, for this
    call, by dynamic padded copies made through the host, as vary_index does an index: their
    true size in the program's signature would make every size a program again. Only small
    ones whose buffer is computed (a deferred region's value would end the region) and
    never the tensor an in-place op writes. None when none moved; `found` gets the moved."""
    target = _target(low, args, kwargs) if low.mode == "inplace" else None
    pargs, pkwargs, moved = list(args), dict(kwargs), False
    wide: dict = {}
    for p, d in pads:
        wide.setdefault(p, []).append(d)
    for p, ds in wide.items():
        t = rules.get(args, kwargs, p)
        if len(ds) == 1 or p == target or not isinstance(t, torch.Tensor) or any(t.shape[d] != info.n for d in ds):
            continue
        # padded along two dims (attention's mask over n queries and n keys): not a dynamic
        # tensor (one dim each), a static one of the bucket's sizes
        new = _bucket_view(t, {d: info.bucket for d in ds})
        if new is None:
            continue
        rules.put_arg(pargs, pkwargs, p, new)
        moved = True
    for p, d in pads:
        t = rules.get(args, kwargs, p)
        if len(wide[p]) > 1 or p == target or not isinstance(t, torch.Tensor) or t.shape[d] != info.n:
            continue
        w = _window(t, d, info.bucket)
        if w is not None:  # read in place: the bucket is a window of its own storage
            found[p] = (d, w)
            moved = True
            bump("dynamic_windows")
            continue
        if t.numel() > _MAX_MOVED:
            continue
        entry = table.get(t.untyped_storage()._cdata)
        if entry is None or not isinstance(entry.buf, jax.Array) or entry.dtype != to_jax_dtype(t.dtype):
            continue
        new = _padded_copy(t, entry, d, info.bucket)
        rules.put_arg(pargs, pkwargs, p, new)
        found[p] = (d, _marked[storage.lookup(new)])
        moved = True
        bump("dynamic_padded_args")
    return (tuple(pargs), pkwargs) if moved else None


def _window(t: torch.Tensor, d: int, b: int) -> Dyn | None:
    """`t`, a view of a bigger storage (a mask sliced to this step's keys, a row prefix of an
    index buffer), as a dynamic tensor padded to `b` along `d` in place: the bucket's window
    of its own storage, when that lies inside the storage. What the window holds past the
    true extent is whatever the storage holds there; the rules never let it reach a true
    position (and indices are pointed at row 0). None when it does not fit."""
    shape = list(t.shape)
    shape[d] = b
    if t.numel() == 0 or t.stride(d) <= 0 or _room(t, shape) is None:
        return None
    return Dyn(t.stride(d), t.shape[d], b, 0, None, False, window=True)


def _room(t: torch.Tensor, shape):
    """`t`'s storage entry when a view of `shape` with t's strides and offset lies inside its
    computed (or pending) buffer of t's dtype, else None."""
    entry = table.get(t.untyped_storage()._cdata) if t.device.type == "tpu" else None
    if (entry is None or entry.buf is None or entry.dtype != to_jax_dtype(t.dtype) or any(s < 0 for s in t.stride())
            or t.storage_offset() + geometry.extent_of(shape, t.stride()) > entry.numel):
        return None
    return entry


def _adopt(t: torch.Tensor, d: int, info: Dyn) -> bool:
    """Make a fresh tensor (never written, the whole of its storage: `.to(dtype)`'s empty
    result that copy_ fills) dynamic along `d` before an op writes it, so what is copied
    into it stays in its bucket."""
    entry = table.get(t.untyped_storage()._cdata)
    if (entry is None or entry.buf is not None or t.storage_offset() != 0 or t.numel() != entry.numel
            or d >= t.dim() or t.shape[d] != info.n or not t.is_contiguous()):
        return False
    shape = list(t.shape)
    shape[d] = info.bucket
    new = tensors.empty(shape, t.dtype)
    tensors.set_geometry(t, new.untyped_storage(), tuple(t.shape), new.stride(), 0)
    _marked[storage.lookup(new)] = Dyn(new.stride(d), info.n, info.bucket, info.lower, info.upper, info.strict)
    return True


def _target(low: Lowering, args, kwargs):
    names = [a.name for a in low.args]
    i = names.index(low.mutated[0])
    return (low.mutated[0],) if low.mutated[0] in kwargs or i >= len(args) else (i,)


def _packing(low: Lowering, rule, plan, args, kwargs, found) -> tuple:
    """((result index, dim), ...) of the results to return packed: a contiguous copy's
    (plan.contiguous), and an elementwise op's over packed inputs only, whose result CPU
    lays out contiguously as they are. Both have one result, of their inputs' broadcast
    shape."""
    if low.mode != "functional" or len(plan.outs) != 1 or plan.outs[0] is None:
        return ()
    if not plan.contiguous and not (isinstance(rule, rules.Pointwise)
                                    and all(i.inner is not None for _, i in found.values())):
        return ()
    return ((0, plan.outs[0][0]),)


def _broadcast_shape(args, kwargs) -> list:
    return list(torch.broadcast_shapes(*[tuple(rules.get(args, kwargs, p).shape)
                                         for p in rules.tensor_paths(args, kwargs)]))


def _results(res, plan, bouts, info, packed_shape=None):
    many = isinstance(res, (tuple, list))
    outs = list(res) if many else [res]
    done = []
    for i, r in enumerate(outs):
        spec = plan.outs[min(i, len(plan.outs) - 1)]
        if r is None or spec is None:
            done.append(r)
            continue
        od, n = spec
        if packed_shape is not None:  # r: the packed storage; the result its contiguous true tensor
            shape = packed_shape
            out = tensors.alias(r, shape, geometry.contiguous_strides(shape), 0)
            _marked[storage.lookup(r)] = Dyn(None, n, bouts[min(i, len(bouts) - 1)], info.lower, info.upper,
                                             info.strict, math.prod(shape[:od]), math.prod(shape[od + 1:]))
            done.append(out)
            continue
        done.append(_dynamic_result(r, od, n, bouts[min(i, len(bouts) - 1)], info))
    if not many:
        return done[0]
    return tuple(done) if isinstance(res, tuple) else done


def _dynamic_result(r: torch.Tensor, d: int, n: int, b: int, info: Dyn) -> torch.Tensor:
    """`r`, a program's result padded to `b` along d, as the tensor PyTorch sees (its first n
    positions there), dynamic with `info`'s bounds."""
    shape = list(r.shape)
    shape[d] = n
    _marked[storage.lookup(r)] = Dyn(r.stride(d), n, b, info.lower, info.upper, info.strict)
    return tensors.alias(r, shape, _seen_strides(shape, r.stride()), 0)


def _padded_alias(t: torch.Tensor, d: int, b: int) -> torch.Tensor:
    """A view of dynamic `t`'s storage over its whole bucket `b` along d (what a program reads)."""
    shape = list(t.shape)
    shape[d] = b
    return tensors.alias(t, shape, _padded_strides(t, shape), t.storage_offset())


def _padded_lowering(low: Lowering, rule, ctx) -> Lowering:
    key = (low.name, low.mode, ctx)
    syn = _lowerings.get(key)
    if syn is None:
        def fn(*args, **kwargs):
            return rules.apply(rule, low.fn, ctx, *args, **kwargs)

        syn = _lowerings[key] = Lowering(
            f"{low.name}[dynamic {next(_serial)}]", fn, low.overload,
            low.args + [ArgInfo("dyn_n", "scalar", True, False)], low.promote, low.promote_args,
            low.static, low.random, low.mode, low.mutated, functional=low.functional)
    return syn


# --- tensors growing by torch.cat (eager/growth.py recognises them): dynamic, unbounded ---

def _auto(t: torch.Tensor, d: int, n: int, b: int, step: int = 0) -> None:
    """Mark `t` (a view of the first n of b positions along d of its storage, grown by
    `step`) dynamic. Not strict: an op with no rule runs on the true sizes, as it would
    unmarked."""
    upper = b if growth.bound is not None and b == growth.bound else None  # (under growth_bound)
    _marked[storage.lookup(t)] = Dyn(t.stride(d), n, b, 0, upper, strict=False)
    executor.intercept("dynamic", execute)
    _grew(t, d, step)


def _grow(low: Lowering, a: torch.Tensor, b: torch.Tensor, d: int, run):
    """cat([a, b], d) of a tensor that grows along d behind dims of size > 1: `a` is padded
    into a bucket once (one program for its size), then the cat rule appends in buckets."""
    n = a.shape[d]
    room = growth.bucket_of(n)
    pad = [0, 0] * (a.dim() - d - 1) + [0, room - n]
    p = torch.constant_pad_nd(a, pad)
    pa = tensors.alias(p, tuple(a.shape), p.stride(), 0)
    _auto(pa, d, n, room)
    return execute(low, ([pa, b], d), {}, run, run)


executor.intercept("grow_dynamic", _grow)
executor.intercept("on_grown", _auto)


# --- index tensors whose length varies from call to call, with no annotation ---------------
#
# A serving loop gathers a different number of rows each step (index_select over the slots
# of this step's requests, embedding of this step's tokens): each length compiled its own
# program. Once one op signature has seen more than extents.AFTER index shapes, the call
# gets, for an index varying in one dim, a copy padded into a bucket along it (through the
# host, as mark_dynamic pads) and dynamic, not strict: the gather runs once per bucket
# (padding indexes row 0; the result keeps its true size), as do the ops after it that have
# a rule; an op with none runs on the true sizes, as before.

_INDEX_ARG = {"index_select": 2, "embedding": 1}  # op -> position of its index tensor
_index_shapes = _caches.register("index shapes seen", _caches.LRU(_caches.limit("total")))
_MAX_MOVED = 1 << 16  # elements: a bigger index is not worth a trip through the host


def _paddable(t: torch.Tensor, d: int) -> bool:
    """Whether a padded copy of `t` along d keeps CPU's strides and is worth the host trip:
    small, its dim outermost but for size-1 dims (a bucket's strides would show before it)."""
    return t.numel() <= _MAX_MOVED and all(n == 1 for n in t.shape[:d])


def _computed_entry(t: torch.Tensor):
    """`t`'s storage entry when its buffer is computed and of t's dtype, else None (a value of
    a deferred region: reading it would end the region; a view of another dtype)."""
    entry = table.get(t.untyped_storage()._cdata)
    if entry is None or not isinstance(entry.buf, jax.Array) or entry.dtype != to_jax_dtype(t.dtype):
        return None
    return entry


def _index_at(low: Lowering, args):
    """(path of the index tensor, the dim of the source it picks along) of an index_select,
    embedding or x[..., idx] call with one index tensor, else None."""
    if low.name != "index.Tensor":
        i = _INDEX_ARG[low.name]
        if len(args) <= i:
            return None
        return (i,), (args[1] % max(args[0].dim(), 1) if i == 2 and isinstance(args[0], torch.Tensor) else 0)
    if len(args) != 2 or not isinstance(args[1], (list, tuple)):
        return None
    given = [k for k, a in enumerate(args[1]) if a is not None]
    if len(given) != 1 or not isinstance(args[1][given[0]], torch.Tensor) or args[1][given[0]].dim() != 1:
        return None
    return (1, given[0]), given[0]


def vary_index(low: Lowering, args, kwargs):
    """The arguments of an index_select/embedding/x[..., idx] call, its index replaced by a
    dynamic padded copy when its length keeps changing for one op signature (see above)."""
    after = extents.AFTER
    at = _index_at(low, args) if after else None
    if at is None:
        return args
    path, along = at
    idx, src = rules.get(args, {}, path), args[0]
    if (not isinstance(idx, torch.Tensor) or idx.device.type != "tpu" or idx.dim() == 0
            or not isinstance(src, torch.Tensor) or idx.dtype in (torch.bool, torch.uint8)):
        return args
    if _find(idx) is not None:
        return args
    key = (low.name, tuple(src.shape), src.dtype, idx.dtype, idx.dim(), path, along)
    shape = tuple(idx.shape)
    dims = extents.varying(_index_shapes, key, shape, lambda: _prefix_dims(idx))
    if dims is None:
        return args
    dims = sorted(dims)
    if (len(dims) != 1 or shape[dims[0]] <= 1 or not _paddable(idx, dims[0])
            or any(m != 1 for m in src.shape[:along])):
        return args  # only where the result stays a contiguous tensor, with CPU's strides
    d, n = dims[0], shape[dims[0]]
    # a window of its storage at its own bucket keeps to windows (a host copy costs a trip)
    windowed = _window(idx, d, bucket(n)) is not None
    b = extents.buckets(_index_shapes, key, (n,), (lambda u: _window(idx, d, u[0]) is not None) if windowed else None,
                        src.numel() // max(src.shape[along] if src.dim() else 1, 1))[0]
    window = _window(idx, d, b)
    if window is not None:  # a row prefix of an index buffer: the bucket read from its storage
        _marked[table.get(idx.untyped_storage()._cdata)] = window
        executor.intercept("dynamic", execute)
        bump("dynamic_indices")
        return args
    entry = _computed_entry(idx)
    if entry is None:
        return args
    bump("dynamic_indices")
    # the call gets a padded copy; the user's tensor stays as it is (a compiled graph it meets
    # later, on every rank alike, sees the tensor it was traced with)
    args = list(args)
    rules.put_arg(args, {}, path, _padded_copy(idx, entry, d, b))
    return tuple(args)


def _prefix_dims(idx: torch.Tensor) -> tuple:
    """(d,) when `idx` is a prefix along d, its one dim of size above 1, of a bigger storage
    with room for its bucket there: a serving loop's row of a preallocated index buffer
    sliced to each step's length, whose length varies from its first call."""
    big = [d for d, n in enumerate(idx.shape) if n > 1]
    entry = table.get(idx.untyped_storage()._cdata) if len(big) == 1 and idx.device.type == "tpu" else None
    if (entry is None or extents.partial_dims(idx.shape, idx.stride(), idx.storage_offset(), entry.numel) != tuple(big)
            or _window(idx, big[0], bucket(idx.shape[big[0]])) is None):
        return ()
    return tuple(big)


def _vary_source(low: Lowering, args, kwargs):
    """copy_(dst, src) into views of a preallocated buffer whose extent varies (a serving
    loop's `index_buffer[i, :n] = torch.tensor(indices)`): eager/extents.py runs such a write
    over a bucket window of dst's storage, but a whole src of the true size would still key
    the program by its size. Once the signature varies, a small src with a computed buffer is
    replaced for the call by a copy in a storage with the bucket's room, through the host
    (the user's tensor untouched), so the write compiles once per bucket."""
    if not extents.AFTER or len(args) < 2:
        return args
    dst, src = args[0], args[1]
    if (not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor) or src.device.type != "tpu"
            or dst.device.type != "tpu" or src.shape != dst.shape or src.dim() == 0
            or src.numel() > _MAX_MOVED):
        return args
    dentry, sentry = table.get(dst.untyped_storage()._cdata), table.get(src.untyped_storage()._cdata)
    if (dentry is None or sentry is None or dst.numel() >= dentry.numel or src.numel() < sentry.numel
            or not isinstance(sentry.buf, jax.Array) or sentry.dtype != to_jax_dtype(src.dtype)):
        return args  # dst a whole tensor (stays exact), src a view (extents reads its window), ...
    key = (low.name, dentry.numel, dst.dtype, src.dtype, dst.dim())
    dims = extents.varying(_index_shapes, key, tuple(dst.shape))
    if not dims or any(dst.shape[d] <= 1 for d in dims):
        return args
    # the room of the bucket the write will run at (extents.plan reuses one within REUSE of the
    # size's own as this does; it keeps to a bucket this room holds)
    dims = sorted(dims)
    chosen = dict(zip(dims, extents.buckets(_index_shapes, key, [dst.shape[d] for d in dims])))
    room = [chosen.get(d, n) for d, n in enumerate(src.shape)]
    new = _host_room(src, sentry, room)
    bump("padded_sources")
    args = list(args)
    args[1] = tensors.alias(new, tuple(src.shape), new.stride(), 0)
    return tuple(args)


# --- ranges whose length varies from call to call ------------------------------------------
#
# A training loop over sequences of varying length makes its positions with arange(n) each
# step (rotary embeddings, position ids): each n compiled arange and, after it, every op over
# the positions at that size (the rotary tables, their products with q and k, and backward).
# Once arange of one dtype has made more than extents.AFTER lengths above MIN_BUCKET, it runs
# over the length's bucket and hands back the first n positions, marked dynamic (not strict),
# so the ops after it run per bucket, as with a dynamic index. Short ranges (a test's
# arange(6).view(2, 3)) stay exact.

def vary_factory(low: Lowering, args, kwargs, run):
    """The executor's "vary_factory" interceptor: arange(n) of a length that keeps changing,
    as the first n of a bucket-long range, dynamic; None to run the call as it is."""
    if not extents.AFTER or len(args) != 1:
        return None
    n = args[0]
    if type(n) is not int or n <= extents.MIN_BUCKET or kwargs.get("layout") not in (None, torch.strided):
        return None
    key = (low.name, kwargs.get("dtype"), str(kwargs.get("device")))
    # in a compiled graph run over dynamic inputs, a range is over a size Dynamo made
    # symbolic because it varies: bucketed from its first length
    if extents.varying(_index_shapes, key, (n,)) is None and not state.graph_views:
        return None
    # (as a graph's inputs are padded)
    b = graph_bucket(n) if state.graph_views else extents.buckets(_index_shapes, key, (n,))[0]
    whole = run(low, (b,), kwargs)
    t = tensors.alias(whole, (n,), (1,), 0)
    _auto(t, 0, n, b)
    bump("dynamic_ranges")
    return t


def vary_args(low: Lowering, args, kwargs):
    """The executor's "vary_args" interceptor: index_select/embedding (vary_index), copy_
    (_vary_source)."""
    return _vary_source(low, args, kwargs) if low.name == "copy_" else vary_index(low, args, kwargs)


executor.intercept("vary_args", vary_args)
executor.intercept("vary_factory", vary_factory)
executor.intercept("marked", _marked.data)  # (csrc/hit.cpp serves calls over no marked storage)


def unpad_for_view(t: torch.Tensor) -> bool:
    """Re-home `t`, a growth's padded tensor (not a mark_dynamic one), into a contiguous
    buffer of its true sizes, in place, so that a view CPU allows of its contiguous tensor
    (merging the grown dim with the dims before it: `ids.view(-1)`, `x.view(-1, x.size(-1))`)
    works here too; a bucket's strides make such a view impossible. Only a tensor no view
    shares a storage with (their writes would no longer reach it). Returns whether it moved;
    the tensor stays dynamic, packed (ops/dynamism.py), where the copy could be packed, and
    runs on its true sizes otherwise."""
    f = _find(t)
    if f is None or f[1].strict or t.storage_offset() != 0:
        return False
    if _use_count(t.untyped_storage()._cdata) > _ALONE:
        return False
    with torch.no_grad():
        c = t.clone(memory_format=torch.contiguous_format)
    found = _find(c)
    if (found is not None and found[1].inner is None) or not c.is_contiguous():
        return False
    tensors.set_geometry(t, c.untyped_storage(), tuple(t.shape), c.stride(), 0)
    bump("unpadded_for_view")
    return True


# --- growing tensors cross bucket edges together -------------------------------------------
#
# A decode step grows several tensors by one position each, at different points of the
# step: the KV cache of every layer inside the forward, then the token ids and the attention
# mask, one longer than the cache. Each crossing its bucket edge on its own made three new
# defer_and_fuse regions per edge (ids over, then the cache over, then the steady step).
# Instead, when one growing tensor would overflow its bucket at its next append, every live
# growing tensor of that bucket near its edge moves to the next bucket at once, between
# regions (after a flush; in strict mode before the next cat): the next step's region is
# then the new bucket's steady region, one new program per edge. The move goes through the
# host (one transfer each way per tensor per edge, no program to compile), as
# mark_dynamic's padding does. Only a tensor no view shares a storage with moves (_movable).

LEAD = 4  # appends ahead of its edge within which a tensor moves with one that must
_members: dict = {}  # serial -> _Member: live results of growth (auto-dynamic cats)
_clock = [0]  # appends seen so far (a member's serial is the clock at its append)


class _Member:
    __slots__ = ("ref", "dim", "step", "serial")

    def __init__(self, ref, dim, step, serial):
        self.ref, self.dim, self.step, self.serial = ref, dim, step, serial


def _grew(t, d, step) -> None:
    """Remember `t`, the result of a cat that grew dim `d` by `step`, as a growing tensor."""
    if not isinstance(t, torch.Tensor) or step <= 0:
        return
    k = _clock[0] = _clock[0] + 1
    # `pop` bound now: a tensor dying at interpreter exit finds `_members` already None
    _members[k] = _Member(weakref.ref(t, lambda _, k=k, pop=_members.pop: pop(k, None)), d, step, k)


def cross_edges() -> int:
    """Move the growing tensors of a bucket to the next one together, once one of them would
    overflow it at its next append. Returns how many moved."""
    if not _members:
        return 0
    now = _clock[0]
    # a tensor still growing was produced within the last round of appends; an old result
    # someone still holds (the ids a finished generate returned) no longer leads anything
    window = 2 * len(_members) + 2
    live = []
    for m in list(_members.values()):
        t = m.ref()
        if t is None or now - m.serial > window:
            continue
        f = _find(t)
        if f is None or f[0] != m.dim or f[1].strict or f[1].upper is not None:
            continue
        live.append((t, m, f[1]))
    edges = {info.bucket for _, m, info in live if info.n + m.step > info.bucket}
    moved = 0
    for t, m, info in live:
        if info.bucket in edges and info.n + LEAD * m.step > info.bucket and _movable(t):
            _move(t, m.dim, info, bucket(info.bucket + 1))
            moved += 1
    return moved


def _movable(t: torch.Tensor) -> bool:
    """Whether `t` may move to a new storage: no other tensor (a view) shares its storage,
    whose writes would no longer reach it; no autograd history; a computed buffer."""
    s = t.untyped_storage()
    entry = table.get(s._cdata)
    return (entry is not None and isinstance(entry.buf, jax.Array) and not t.requires_grad
            and t.grad_fn is None and _use_count(s._cdata) <= _ALONE)


_use_count = torch._C._storage_Use_Count
_ALONE = 2  # a storage held by one tensor: the tensor and its StorageImpl's own Python object


def _move(t: torch.Tensor, d: int, info: Dyn, nb: int) -> None:
    """Re-home `t` (in place: same tensor, same sizes) into a buffer of bucket `nb` along d,
    through the host."""
    new = _host_padded(t, storage.lookup(t), d, nb)
    tensors.set_geometry(t, new.untyped_storage(), tuple(t.shape), new.stride(), 0)
    e = storage.lookup(new)
    _marked[e] = Dyn(new.stride(d), info.n, nb, info.lower, info.upper, info.strict)
    growth.mark_grown(e)
    bump("bucket_moves")


executor.intercept("after_flush", cross_edges)
