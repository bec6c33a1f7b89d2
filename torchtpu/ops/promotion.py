"""PyTorch's dtype promotion, applied to JAX values inside a trace.

Python scalars reach a lowering as weakly-typed 0-d JAX values (that is how they
stay runtime inputs), so their Python category (bool/int/float/complex) is read
back from the weak type, and torch._prims_common decides exactly as PyTorch does.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from torch._prims_common import elementwise_dtypes

from ..runtime.jaxenv import CARRIED_SEEN, FLOAT8 as _FLOAT8, to_jax_dtype, to_torch_dtype

_SCALAR_PROXY = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}


def is_weak(x) -> bool:
    aval = getattr(x, "aval", None)
    if aval is not None:
        return bool(getattr(aval, "weak_type", False))
    return bool(getattr(x, "weak_type", False))


def proxy(x):
    """A torch stand-in for a promotion decision: python scalar or meta tensor."""
    if isinstance(x, (bool, int, float, complex)):
        return x
    if x is None:
        return None
    if is_weak(x) and jnp.ndim(x) == 0:
        return _SCALAR_PROXY[jnp.dtype(x.dtype).kind]
    return torch.empty(tuple(jnp.shape(x)), dtype=to_torch_dtype(x.dtype), device="meta")


# Ops that only select among their inputs' values: float8 stays float8 (bits moved as they are,
# NaN payloads too), not computed in float32.
SELECTS = frozenset({"where.self"})


def result_dtypes(kind, *vals, select=False):
    """(computation dtype, result dtype) as numpy dtypes, for values in `vals`."""
    proxies = [proxy(v) for v in vals if v is not None]
    comp, res = elementwise_dtypes(*proxies, type_promotion_kind=kind)
    if res == torch.complex32:
        # float16 with a complex scalar or 0-d complex tensor: eager/carried.py serves such calls
        # (the float16 operands made complex32, the op run in complex64, rounded back as CPU
        # rounds), so a lowering never sees one; a trace that meets one anyway marks carried
        # dtypes seen (the kernel entries check every call from now on) and refuses, rather
        # than hand back the uint32 carrier as the result
        CARRIED_SEEN[0] = True
        raise TypeError("torchtpu: dtype torch.complex32 as a promoted result (float16 with a complex "
                        "scalar) reached a lowering: eager/carried.py serves these calls")
    if comp in _FLOAT8 and not select:  # c10 computes float8 arithmetic in float32, rounding once
        comp = torch.float32
    elif comp == torch.float4_e2m1fn_x2:  # CPU compares packed float4 by its bytes
        comp = torch.uint8
    return to_jax_dtype(comp), to_jax_dtype(res)


def promote(kind, *vals, select=False):
    """Cast every value to the computation dtype; returns (values, result dtype)."""
    comp, res = result_dtypes(kind, *vals, select=select)
    from .casts import cast

    return [None if v is None else cast(v, comp) for v in vals], res
