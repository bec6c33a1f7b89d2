"""Which ATen ops aot_autograd decomposes before they reach the compiler.

PyTorch's decompositions (core ATen and the rest of torch._decomp), minus every op the lowering table serves
natively (a native lowering is one XLA op or a hand-fused few; its
decomposition would be many) and minus what the compiler handles itself.
"""
from __future__ import annotations

import functools

import torch

from ..ops import registry
from . import graph


@functools.lru_cache(maxsize=1)
def table() -> dict:
    from torch._decomp import core_aten_decompositions, decomposition_table

    out = {}
    candidates = dict(decomposition_table)
    candidates.update(core_aten_decompositions())
    for op, fn in candidates.items():
        if not isinstance(op, torch._ops.OpOverload):
            continue
        name = graph.overload_name(op)
        low = registry.LOWERINGS.get(name)
        if low is not None and low.mode == "functional":
            continue
        if op in graph.SPECIAL or graph.is_view(op):
            continue
        out[op] = fn
    return out
