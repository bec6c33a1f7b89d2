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
    # PyTorch's randn decomposes to prims.normal, which no lowering serves (the graph ran it
    # on CPU: reformer's LSH rotations); normal.float_float is the same draw, lowered.
    out[torch.ops.aten.randn.default] = _randn
    return out


def _randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.ops.aten.normal.float_float(0.0, 1.0, size, dtype=dtype, layout=layout, device=device,
                                             pin_memory=pin_memory)
