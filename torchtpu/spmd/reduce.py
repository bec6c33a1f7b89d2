"""Reduce kinds: torch's reduce ops as the names the collective bodies switch on.

Two spellings reach us: a `dist.ReduceOp` from a process-group call (DDP, FSDP2,
`dist.all_reduce`) and a string from a functional collective ("sum", "product", ...).
Both map to one kind per dtype, so an eager collective and the same collective in a
compiled graph or a fused region run the same body. This is the one place that says
which reduce op goes with which dtype, for every collective and every path.

What NCCL (ProcessGroupNCCL) accepts is the model:
- SUM, AVG, PRODUCT, MIN, MAX on every dtype; on bool SUM is "any" (NCCL: max over
  uint8), PRODUCT and MIN "all", MAX "any", and AVG is refused (TypeError).
- AVG on integers: the sum divided by the group size, rounded toward zero (NCCL's
  FuncSumPostDiv), not floored.
- PREMUL_SUM (`dist._make_nccl_premul_sum(factor)`, FSDP2's gradient divide factor):
  each rank multiplies its input by the factor (a Python number or a one-element
  tensor, cast to the input's dtype first, as NCCL's scalar), then the products are
  summed in that dtype. Only half, bfloat16, float and double (complex as its real
  view, as ProcessGroupNCCL passes it); other dtypes are a TypeError, as there.
- complex tensors: SUM, AVG and PREMUL_SUM only (ProcessGroupNCCL views them as real).
- BAND, BOR, BXOR: NCCL refuses them outright. torchtpu reduces integer and bool
  tensors bitwise (as gloo does: no CUDA program depends on their absence) and refuses
  floating-point ones with a TypeError.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch.distributed as dist

ReduceOp = dist.ReduceOp

# dist.ReduceOp -> kind, scanned with ==: a group call's `opts.reduceOp` is a ReduceOp object,
# which compares equal to the RedOpType constant it wraps
_BY_OP = (
    (ReduceOp.SUM, "sum"), (ReduceOp.AVG, "avg"), (ReduceOp.MAX, "max"), (ReduceOp.MIN, "min"),
    (ReduceOp.PRODUCT, "prod"), (ReduceOp.BAND, "band"), (ReduceOp.BOR, "bor"), (ReduceOp.BXOR, "bxor"),
    (ReduceOp.PREMUL_SUM, "premul_sum"),
)

# the reduce-op names functional collectives (_c10d_functional) pass (they have no
# premul_sum: PyTorch's functional collectives cannot carry its factor)
_BY_NAME = {"sum": "sum", "avg": "avg", "max": "max", "min": "min", "product": "prod",
            "band": "band", "bor": "bor", "bxor": "bxor"}

# kind -> the ReduceOp name messages use
_NAMES = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "prod": "PRODUCT", "band": "BAND",
          "bor": "BOR", "bxor": "BXOR", "premul_sum": "PREMUL_SUM"}

_PREMUL_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")


def reduce_kind(op, dtype, what: str = "all_reduce") -> str:
    """The kind of a process-group reduce op (`dist.ReduceOp`) for a JAX/numpy dtype;
    `what` (the collective) names it in errors."""
    for red, k in _BY_OP:
        if op == red:
            return for_dtype(k, dtype, what)
    raise ValueError(f"torchtpu.distributed: {what}: reduce op {_op_name(op)} is not supported")


def reduce_kind_named(name: str, dtype, what: str = "all_reduce") -> str:
    """reduce_kind for a functional collective's reduce-op string ("sum", "product", ...)."""
    k = _BY_NAME.get(name.lower())
    if k is None:
        raise NotImplementedError(f"torchtpu.distributed: {what}: reduce op {name!r} is not supported")
    return for_dtype(k, dtype, what)


def _op_name(op) -> str:
    red = getattr(op, "op", op)  # a ReduceOp object wraps its RedOpType
    return f"ReduceOp.{getattr(red, 'name', red)}"


def for_dtype(k: str, dtype, what: str = "all_reduce") -> str:
    dt = np.dtype(dtype)
    name = _NAMES[k]
    if dt == np.bool_:
        if k in ("avg", "premul_sum"):
            raise TypeError(f"torchtpu.distributed: {what}: cannot use ReduceOp.{name} with boolean inputs")
        # bool tensors reduce as logic: sum/bor/max are "any", prod/band/min "all"
        return {"sum": "max", "prod": "min", "band": "min", "bor": "max"}.get(k, k)
    if k == "premul_sum" and dt.name not in _PREMUL_DTYPES:
        raise TypeError(f"torchtpu.distributed: {what}: ReduceOp.PREMUL_SUM needs a half, bfloat16, float or "
                        f"double tensor (as NCCL's), got {dt.name}")
    if dt.kind == "c" and k not in ("sum", "avg", "premul_sum"):
        raise TypeError(f"torchtpu.distributed: {what} does not support ReduceOp.{name} on complex tensors")
    if k in ("band", "bor", "bxor") and not jnp.issubdtype(dt, jnp.integer):
        raise TypeError(f"torchtpu.distributed: {what}: ReduceOp.{name} needs an integer or bool tensor, got "
                        f"{dt.name} (NCCL has no bitwise reduce ops; torchtpu has them for integers and bools)")
    return k


def premul_factor(op, what: str = "all_reduce"):
    """The factor of a PREMUL_SUM op: a Python number or a one-element tensor."""
    f = op.factor
    if hasattr(f, "numel") and f.numel() != 1:
        raise ValueError(f"torchtpu.distributed: {what}: ReduceOp.PREMUL_SUM's factor must have one element, "
                         f"got shape {tuple(f.shape)}")
    return f
