"""Python scalars as runtime inputs, packed into one array per kind.

Passing each Python number to a jitted call as its own argument costs a host
transfer apiece (a fused region or an optimizer's ScalarList can carry
dozens); packing them into one array per kind costs one. Inside the program
each value is unpacked weakly typed, exactly as jax.jit treats a Python scalar,
so dtype promotion is unchanged.
"""
from __future__ import annotations

import jax
import numpy as np
from jax._src.lax.lax import _convert_element_type

from ..runtime import cache as _caches

# kind code -> (numpy dtype, weakly typed like a Python scalar of that kind)
_KINDS = {bool: (0, np.bool_, False), int: (1, np.int64, True), float: (2, np.float64, True),
          complex: (3, np.complex128, True)}
DTYPES = [np.bool_, np.int64, np.float64, np.complex128]
_WEAK = [False, True, True, True]


def layout(values) -> tuple:
    """The kind code of each value (hashable; part of a cache key)."""
    return tuple(_KINDS[type(v)][0] if type(v) in _KINDS else _kind_of(v) for v in values)


def _kind_of(v) -> int:
    for t in (bool, int, float, complex):
        if isinstance(v, t):
            return _KINDS[t][0]
    raise TypeError(f"torchtpu: cannot pass {type(v).__name__} as a runtime scalar")


# Packs repeat call after call (q/k/v cut at fixed offsets of one projection, a model's
# constant scale factor): their device arrays are kept, so a repeat costs a dict lookup,
# not a host-to-device copy with the call. Bool, int and float packs, where equal values
# are the same value: not a float zero (-0.0 == 0.0 would alias two values) or NaN (never
# equal, never found); not complex. A learning rate that changes every step is a new entry
# each step, and the dict is emptied at _EXACT_MAX.
_EXACT_MAX = 4096
_exact: dict = _caches.register("exact scalar packs", {})  # emptied at _EXACT_MAX


def pack_cached(values, codes) -> tuple | None:
    """pack() for one op's own executable: repeatable packs come from the cache."""
    if not values:
        return None
    if 3 in codes or (2 in codes and not all(v == v and v != 0 for v, c in zip(values, codes) if c == 2)):
        return pack(values, codes)
    key = (codes, tuple(values))
    got = _exact.get(key)
    if got is None:
        if len(_exact) >= _EXACT_MAX:
            _exact.clear()
        got = _exact[key] = tuple(None if a is None else jax.device_put(a) for a in pack(values, codes))
    return got


def exact_packs() -> dict:
    """pack_cached's packs by (codes, tuple(values)): csrc/hit.cpp looks a call's up there
    before calling pack_cached (emptied in place, never replaced)."""
    return _exact


def pack(values, codes) -> tuple | None:
    """One numpy array per kind (empty kinds are None). No values pack to None, not to four
    empty kinds: every call of a program passes the same structure (its layout, part of its
    key, says which), and jax.jit's dispatch walks each argument's tree on every call (four
    Nones cost ~0.2 us of a ~4.5 us op call here)."""
    if not values:
        return None
    buckets = ([], [], [], [])
    for v, c in zip(values, codes):
        buckets[c].append(v)
    return tuple(np.array(b, dtype=DTYPES[k]) if b else None for k, b in enumerate(buckets))


def unpack(packed, codes) -> list:
    """Inside a trace: the values again, in order, weakly typed where Python's are."""
    pos = [0, 0, 0, 0]
    out = []
    for c in codes:
        x = packed[c][pos[c]]
        pos[c] += 1
        out.append(_convert_element_type(x, weak_type=True) if _WEAK[c] else x)
    return out
