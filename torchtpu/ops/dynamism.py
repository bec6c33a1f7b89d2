"""How ops compute over a dimension of varying size (torchtpu.mark_dynamic).

A dynamic tensor lives in a buffer padded along one dim to a bucket of B positions; its
true size n (n <= B) is a runtime value of the program, so every n of a bucket shares one
program (eager/dynamism.py keeps that state and runs the op). A rule here says, for one op
family:

- `plan`, on the arguments' true shapes before the call: which dim of each result is
  dynamic and its true size (or None: the result's shape does not depend on n), and which
  static inputs must be padded to B to line up with the dynamic ones;
- `apply`, inside the program on the padded JAX arrays: the lowering, with masks where the
  padding would leak into the first n positions (reductions over the dim, softmax along it,
  attention keys, a matmul's contraction, a cat along it). Elementwise ops need none: the
  padding computes garbage that no valid position reads.

Paths name an argument: (i,) the i-th positional, (i, j) element j of a list argument,
("name",) a keyword argument.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import checks

EXACT = "exact"  # plan's answer for a call that must run on the true sizes (a contiguous copy)


class CannotHonour(RuntimeError):
    """The op cannot keep the marked dim dynamic (raised with the op and the dim named)."""


@dataclass(frozen=True)
class Plan:
    outs: tuple  # per result: (dim, true size) or None; one entry serves every result
    pads: tuple = ()  # ((path, dim), ...): static inputs padded to the bucket along dim
    extra: tuple = ()  # rule-specific static facts for apply
    contiguous: bool = False  # dynamic results laid out as CPU's contiguous tensor (packed)
    sizes: tuple = ()  # ((path, i), ...): entry i of a static size list holds n; it gets the bucket
    # an in-place op writing a static tensor from dynamic inputs, its padding changing nothing
    # there (index_copy_ of a varying number of rows); else such a write runs on true sizes
    into_static: bool = False


@dataclass(frozen=True)
class Ctx:
    """What a program over padded inputs knows statically (part of its cache key)."""
    dims: tuple  # ((path, dim), ...) of the dynamic inputs
    pads: tuple
    bucket: int
    bouts: tuple  # each result's bucket (None: static)
    extra: tuple = ()
    packed: tuple = ()  # ((path, padded shape, dim), ...): inputs passed packed (unpack)
    pack: tuple = ()  # ((result index, dim), ...): results returned packed (pack)


# --- packed: a dynamic tensor with CPU's contiguous strides ------------------------------------
#
# A padded bucket has the bucket's strides, so a contiguous copy (`.contiguous()`, a reshape
# that must copy, `repeat_kv`'s expand + reshape) could not be one without showing other strides
# than CPU's. Packed, the tensor is an ordinary contiguous tensor of its true sizes at the start
# of a storage with the bucket's room; a program over it gathers the padded bucket from those
# positions (the strides before the dim are runtime values: they hold n) and scatters its
# padded result back into them.

def _true_positions(shape, d, n):
    """For each position of the padded `shape`, its flat position in the contiguous tensor of
    the true sizes (n at d), and whether it is one of the true positions."""
    nd = len(shape)
    pos = jnp.zeros(shape, jnp.int64)
    step = jnp.asarray(1, jnp.int64)
    for k in range(nd - 1, -1, -1):
        pos = pos + lax.broadcasted_iota(jnp.int64, shape, k) * step
        step = step * (n.astype(jnp.int64) if k == d else shape[k])
    return pos, valid(shape, d, n)


def unpack(flat, shape, d, n):
    """The padded bucket `shape` (true size n at d) of a packed tensor's storage `flat`."""
    pos, keep = _true_positions(shape, d, n)
    got = jnp.take(flat, jnp.where(keep, pos, 0).reshape(-1), mode="clip").reshape(shape)
    return jnp.where(keep, got, jnp.zeros((), flat.dtype))


def pack(x, d, n):
    """The packed storage (as many positions as the padded `x` has) of padded `x`."""
    pos, keep = _true_positions(x.shape, d, n)
    room = x.size
    at = jnp.where(keep, pos, room).reshape(-1)
    return jnp.zeros((room,), x.dtype).at[at].set(x.reshape(-1), mode="drop")


def get(args, kwargs, path):
    v = kwargs[path[0]] if isinstance(path[0], str) else args[path[0]]
    return v[path[1]] if len(path) > 1 else v


def put_arg(args, kwargs, path, value):
    if len(path) > 1:
        seq = list(get(args, kwargs, path[:1]))
        seq[path[1]] = value
        put_arg(args, kwargs, path[:1], seq)
    elif isinstance(path[0], str):
        kwargs[path[0]] = value
    else:
        args[path[0]] = value


def tensor_paths(args, kwargs):
    """Every tensor argument's path (tensors on the torch side or arrays inside a trace)."""
    out = []
    items = [((i,), a) for i, a in enumerate(args)] + [((k,), v) for k, v in kwargs.items()]
    for p, v in items:
        if isinstance(v, (list, tuple)):
            out += [p + (j,) for j, x in enumerate(v) if _is_tensor(x)]
        elif _is_tensor(v):
            out.append(p)
    return out


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) or hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, np.generic)


def valid(shape, dim, n):
    """True at the first n positions along `dim`."""
    return lax.broadcasted_iota(jnp.int32, shape, dim) < n


def pad_to(x, dim, size):
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, size - x.shape[dim])
    return jnp.pad(x, widths)


def _lowest(dt):
    dt = jnp.dtype(dt)
    if dt == jnp.bool_:
        return False
    return -jnp.inf if jnp.issubdtype(dt, jnp.inexact) else jnp.iinfo(dt).min


def _highest(dt):
    dt = jnp.dtype(dt)
    if dt == jnp.bool_:
        return True
    return jnp.inf if jnp.issubdtype(dt, jnp.inexact) else jnp.iinfo(dt).max


class Rule:
    def plan(self, args, kwargs, dims, n):
        raise NotImplementedError

    def apply(self, fn, ctx, n, args, kwargs):
        return fn(*args, **kwargs)


# --- elementwise: the dynamic dims line up in the broadcast result ---------------------------

class Pointwise(Rule):
    def plan(self, args, kwargs, dims, n):
        paths = tensor_paths(args, kwargs)
        nd = max(get(args, kwargs, p).dim() for p in paths)
        od = {nd - get(args, kwargs, p).dim() + d for p, d in dims.items()}
        if len(od) != 1:
            return None
        od = od.pop()
        pads = []
        for p in paths:
            if p in dims:
                continue
            t = get(args, kwargs, p)
            a = od - (nd - t.dim())
            if a >= 0 and t.shape[a] == n and n != 1:
                pads.append((p, a))
        return Plan(((od, n),), tuple(pads))


class Clone(Pointwise):
    def plan(self, args, kwargs, dims, n):
        fmt = kwargs.get("memory_format", args[1] if len(args) > 1 else None)
        (p, d), = dims.items()
        t = get(args, kwargs, p)
        base = super().plan(args, kwargs, dims, n)
        if fmt == torch.contiguous_format and any(s != 1 for s in t.shape[:d]):
            # a contiguous copy cannot be a prefix of a padded buffer: packed (see above)
            return None if base is None else Plan(base.outs, base.pads, base.extra, contiguous=True)
        return base


# --- reductions ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reduce(Rule):
    kind: str  # sum, mean, prod, max, min, any, all, logsumexp, var, std
    dim_at: object = None  # (position, name) of the dim argument; None: reduces every dim
    keep_at: object = None  # (position, name) of keepdim
    all_when_empty: bool = True  # dim=[] means every dim (amax, sum.dim_IntList)

    def _arg(self, args, kwargs, at, default):
        if at is None:
            return default
        i, name = at
        if name in kwargs:
            return kwargs[name]
        return args[i] if i < len(args) else default

    def reduced(self, args, kwargs, nd):
        dim = self._arg(args, kwargs, self.dim_at, None)
        if dim is None or (isinstance(dim, (list, tuple)) and not dim and self.all_when_empty):
            return set(range(nd)), False if self.dim_at is None else bool(self._arg(args, kwargs, self.keep_at, False))
        dims = dim if isinstance(dim, (list, tuple)) else [dim]
        keep = bool(self._arg(args, kwargs, self.keep_at, False))
        return {x % max(nd, 1) for x in dims}, keep

    def plan(self, args, kwargs, dims, n):
        (p, d), = dims.items()
        if p != (0,):
            return None
        t = args[0]
        red, keep = self.reduced(args, kwargs, t.dim())
        if d in red:
            if self.kind in ("argmax", "argmin") and len(red) > 1:
                return None  # an index into the flattened padded tensor is not the true one
            return Plan((None,), extra=(True,))
        return Plan(((d if keep else d - sum(1 for r in red if r < d), n),), extra=(False,))

    def apply(self, fn, ctx, n, args, kwargs):
        if not ctx.extra[0]:
            return fn(*args, **kwargs)
        (_, d), = ctx.dims
        x = args[0]
        mask = valid(x.shape, d, n)
        kind = self.kind
        if kind in ("var", "std"):
            return _var(self, ctx, n, args, kwargs, mask)
        fill = {"sum": 0, "mean": 0, "any": False, "prod": 1, "all": True, "max": _lowest(x.dtype),
                "logsumexp": -jnp.inf, "min": _highest(x.dtype), "argmax": _lowest(x.dtype),
                "argmin": _highest(x.dtype)}[kind]
        args = [jnp.where(mask, x, jnp.asarray(fill, x.dtype))] + list(args[1:])
        out = fn(*args, **kwargs)
        if kind == "mean":  # the mean over B positions, scaled to one over the n valid ones
            return out * (jnp.asarray(ctx.bucket, out.dtype) / n.astype(out.dtype))
        return out


def _var(rule, ctx, n, args, kwargs, mask):
    x = args[0]
    red, keep = rule.reduced(args, kwargs, x.ndim)
    axes = tuple(sorted(red))
    corr = kwargs.get("correction")
    corr = 1 if corr is None else corr
    acc = jnp.promote_types(x.dtype, jnp.float32) if not jnp.issubdtype(x.dtype, jnp.inexact) else x.dtype
    xf = x.astype(acc)
    others = int(np.prod([x.shape[a] for a in axes if a != ctx.dims[0][1]]))
    count = n.astype(acc) * jnp.asarray(others, acc)
    mean = jnp.sum(jnp.where(mask, xf, 0), axis=axes, keepdims=True) / count
    dev = jnp.where(mask, xf - mean, 0)
    if jnp.iscomplexobj(dev):
        sq = (dev * jnp.conj(dev)).real
    else:
        sq = dev * dev
    var = (jnp.sum(sq, axis=axes, keepdims=keep) / jnp.maximum(count - corr, 0)).astype(sq.dtype)
    return jnp.sqrt(var) if rule.kind == "std" else var


# --- softmax along (or across) the dim -------------------------------------------------------

class Softmax(Rule):
    def plan(self, args, kwargs, dims, n):
        (p, d), = dims.items()
        if p != (0,):
            return None
        return Plan(((d, n),), extra=(args[1] % args[0].dim() == d,))

    def apply(self, fn, ctx, n, args, kwargs):
        if ctx.extra[0]:
            x = args[0]
            args = [jnp.where(valid(x.shape, ctx.dims[0][1], n), x, jnp.asarray(-jnp.inf, x.dtype))] + list(args[1:])
        return fn(*args, **kwargs)


# --- attention: queries along L (rows), keys/values along S (masked) --------------------------

class Attention(Rule):
    def plan(self, args, kwargs, dims, n):
        q, k, v = args[0], args[1], args[2]
        mask = kwargs.get("attn_mask")
        keyed = {(0,): 2, (1,): 2, (2,): 2, ("attn_mask",): None if mask is None else mask.dim() - 1}
        if any(keyed.get(p, -1) != d for p, d in dims.items()):
            return None
        qd, kd = (0,) in dims, (1,) in dims or (2,) in dims
        if ("attn_mask",) in dims and not kd:
            return None  # a mask padded along the keys of static keys
        pads = []
        if kd:
            for p, t in (((1,), k), ((2,), v)):
                if p not in dims:
                    if t.shape[2] != n:
                        return None
                    pads.append((p, 2))
        if mask is not None and ("attn_mask",) not in dims:
            if kd and mask.shape[-1] == n and n != 1:
                pads.append((("attn_mask",), mask.dim() - 1))
            if qd and mask.dim() >= 2 and mask.shape[-2] == n and n != 1:
                if not (kd and mask.shape[-1] == n):
                    return None
                # a prefill's causal mask over n queries and n keys: padded along both (the
                # executor reads it as a window of its storage, or a padded copy)
                pads.append((("attn_mask",), mask.dim() - 2))
        outs = ((2, n),) if qd else (None,)
        return Plan(outs, tuple(pads), extra=(kd,))

    def apply(self, fn, ctx, n, args, kwargs):
        if ctx.extra[0]:
            kwargs = _keys_masked(kwargs, args[1].shape[2], n)
        return fn(*args, **kwargs)

    def rows(self, args, kwargs, dims):
        """Queries dynamic at another size than the keys (a serving step's few query rows beside
        its many keys): ({result: dim} following the query rows, static arguments padded with
        them); rows are independent, so padded ones are only cut."""
        if dims != {(0,): 2}:
            return None
        q, mask = args[0], kwargs.get("attn_mask")
        extra = ()
        if mask is not None and mask.dim() >= 2 and mask.shape[-2] == q.shape[2] and q.shape[2] != 1:
            extra = ((("attn_mask",), mask.dim() - 2),)
        return {0: 2, 1: 2}, extra


def _keys_masked(kwargs, keys: int, n):
    """kwargs with attn_mask hiding the padded keys (past n of `keys`), as the forward and
    backward attention rules both need: a bool mask and-ed, a float one -inf there."""
    keep = valid((keys,), 0, n)
    mask = kwargs.get("attn_mask")
    if mask is None:
        mask = keep
    elif mask.dtype == jnp.bool_:
        mask = mask & keep
    else:
        mask = jnp.where(keep, mask, jnp.asarray(-jnp.inf, mask.dtype))
    return dict(kwargs, attn_mask=mask)


class AttentionBackward(Rule):
    """The fused attention's backward: rows (grad_out, query, out, logsumexp) along L and keys
    (key, value) along S, either or both dynamic. Padded rows get a zero gradient and a
    -inf log-sum-exp (probabilities 0: they add nothing to the keys' gradients), padded keys
    are masked as in the forward."""
    ROWS = ((0,), (1,), (4,), (5,))
    KEYS = ((2,), (3,))

    def plan(self, args, kwargs, dims, n):
        mask = kwargs.get("attn_mask")
        masked = ("attn_mask",) in dims
        if masked and dims[("attn_mask",)] != mask.dim() - 1:
            return None
        if any(d != 2 or p not in self.ROWS + self.KEYS for p, d in dims.items() if p != ("attn_mask",)):
            return None
        qd, kd = any(p in dims for p in self.ROWS), any(p in dims for p in self.KEYS)
        if masked and not kd:
            return None
        pads = []
        for on, paths in ((qd, self.ROWS), (kd, self.KEYS)):
            for p in paths if on else ():
                if p not in dims:
                    if args[p[0]].shape[2] != n:
                        return None
                    pads.append((p, 2))
        if mask is not None:
            if qd and mask.dim() >= 2 and mask.shape[-2] == n and n != 1:
                return None  # a mask padded along two dims
            if kd and not masked and mask.shape[-1] == n and n != 1:
                pads.append((("attn_mask",), mask.dim() - 1))
        rows, keys = ((2, n) if qd else None), ((2, n) if kd else None)
        return Plan((rows, keys, keys), tuple(pads), extra=(qd, kd))

    def apply(self, fn, ctx, n, args, kwargs):
        qd, kd = ctx.extra
        if qd:
            keep = valid(args[1].shape[:3] + (1,), 2, n)
            for i in (0, 1, 4):
                args[i] = jnp.where(keep, args[i], jnp.zeros((), args[i].dtype))
            lse = args[5]
            args[5] = jnp.where(valid(lse.shape, 2, n), lse, jnp.asarray(-jnp.inf, lse.dtype))
        if kd:
            kwargs = _keys_masked(kwargs, args[2].shape[2], n)
        return fn(*args, **kwargs)


# --- matmul: a dim of the result, or the contraction (zero-filled) ----------------------------

@dataclass(frozen=True)
class Matmul(Rule):
    operands: tuple  # ((path, letters), ...)
    out: str
    bias: object = None  # path of an added term broadcast to `out`

    def plan(self, args, kwargs, dims, n):
        letters = {}
        for p, d in dims.items():
            found = [ls for q, ls in self.operands if q == p]
            if not found:
                return None  # a dynamic bias: not served
            letters[found[0][d]] = True
        if len(letters) != 1:
            return None
        letter = next(iter(letters))
        pads = []
        for p, ls in self.operands:
            if p not in dims and letter in ls:
                a = ls.index(letter)
                if get(args, kwargs, p).shape[a] != n:
                    return None
                if n != 1:
                    pads.append((p, a))
        if letter not in self.out:
            return Plan((None,), tuple(pads), extra=(letter,))
        od = self.out.index(letter)
        if self.bias is not None:
            b = get(args, kwargs, self.bias)
            a = od - (len(self.out) - b.dim())
            if a >= 0 and b.shape[a] == n and n != 1:
                pads.append((self.bias, a))
        return Plan(((od, n),), tuple(pads), extra=(letter,))

    def apply(self, fn, ctx, n, args, kwargs):
        letter = ctx.extra[0]
        if letter not in self.out:  # contraction: the padding must add nothing
            for p, ls in self.operands:
                x = get(args, kwargs, p)
                a = ls.index(letter)
                put_arg(args, kwargs, p, jnp.where(valid(x.shape, a, n), x, jnp.zeros((), x.dtype)))
        return fn(*args, **kwargs)


# --- cat: along the dim (runtime offsets) or across it -----------------------------------------

class Cat(Rule):
    def plan(self, args, kwargs, dims, n):
        # a legacy empty 1-D input (DynamicCache's first `torch.cat([empty, keys], -2)`) is
        # skipped by cat, here too
        ts = [None if t.dim() == 1 and t.numel() == 0 else t for t in args[0]]
        cd = kwargs.get("dim", args[1] if len(args) > 1 else 0)
        real = [t for t in ts if t is not None]
        if not real or any((0, j) in dims for j, t in enumerate(ts) if t is None):
            return None
        nd = real[0].dim()
        if any(t.dim() != nd for t in real):
            return None
        cd %= nd
        if len({d for d in dims.values()}) != 1:
            return None
        d = next(iter(dims.values()))
        if d != cd:
            pads = []
            for j, t in enumerate(ts):
                if t is not None and (0, j) not in dims:
                    if t.shape[d] != n:
                        return None
                    if n != 1:
                        pads.append(((0, j), d))
            return Plan(((d, n),), tuple(pads), extra=(False, cd))
        sizes = tuple(None if (0, j) in dims else 0 if t is None else t.shape[cd] for j, t in enumerate(ts))
        total = sum(n if s is None else s for s in sizes)
        return Plan(((cd, total),), extra=(True, cd, sizes))

    def apply(self, fn, ctx, n, args, kwargs):
        if not ctx.extra[0]:
            return fn(*args, **kwargs)
        _, cd, sizes = ctx.extra
        legacy = [t.ndim == 1 and t.shape[0] == 0 for t in args[0]]
        # cat's promotion, legacy empty inputs included
        dtype = fn([t if old else lax.slice_in_dim(t, 0, 0, axis=cd) for t, old in zip(args[0], legacy)], cd).dtype
        ts = [t for t, old in zip(args[0], legacy) if not old]
        sizes = [z for z, old in zip(sizes, legacy) if not old]
        room = ctx.bouts[0] + sum(t.shape[cd] for t in ts)
        shape = list(ts[0].shape)
        shape[cd] = room
        buf = jnp.zeros(shape, dtype)
        at = jnp.zeros((), jnp.int64)
        for t, s in zip(ts, sizes):
            buf = lax.dynamic_update_slice_in_dim(buf, t.astype(dtype), at, cd)
            at = at + (n if s is None else s)
        return lax.slice_in_dim(buf, 0, ctx.bouts[0], axis=cd)


# --- indexing: an index tensor of dynamic length, or a dynamic dim the index leaves alone -----

def _first_row(args, kwargs, at, ctx, n):
    """The index at `at` with its padding pointing at row 0: a padded bucket read as a window
    of its storage holds whatever lies past the true extent, which must not index out of range."""
    for p, d in ctx.dims:
        if p == at:
            idx = get(args, kwargs, p)
            put_arg(args, kwargs, p, jnp.where(valid(idx.shape, d, n), idx, jnp.zeros((), idx.dtype)))


class IndexSelect(Rule):
    def plan(self, args, kwargs, dims, n):
        dim = args[1] % max(args[0].dim(), 1)
        if (2,) in dims:
            if (0,) in dims:
                return None
            return Plan(((dim, n),))
        d = dims[(0,)]
        if d == dim:
            return Plan((None,), extra=(True,))  # indices into the valid positions: a static result
        return Plan(((d, n),))

    def apply(self, fn, ctx, n, args, kwargs):
        _first_row(args, kwargs, (2,), ctx, n)
        if ctx.extra:  # checked against the true size (the lowering checks the bucket's)
            idx = args[2]
            checks.index_in_range(idx, n, message="index out of range in self")
            # (past the true size: pointed at 0, so the lowering's check of the bucket stays quiet)
            args[2] = jnp.where((idx < 0) | (idx >= n), jnp.zeros((), idx.dtype), idx)
        return fn(*args, **kwargs)


class Embedding(Rule):
    def plan(self, args, kwargs, dims, n):
        if set(dims) != {(1,)}:
            return None
        return Plan(((dims[(1,)], n),))

    def apply(self, fn, ctx, n, args, kwargs):
        _first_row(args, kwargs, (1,), ctx, n)
        return fn(*args, **kwargs)


class IndexTensor(Rule):
    """x[..., idx] (index.Tensor) with one 1-D index tensor. Along the dynamic dim (a serving
    step's last position of each request): a static result, indices wrapped by the true size
    and checked against it (the lowering would check the bucket's), CPU's message with its
    size. A dynamic index (its length varies): the result dynamic along the picked dim, the
    padded indices pointing at position 0."""

    def plan(self, args, kwargs, dims, n):
        if kwargs or len(args) != 2:
            return None
        given = [k for k, a in enumerate(args[1]) if a is not None]
        if len(given) != 1 or args[1][given[0]].dtype in (torch.bool, torch.uint8) or args[1][given[0]].dim() != 1:
            return None
        d = given[0]
        if (1, d) in dims:  # the index varies: the result along it
            if dims.get((0,), d) != d or len(dims) > 2:
                return None
            return Plan(((d, n),), extra=(d, True, (0,) in dims))
        if set(dims) != {(0,)} or given != [dims[(0,)]]:
            return None
        return Plan((None,), extra=(d, False, True))

    def apply(self, fn, ctx, n, args, kwargs):
        d, index_dynamic, self_dynamic = ctx.extra
        if index_dynamic:
            _first_row(args, kwargs, (1, d), ctx, n)
            if not self_dynamic:
                return fn(*args, **kwargs)
        indices = list(args[1])
        i = indices[d]
        checks.index_in_range(i, n, 0, negative=True)  # (padded index rows point at 0: in range)
        indices[d] = jnp.where((i < -n) | (i >= n), jnp.zeros((), i.dtype), jnp.where(i < 0, i + n, i))
        return fn(args[0], indices)


class IndexCopy(Rule):
    """index_copy_(self, dim, index, source) of a varying number of rows into a static self (a
    paged KV cache's writes of each step's tokens). Padded indices point at row 0 and carry
    what row 0 gets anyway (its last true write, else its old value), so they write nothing
    new and pass the lowering's range check."""

    def plan(self, args, kwargs, dims, n):
        if kwargs or len(args) != 4 or (0,) in dims or args[0].dim() == 0 or args[2].dim() != 1:
            return None
        dim = args[1] % args[0].dim()
        if dims.get((2,), 0) != 0 or dims.get((3,), dim) != dim or args[3].dim() != args[0].dim():
            return None
        if args[2].shape[0] != n or args[3].shape[dim] != n:
            return None
        pads = tuple((p, d) for p, d in (((2,), 0), ((3,), dim)) if p not in dims)
        return Plan((None,), pads, (dim,), into_static=True)

    def apply(self, fn, ctx, n, args, kwargs):
        self_, dim, index, source = args
        (d,) = ctx.extra
        b = index.shape[0]
        at = jnp.arange(b)
        ok = at < n
        index = jnp.where(ok, index, jnp.zeros((), index.dtype))
        last = jnp.max(jnp.where(ok & (index == 0), at, -1))  # the true write row 0 gets, if any
        row = jnp.where(last >= 0, lax.dynamic_index_in_dim(source, jnp.maximum(last, 0), d),
                        lax.index_in_dim(self_, 0, d).astype(source.dtype))
        source = jnp.where(valid(source.shape, d, n), source, row)
        return fn(self_, dim, index, source)


# --- a training step's loss and backward over a varying number of rows ------------------------

def _arg(args, kwargs, i, name):
    return kwargs[name] if name in kwargs else args[i]


def _rows(args, kwargs, dims, n, paths):
    """pads lining up the tensors at `paths` along their dim 0 with the dynamic ones (all of
    `dims` among them, each dynamic in dim 0); None when they cannot line up."""
    if any(d != 0 for d in dims.values()) or not set(dims) <= set(paths):
        return None
    pads = []
    for p in paths:
        if p not in dims:
            if get(args, kwargs, p).shape[0] != n:
                return None
            pads.append((p, 0))
    return tuple(pads)


@dataclass(frozen=True)
class NllLoss(Rule):
    """nll_loss_forward/backward over (N, C) scores with N varying: padded rows get the target
    ignore_index, so they weigh nothing in the sum, the mean's total weight and the gradient."""
    backward: bool

    def plan(self, args, kwargs, dims, n):
        b = int(self.backward)
        x, t = args[b], args[b + 1]
        if x.dim() != 2 or t.dim() != 1:
            return None
        none = _arg(args, kwargs, 3 + b, "reduction") == 0
        paths = [(b,), (b + 1,)] + ([(0,)] if self.backward and none else [])
        pads = _rows(args, kwargs, dims, n, paths)
        if pads is None:
            return None
        if self.backward:
            return Plan(((0, n),), pads)
        return Plan(((0, n) if none else None, None), pads)

    def apply(self, fn, ctx, n, args, kwargs):
        b = int(self.backward)
        ignore = _arg(args, kwargs, 4 + b, "ignore_index")
        t = args[b + 1]
        args[b + 1] = jnp.where(valid(t.shape, 0, n), t, jnp.asarray(ignore, t.dtype))
        return fn(*args, **kwargs)


@dataclass(frozen=True)
class SoftmaxBackward(Pointwise):
    """_softmax_backward_data / _log_softmax_backward_data: elementwise across the dim; along
    it the padding must add nothing to the sum (gradient 0, output 0 or -inf for log)."""
    log: bool

    def plan(self, args, kwargs, dims, n):
        if not set(dims) <= {(0,), (1,)}:
            return None
        base = super().plan(args, kwargs, dims, n)
        if base is None:
            return None
        d = base.outs[0][0]
        return Plan(base.outs, base.pads, extra=(args[2] % max(args[1].dim(), 1) == d,))

    def apply(self, fn, ctx, n, args, kwargs):
        if ctx.extra[0]:
            g, y = args[0], args[1]
            keep = valid(g.shape, ctx.dims[0][1], n)
            fill = -jnp.inf if self.log else 0
            args = [jnp.where(keep, g, jnp.zeros((), g.dtype)), jnp.where(keep, y, jnp.asarray(fill, y.dtype))] + list(args[2:])
        return fn(*args, **kwargs)


class EmbeddingBackward(Rule):
    """embedding_dense_backward with the indices' (and gradient's) dim varying: padded indices
    point past the table, where the scatter drops them (and their counts)."""

    def plan(self, args, kwargs, dims, n):
        g, idx = args[0], args[1]
        ks = set(dims.values())
        if len(ks) != 1 or not set(dims) <= {(0,), (1,)}:
            return None
        k = ks.pop()
        if k >= idx.dim():
            return None
        pads = []
        for p, t in (((0,), g), ((1,), idx)):
            if p not in dims:
                if t.shape[k] != n:
                    return None
                pads.append((p, k))
        return Plan((None,), tuple(pads), extra=(k,))

    def apply(self, fn, ctx, n, args, kwargs):
        k = ctx.extra[0]
        g, idx = args[0], args[1]
        room = _arg(args, kwargs, 2, "num_weights")
        args = [jnp.where(valid(g.shape, k, n), g, jnp.zeros((), g.dtype)),
                jnp.where(valid(idx.shape, k, n), idx, jnp.asarray(room, idx.dtype))] + list(args[2:])
        return fn(*args, **kwargs)


class SliceBackward(Rule):
    """slice_backward(grad, input_sizes, dim, start, end, step) with grad dynamic across the
    sliced dim (rotate_half's halves, a head's slice of features): zeros of the input's sizes,
    grad at the slice. input_sizes holds n at the dynamic dim: it gets the bucket (Plan.sizes),
    so every n of a bucket shares the program; the padding's rows stay padding."""

    def plan(self, args, kwargs, dims, n):
        if set(dims) != {(0,)} or len(args) < 3:
            return None
        d, sizes = dims[(0,)], list(args[1])
        if args[0].dim() != len(sizes) or args[2] % max(len(sizes), 1) == d or sizes[d] != n:
            return None
        return Plan(((d, n),), sizes=(((1,), d),))


class ConstantPad(Rule):
    """constant_pad_nd over a dynamic tensor (a loss's labels padded by one ignore_index
    before the shift): across the dim, padding is elementwise in it; along it, the value
    goes after the true n positions (and `lo` of it before them), so the result's dim is
    n + lo + hi, dynamic, in its own bucket."""

    def plan(self, args, kwargs, dims, n):
        if set(dims) != {(0,)}:
            return None
        d, x = dims[(0,)], args[0]
        pad = list(args[1]) if len(args) > 1 else list(kwargs.get("pad", ()))
        if len(pad) % 2 or len(pad) // 2 > x.dim() or any(p < 0 for p in pad):
            return None
        k = x.dim() - 1 - d  # pad's pair for dim d
        lo, hi = (pad[2 * k], pad[2 * k + 1]) if 2 * k + 1 < len(pad) else (0, 0)
        return Plan(((d, n + lo + hi),), extra=(d, k, lo, hi))

    def apply(self, fn, ctx, n, args, kwargs):
        d, k, lo, hi = ctx.extra
        if not lo and not hi:
            return fn(*args, **kwargs)
        x = args[0]
        pad = list(args[1] if len(args) > 1 else kwargs.pop("pad"))
        pad[2 * k], pad[2 * k + 1] = lo, 0  # along d: lo now, the rest by the mask below
        value = args[2] if len(args) > 2 else kwargs.pop("value", 0)
        y = fn(x, pad, value, **kwargs)
        room = ctx.bouts[0]
        y = pad_to(y, d, room) if y.shape[d] < room else lax.slice_in_dim(y, 0, room, axis=d)
        at = lax.broadcasted_iota(jnp.int32, y.shape, d)
        v = jnp.asarray(value) != 0 if y.dtype == jnp.bool_ else jnp.asarray(value).astype(y.dtype)
        return jnp.where((at >= lo + n) & (at < lo + n + hi), v, y)


def _reductions() -> dict:
    s, k = (1, "dim"), (2, "keepdim")
    return {
        "sum": Reduce("sum"), "sum.dim_IntList": Reduce("sum", s, k), "mean": Reduce("mean"),
        "mean.dim": Reduce("mean", s, k), "prod": Reduce("prod"), "prod.dim_int": Reduce("prod", s, k),
        "amax": Reduce("max", s, k), "amin": Reduce("min", s, k), "max": Reduce("max"), "min": Reduce("min"),
        "max.dim": Reduce("max", s, k), "min.dim": Reduce("min", s, k),
        "argmax": Reduce("argmax", s, k, False), "argmin": Reduce("argmin", s, k, False),
        "logsumexp": Reduce("logsumexp", s, k), "any": Reduce("any"), "any.dim": Reduce("any", s, k),
        "any.dims": Reduce("any", s, k), "all": Reduce("all"), "all.dim": Reduce("all", s, k),
        "all.dims": Reduce("all", s, k), "var.correction": Reduce("var", s, (3, "keepdim")),
        "std.correction": Reduce("std", s, (3, "keepdim")),
    }


_POINTWISE = Pointwise()
RULES: dict[str, Rule] = {
    **_reductions(),
    "_softmax": Softmax(), "_log_softmax": Softmax(), "_safe_softmax": Softmax(),
    "_scaled_dot_product_flash_attention_for_cpu": Attention(),
    "_scaled_dot_product_flash_attention_for_cpu_backward": AttentionBackward(),
    "mm": Matmul((((0,), "mk"), ((1,), "kn")), "mn"),
    "bmm": Matmul((((0,), "bmk"), ((1,), "bkn")), "bmn"),
    "addmm": Matmul((((1,), "mk"), ((2,), "kn")), "mn", bias=(0,)),
    "baddbmm": Matmul((((1,), "bmk"), ((2,), "bkn")), "bmn", bias=(0,)),
    "dot": Matmul((((0,), "k"), ((1,), "k")), ""),
    "cat": Cat(),
    "index_select": IndexSelect(),
    "index_copy": IndexCopy(),
    "index.Tensor": IndexTensor(),
    "embedding": Embedding(),
    "embedding_dense_backward": EmbeddingBackward(),
    "nll_loss_forward": NllLoss(False), "nll_loss_backward": NllLoss(True),
    "_softmax_backward_data": SoftmaxBackward(False), "_log_softmax_backward_data": SoftmaxBackward(True),
    "clone": Clone(),
    "slice_backward": SliceBackward(),
    "constant_pad_nd": ConstantPad(),
    "copy": _POINTWISE,
    "where.self": _POINTWISE,
    "masked_fill.Scalar": _POINTWISE,
    "masked_fill.Tensor": _POINTWISE,
    "fill.Scalar": _POINTWISE,
    "zero": _POINTWISE,
}
# every lowering of the elementwise family (ops/pointwise.py) broadcasts its inputs
_ELEMENTWISE_MODULES = ("torchtpu.ops.pointwise",)


def rule_for(name: str, fn) -> Rule | None:
    rule = RULES.get(name)
    if rule is None and getattr(fn, "__module__", None) in _ELEMENTWISE_MODULES:
        return _POINTWISE
    return rule


def apply(rule: Rule, fn, ctx: Ctx, *args, dyn_n, **kwargs):
    """The lowering `fn` over padded inputs: packed inputs unpacked, static inputs padded,
    then the rule's masks; results packed where the plan keeps CPU's contiguous layout."""
    args = list(args)
    for p, shape, d in ctx.packed:
        put_arg(args, kwargs, p, unpack(get(args, kwargs, p), shape, d, dyn_n))
    for p, d in ctx.pads:
        put_arg(args, kwargs, p, pad_to(get(args, kwargs, p), d, ctx.bucket))
    out = rule.apply(fn, ctx, dyn_n, args, kwargs)
    if not ctx.pack:
        return out
    many = isinstance(out, (tuple, list))
    outs = list(out) if many else [out]
    for i, d in ctx.pack:
        outs[i] = pack(outs[i], d, dyn_n)
    return type(out)(outs) if many else outs[0]
