"""Reduce kinds: torch's reduce ops as the names the collective bodies switch on.

Two spellings reach us: a `dist.ReduceOp` from a process-group call (DDP, FSDP2,
`dist.all_reduce`) and a string from a functional collective ("sum", "product", ...).
Both map to one kind per dtype, so an eager collective and the same collective in a
compiled graph or a fused region run the same body.
"""
from __future__ import annotations

import numpy as np
import torch.distributed as dist

ReduceOp = dist.ReduceOp

# dist.ReduceOp -> kind, scanned with ==: a group call's `opts.reduceOp` is a ReduceOp object,
# which compares equal to the RedOpType constant it wraps
_BY_OP = (
    (ReduceOp.SUM, "sum"), (ReduceOp.AVG, "avg"), (ReduceOp.MAX, "max"), (ReduceOp.MIN, "min"),
    (ReduceOp.PRODUCT, "prod"), (ReduceOp.BAND, "band"), (ReduceOp.BOR, "bor"), (ReduceOp.BXOR, "bxor"),
)

# the reduce-op names functional collectives (_c10d_functional) pass
_BY_NAME = {"sum": "sum", "avg": "avg", "max": "max", "min": "min", "product": "prod",
            "band": "band", "bor": "bor", "bxor": "bxor"}


def reduce_kind(op, dtype) -> str:
    """The kind of a process-group reduce op (`dist.ReduceOp`) for a JAX/numpy dtype."""
    for red, k in _BY_OP:
        if op == red:
            return for_dtype(k, dtype)
    raise ValueError(f"torchtpu.distributed: reduce op {op} is not supported")


def reduce_kind_named(name: str, dtype) -> str:
    """reduce_kind for a functional collective's reduce-op string ("sum", "product", ...)."""
    k = _BY_NAME.get(name.lower())
    if k is None:
        raise NotImplementedError(f"torchtpu.distributed: reduce op {name!r} is not supported")
    return for_dtype(k, dtype)


def for_dtype(k: str, dtype) -> str:
    # bool tensors reduce as logic: sum/avg/bor are "any", prod/band "all"
    if dtype == np.bool_:
        k = {"sum": "max", "avg": "max", "prod": "min", "band": "min", "bor": "max"}.get(k, k)
    return k
