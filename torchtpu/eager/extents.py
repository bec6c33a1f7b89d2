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


def varying(history, key, shape) -> set | None:
    """The policy, for the op signature `key` (sizes left out) called at `shape`: the dims in
    which its shapes have varied, once it has seen more than AFTER distinct shapes and this
    is not its first; None while it runs exact. `history` (an LRU) keeps what it has seen."""
    seen = history.get(key)
    if seen is None:
        history[key] = [shape, {shape}, set()]
        return None
    first, shapes, dims = seen
    if shape == first:
        return None  # its exact program exists
    dims.update(d for d in range(len(shape)) if shape[d] != first[d])
    if len(shapes) <= AFTER:
        shapes.add(shape)
        if len(shapes) <= AFTER:
            return None
    return dims


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


def may_bucket(low, flat, pos, kw) -> bool:
    """Whether calls of this signature may be bucketed by plan(), now or once their shapes
    vary (the executor's quick path leaves them to the full one, which keeps the history)."""
    return _partial_target(low, flat, pos, kw) is not None


def plan(low, flat, pos, kw):
    """(bucketed leaves, spec for op_program.build, true sizes) for an in-place call over a
    view whose extent varies, else None (the call runs on its exact shapes)."""
    if not AFTER:
        return None
    ti = _partial_target(low, flat, pos, kw)
    if ti is None:
        return None
    leaves = flat.leaves
    shape = leaves[ti].shape
    skey = (low.name, pos, kw, tuple([(lf.slot, len(lf.shape), lf.dtype, lf.flags, lf.offset is None)
                                      for lf in leaves]))
    dims = varying(_history, skey, shape)
    if dims is None:
        return None
    # a varying dim at size 1 here runs at that size (a size-1 dim's stride is not in its
    # leaf): one decode row of a mask whose key length varies is bucketed along the keys
    dims = sorted(d for d in dims if shape[d] > 1)
    if not dims:
        return None
    sizes = [shape[d] for d in dims]
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
            grown[e] = bucket(shape[d])
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
        new.append(lf._replace(shape=tuple(grown)))
        pads.append(tuple(mine))
        fits.append(fit)
    bump("bucketed_view_ops")
    return new, (ti, tuple(pads), tuple(fits), len(sizes)), sizes


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
