"""The `out_dtype` higher-order op (torch.ops.higher_order.out_dtype) in compiled graphs.

`out_dtype(op, dtype, *args)` runs one ATen op (mm, linear, conv, mul, div) and returns its
result in `dtype`; torchao's int8 dynamic-activation linear layers emit
`out_dtype(aten.mm, torch.int32, int8, int8)`. PyTorch's dense implementation promotes the
inputs with `dtype` (PyTorch's DEFAULT rule), runs the op and casts the result; an int8 x int8
mm into int32 is `_int_mm`. Here: the int8 mm is one dot accumulating in int32 (exact, the
value the promoted int32 mm has), anything else the same promotion around the op's lowering.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..ops import registry
from ..ops.casts import cast
from ..ops.promotion import proxy
from ..runtime.jaxenv import to_jax_dtype

OP = torch.ops.higher_order.out_dtype


def lower(op, output_dtype, *args):
    out = to_jax_dtype(output_dtype)
    if (op is torch.ops.aten.mm.default and output_dtype == torch.int32 and len(args) == 2
            and all(getattr(a, "dtype", None) == jnp.int8 for a in args)):
        return lax.dot_general(args[0], args[1], (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.int32)
    tensors = [a for a in args if hasattr(a, "dtype") and hasattr(a, "shape")]
    comp = elementwise_dtypes(*[proxy(a) for a in tensors],
                              torch.ones(1, dtype=output_dtype, device="meta"),
                              type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[0]
    comp = to_jax_dtype(comp)
    args = [cast(a, comp) if any(a is t for t in tensors) else a for a in args]
    name = op._schema.name.split("::")[1] + ("." + op._overloadname if op._overloadname != "default" else "")
    low = registry.LOWERINGS.get(name)
    if low is None:
        raise NotImplementedError(f"torchtpu compile: out_dtype over aten::{name}, which has no lowering")
    return cast(registry.apply(low, list(args), {}), out)
