"""Tensors that grow by torch.cat along one dim, step after step.

Greedy decoding appends each new token to `input_ids` with torch.cat: lengths n, n+1,
n+2, ... Each length is a new shape, and every op over the sequence (the cat itself,
slicing the last token out of it) compiled one program per token, strict and
defer_and_fuse alike, even with a static KV cache.

Recognised in the runtime, not by a Transformers integration, so hand-written loops
get it too: a cat of two tensors whose first is the output of an earlier cat (the same
growth continuing) and whose dims before the cat dim are all 1 (so a prefix of a
bigger storage is still a contiguous tensor) appends into a storage of a power-of-two
capacity. The result is a contiguous tensor of its true shape over the first elements
of that storage; the append is `torchtpu::grow_append` with the position a runtime
value, so one program serves a whole bucket, and views of the result (the last
token) are keyed by the bucket's storage size with their offset a runtime value.
"""
from __future__ import annotations

import contextlib
import math
import weakref

from ..ops.registry import LOWERINGS
from ..runtime import geometry, storage, tensors

MIN_CAPACITY = 16
_grown = weakref.WeakSet()  # storage entries a cat produced: their next cat may grow
_append = None
# eager/dynamism.py plugs in here (it needs the executor, which imports this module):
# grow_dynamic(low, a, b, d, run) serves the growth of a tensor whose dims before the cat
# dim are not all 1 (a KV cache (batch, heads, length, dim) growing along length), by
# making it dynamic; on_grown(t, d, n, bucket, step) makes a bucketed result (grown by step)
# dynamic, so the ops over it (a mask's reduction, ...) are bucketed too.
grow_dynamic = None
on_grown = None


def intercept(name: str, fn) -> None:
    """Install (None: remove) the growth interceptor `name` ("grow_dynamic" or "on_grown");
    called through eager/executor.intercept, the one place interceptors are installed."""
    global grow_dynamic, on_grown
    if name == "grow_dynamic":
        grow_dynamic = fn
    elif name == "on_grown":
        on_grown = fn
    else:
        raise ValueError(f"growth.intercept: no interceptor named {name!r}")
# The bound set by growth_bound: tensors starting to grow under it pad straight to it.
bound: int | None = None


@contextlib.contextmanager
def growth_bound(upper: int | None):
    """Tensors that start growing by cat inside this block (token ids, a DynamicCache's
    K/V, an attention mask) grow within `upper` positions: they pad to `upper` at once, so
    a run within it compiles every program once, at the first steps. Process-wide."""
    global bound
    if upper is not None and (not isinstance(upper, int) or upper < 1):
        raise ValueError(f"torchtpu.growth_bound: expected a positive int or None, got {upper!r}")
    prev, bound = bound, upper
    try:
        yield
    finally:
        bound = prev


def bucket_of(n: int) -> int:
    """The positions a tensor starting to grow at size n pads to."""
    if bound is not None and n <= bound:
        return bound
    return max(MIN_CAPACITY, 1 << (n - 1).bit_length())


def mark_grown(entry) -> None:
    """A storage a growth produced: a cat appending to a tensor over it grows in place."""
    _grown.add(entry)


def _eligible(ts, dim):
    """(a, b, dim) when cat(ts, dim) can append b to a in place of a copy, else None."""
    if not isinstance(ts, (list, tuple)) or len(ts) != 2:
        return None
    a, b = ts
    nd = a.dim()
    if nd == 0 or b.dim() != nd or a.dtype != b.dtype or a.is_complex():
        return None
    if a.device.type != "tpu" or b.device.type != "tpu":
        return None
    if not -nd <= dim < nd:
        return None
    d = dim % nd
    sa, sb = a.shape, b.shape
    if sa[:d] != sb[:d] or sa[d + 1:] != sb[d + 1:]:
        return None
    return a, b, d


def cat(low, args, kwargs, run):
    """Serve aten.cat: append into a bucketed storage when the first input is growing,
    else `run` the ordinary cat (and remember its output as a tensor that may grow)."""
    ts = args[0] if args else kwargs.get("tensors")
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    got = _eligible(ts, dim)
    if got is None:
        return run(low, args, kwargs)
    a, b, d = got
    entry = storage.table.get(a.untyped_storage()._cdata)
    inner = math.prod(a.shape[d + 1:])
    if (entry is None or entry not in _grown or a.storage_offset() != 0 or not a.is_contiguous()
            or not b.is_contiguous() or inner == 0 or b.numel() == 0):
        out = run(low, args, kwargs)
        if out.device.type == "tpu":
            _grown.add(storage.lookup(out))
        return out
    if any(s != 1 for s in a.shape[:d]):  # not a prefix of a bigger storage: dynamic instead
        if grow_dynamic is None:
            return run(low, args, kwargs)
        return grow_dynamic(low, a, b, d, run)
    global _append
    if _append is None:
        _append = LOWERINGS["torchtpu::grow_append"]
    n = a.shape[d] + b.shape[d]
    capacity = bucket_of(n) * inner
    base = tensors.alias(a, (entry.numel,), (1,), 0)
    new = tensors.alias(b, (b.numel(),), (1,), b.storage_offset())
    flat = run(_append, (base, new, a.numel(), capacity), {})
    shape = tuple(a.shape[:d]) + (n,) + tuple(a.shape[d + 1:])
    out = tensors.alias(flat, shape, geometry.contiguous_strides(shape), 0)
    _grown.add(storage.lookup(out))
    if on_grown is not None:
        on_grown(out, d, n, capacity // inner, b.shape[d])
    return out
