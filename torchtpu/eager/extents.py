"""In-place ops on views whose extent varies: one program per bucket of sizes, not per size.

A preallocated buffer sliced to each step's sizes (`mask[:q, :q + kv].fill_(v)`,
`triu_` on a growing corner, `copy_` into a slot range) is a new view shape at every
step, and every view shape compiled a program of its own. An in-place op of the
pointwise family, or one that reads only positions (triu/tril), computes each element
from the same element of its operands, so it can run over a larger window of the same
storage and write back only the true extent. So once one op signature has written views
of AFTER distinct shapes (config `varying_after`), a dim in which its written view's
size varies is rounded up to a bucket (powers of two from MIN_BUCKET) and its true size
becomes a runtime value, as a view's offset already is. Operands with that dim are read
over the same window (past their storage's end: a clamped gather); broadcast operands
as they are; the padding reads as zeros and the write keeps the old values there. An
operand that is a whole tensor of the varying size (a fresh `src` for copy_) keeps the
call exact: its buffer's size is part of any program's signature.

Only a view whose bucket window lies inside its own storage is written this way, never a
whole tensor (an optimizer's param.zero_() over parameters of many shapes stays exact).
Results are the same as exact execution: nothing outside the view is written.
`metrics()['bucketed_view_ops']` counts the calls served.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ..config import startup
from ..metrics import bump
from ..ops import dynamism as rules
from ..runtime import cache as _caches
from ..runtime import geometry
from ..runtime import leaf as _leaf
from .op_args import TENSOR, target_specs

AFTER = startup.varying_after  # 0: never bucket (views here, index lengths in eager/dynamism.py)
MIN_BUCKET = 16
# ops reading positions, not sizes: padding past the end leaves the true extent's values
_POSITIONAL = frozenset({"triu", "tril"})
# op signature (sizes left out) -> [first written shape, distinct shapes (up to AFTER + 1), varying dims]
_history = _caches.register("in-place view shapes seen", _caches.LRU(_caches.limit("total")))
_eligible_ops: dict = _caches.register("in-place ops padding leaves exact", {})  # lowering name -> bool


def bucket(n: int) -> int:
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def varying(history, key, shape, early=None) -> set | None:
    """The policy, for the op signature `key` (sizes left out) called at `shape`: the dims in
    which its shapes have varied, once it has seen more than AFTER distinct shapes and this
    is not its first; None while it runs exact. `early()`: the dims the caller knows vary
    from the first call (a prefix of a preallocated buffer), asked at the first call only and
    bucketed from it, with those found to vary later. `history` (an LRU) keeps what it has seen: [first shape, distinct shapes (up
    to AFTER + 1), varying dims, bucket tuples it ran at, whether it was bucketed from the
    first]."""
    seen = history.get(key)
    if seen is None:
        early = early() if early is not None else ()
        history[key] = [shape, {shape}, set(early), set(), bool(early)]
        return set(early) if early else None
    first, shapes, dims, _, bucketed = seen
    if shape == first and not bucketed:
        return None  # its exact program exists
    dims.update(d for d in range(len(shape)) if shape[d] != first[d])
    if bucketed:
        return dims
    if len(shapes) <= AFTER:
        shapes.add(shape)
        if len(shapes) <= AFTER:
            return None
    return dims


# A bucket up to REUSE times a size's own serves it when its signature has run at that bucket
# before: a serving loop's prefill of 100 tokens after one of 133 reuses the 256 bucket's
# programs (at most 4x the true size computed, for a whole chain of compiles saved). A small
# window (at most SMALL elements: a mask row, one request's causal block) takes the largest
# bucket it has run at, whatever its size: its padding costs nothing next to a compile, and
# one program for every size keeps a deferred region's ops the same from step to step (each
# request's row at its own bucket made a new region whenever one request crossed an edge).
REUSE = 2
SMALL = 1 << 12


def buckets(history, key, sizes, fits=None, inner: int | None = None) -> tuple:
    """The buckets (one per varying dim) serving true `sizes` for the signature `key`, which
    varying() has seen: among the tuples it ran at before that hold every size (and pass
    `fits`, when given), the largest whose window (`inner` elements per position) is at most
    SMALL (None: no small rule, what follows is of unknown size), else the smallest within
    REUSE of each size's own bucket; else each size's own bucket, which it then remembers."""
    own = tuple(bucket(n) for n in sizes)
    used = history[key][3]
    small = best = None
    for u in used:
        if len(u) != len(own) or any(b < n for n, b in zip(sizes, u)) or (fits is not None and not fits(u)):
            continue
        size = math.prod(u)
        if inner is not None and size * inner <= SMALL:
            if small is None or size > math.prod(small):
                small = u
        elif all(b <= REUSE * o for b, o in zip(u, own)) and (best is None or size < math.prod(best)):
            best = u
    pick = small or best
    if pick is not None:
        if pick != own:
            bump("reused_buckets")
        return pick
    used.add(own)
    return own


def partial_dims(shape, stride, offset: int, numel: int) -> tuple:
    """The dims along which a view of `shape`/`stride` at `offset` is a prefix of a bigger dim
    of its storage (of `numel` elements): the next outer dim (of size above 1) steps over more
    than its extent, or, outermost, the storage goes on past it. A preallocated buffer sliced
    to each step's sizes is such a view; its sizes vary from its first call."""
    out = []
    for d, n in enumerate(shape):
        if n <= 1 or stride[d] <= 0:
            continue
        outer = next((stride[j] for j in range(d - 1, -1, -1) if shape[j] > 1), None)
        if outer is None:
            last = offset + sum((m - 1) * st for m, st in zip(shape, stride))
            if last + stride[d] < numel:
                out.append(d)
        elif outer > n * stride[d]:
            out.append(d)
    return tuple(out)


def _eligible(low) -> bool:
    ok = _eligible_ops.get(low.name)
    if ok is None:
        functional = low.functional or low
        ok = _eligible_ops[low.name] = functional.name in _POSITIONAL or isinstance(
            rules.rule_for(functional.name, low.fn), rules.Pointwise)
    return ok


def _partial_target(low, flat, pos, kw):
    """The index of the leaf an in-place call writes when it is a part of its storage of the
    storage's own dtype (what plan() may bucket), else None."""
    if not _eligible(low):
        return None
    targets, single = target_specs(low, pos, kw)
    if not single or not targets or targets[0] is None or targets[0][0] != TENSOR:
        return None
    ti = targets[0][1]
    lt = flat.leaves[ti]
    entry = flat.entries[lt.slot]
    n = math.prod(lt.shape)
    if n == 0 or n >= entry.numel or entry.dtype != lt.dtype:
        return None  # a whole tensor, or a view of another dtype
    return ti


def plan(low, flat, pos, kw):
    """(bucketed leaves, spec for op_program.build, true sizes, (Bucketed's offset bounds, the
    signature's history entry)) for an in-place call over a view whose extent varies, else
    None (the call runs on its exact shapes)."""
    if not AFTER:
        return None
    ti = _partial_target(low, flat, pos, kw)
    if ti is None:
        return None
    leaves = flat.leaves
    shape = leaves[ti].shape
    skey = (low.name, pos, kw, tuple([(lf.slot, len(lf.shape), lf.dtype, lf.flags, lf.offset is None)
                                      for lf in leaves]))
    dims = varying(_history, skey, shape, lambda: _early(flat, ti, shape))
    if dims is None:
        return None
    # a varying dim at size 1 here runs at that size (a size-1 dim's stride is not in its
    # leaf): one decode row of a mask whose key length varies is bucketed along the keys
    # nor one whose own bucket leaves the storage (a buffer's 7 rows of which 1, then 7, are
    # written): the others still bucket
    dims = sorted(d for d in dims if shape[d] > 1 and _window(flat, ti, shape, [d], [bucket(shape[d])]) is not None)
    if not dims:
        return None
    sizes = [shape[d] for d in dims]
    windows: dict = {}  # bucket tuple -> its window (each made once per call)

    def window(u):
        if u not in windows:
            windows[u] = _window(flat, ti, shape, dims, u)
        return windows[u]

    chosen = buckets(_history, skey, sizes, lambda u: _fits(window(u)), math.prod(shape) // math.prod(sizes))
    done = window(chosen)
    if done is None:
        return None
    bump("bucketed_view_ops")
    new, pads, fits = done
    return new, (ti, tuple(pads), tuple(fits), len(sizes)), sizes, (_bounds(flat, new, pads, fits), _history[skey])


class Bucketed:
    """What a call's quick key finds once plan() bucketed it, so that later calls of one shape
    skip the flattening and planning that decided it (a mask sliced from a preallocated
    buffer: 60-90 us a call in strict, 15 for a whole tensor): the program, the true sizes
    that ride after its offsets, and what plan() would decide differently on:

    - the offsets: the quick key holds every size, stride and storage size plan() read, but
      not the runtime offsets; per leaf whose window was read as stored (`fit`), the largest
      offset that keeps it inside its storage (past it, a clamped read: another program);
    - the signature's history: a dim found to vary since, or a bucket tuple run at since
      (buckets() may then pick another: the largest for a small window, which keeps a deferred
      region's ops the same from step to step)."""

    __slots__ = ("compiled", "sizes", "bounds", "seen", "marks")
    hit = rec = None  # csrc/hit.cpp's fast() finds no plan here: executor.resume serves it

    def __init__(self, compiled, sizes, planned):
        self.compiled, self.sizes = compiled, tuple(sizes)
        self.bounds, self.seen = planned
        self.marks = (len(self.seen[2]), len(self.seen[3]))

    def fits(self, offsets) -> bool:
        """Whether this call plans as the one it was made for did (else the full path plans it)."""
        seen = self.seen
        return (len(seen[2]), len(seen[3])) == self.marks and all(offsets[i] <= top for i, top in self.bounds)


def _bounds(flat, new, pads, fits) -> tuple:
    """((index in flat.offsets, largest offset), ...) for Bucketed.fits."""
    out, k = [], 0
    for lf, grown, pad, fit in zip(flat.leaves, new, pads, fits):
        if lf.offset is not None:
            continue  # a static offset: in the quick key
        if pad and fit:
            out.append((k, flat.entries[lf.slot].numel - geometry.extent_of(grown.shape, lf.stride)))
        k += 1
    return tuple(out)


def _overlaps(shape, stride) -> bool:
    """Whether two positions of a view of `shape`/`stride` may share an element: each dim's
    extent must stay below the next bigger stride (the sufficient test, dims of size 1 aside)."""
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1)
    return any(n * st > nxt for (st, n), (nxt, _) in zip(dims, dims[1:]))


def _fits(window) -> bool:
    """Whether every leaf of a window plan() made lies inside its own storage: a bucket reused
    past a padded source's room (eager/dynamism._vary_source) would key its program by the
    pair of the two."""
    return window is not None and all(window[2])


def _early(flat, ti, shape) -> tuple:
    """The dims of the written view bucketed from its first call: those along which it is a
    prefix of its storage (partial_dims) with room for its bucket there."""
    lf = flat.leaves[ti]
    if lf.offset is None:
        off = (flat.offsets or ())[sum(1 for x in flat.leaves[:ti] if x.offset is None)]
    else:
        off = lf.offset
    dims = partial_dims(shape, lf.stride, off, flat.entries[lf.slot].numel)
    return tuple(d for d in dims if _window(flat, ti, shape, [d], [bucket(shape[d])]) is not None)


def _window(flat, ti, shape, dims, chosen):
    """(leaves over the bucket window, their pads, whether each fits its storage) for an
    in-place call writing leaf `ti` of `shape`, its `dims` padded to `chosen`; None when the
    window would leave the written storage, or an operand's varying dim cannot be padded."""
    leaves = flat.leaves
    offsets = iter(flat.offsets or ())
    new, pads, fits = [], [], []
    for i, lf in enumerate(leaves):
        off = lf.offset if lf.offset is not None else next(offsets)
        lead = len(shape) - len(lf.shape)
        mine = []
        grown = list(lf.shape)
        for j, d in enumerate(dims):
            e = d - lead
            if i != ti and (e < 0 or lf.shape[e] == 1):
                continue  # broadcast along the varying dim
            if lf.shape[e] != shape[d] or lf.stride[e] == 0:
                return None
            grown[e] = chosen[j]
            mine.append((e, j))
        if not mine:
            new.append(lf)
            pads.append(())
            fits.append(True)
            continue
        e_ = flat.entries[lf.slot]
        fit = (e_.dtype == lf.dtype and all(s >= 0 for s in lf.stride)
               and off + geometry.extent_of(grown, lf.stride) <= e_.numel)
        if not fit and (i == ti or math.prod(lf.shape) >= e_.numel):
            # the window would leave the written storage; or the operand is a whole tensor,
            # whose storage's size is in the program's signature anyway
            return None
        if i == ti and _overlaps(grown, lf.stride):
            return None  # its padding would land on its own true positions (a transposed block)
        new.append(lf._replace(shape=tuple(grown)))
        pads.append(tuple(mine))
        fits.append(fit)
    return new, pads, fits


# ---- inside the op's trace ------------------------------------------------------------------


def _mask(shape, pads, sizes):
    m = None
    for e, j in pads:
        mj = lax.broadcasted_iota(jnp.int32, shape, e) < sizes[j]
        m = mj if m is None else m & mj
    return m


def read(bufs, lf, offset, pads, fit, sizes):
    """(the leaf's window with its padding zeroed, the window as stored, the true extent's
    mask); the last two None for a leaf with no varying dim."""
    if not pads:
        return _leaf.read(bufs, lf, offset), None, None
    raw = _leaf.read(bufs, lf, offset) if fit else _leaf.read(bufs, lf, offset, clamped=True)
    m = _mask(lf.shape, pads, sizes)
    return jnp.where(m, raw, jnp.zeros((), raw.dtype)), raw, m
