"""What a program is compiled for: one call signature type, shared by every executor.

A strict op, a traced higher-order op (torch.cond, while_loop) and a recorded collective
each compile one program per Signature; the executable caches (runtime/executables.py)
are keyed by it, and the compile-storm guards (eager/op_program.fast_compile,
eager/deferred's churn guard) count the distinct signatures of one shape-free form.
It is a tuple, so it hashes and compares as fast as one, with named fields so no reader
slices it by position.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Signature(NamedTuple):
    op: str              # the op's name ("mul.Tensor", "higher_order.cond", "c10d.all_reduce")
    mode: str            # "functional" | "inplace" (the program writes storages)
    pos: Any             # the positional arguments, encoded (eager/op_args.py) or the op's own form
    kw: tuple            # (name, encoded) of the keyword arguments
    leaves: tuple        # runtime/leaf.Leaf per tensor: slot, shape, strides, offset, dtype
    specs: tuple         # (numel, buffer dtype) per storage
    inited: tuple        # per storage, whether it was ever written (else zeros are made inside)
    context: tuple = ()  # what else decides the program: check flag, default dtype, bucketing

    def shape_free(self) -> tuple:
        """The signature without sizes, strides and offsets: calls of one op that differ only
        in geometry share it (a growing KV cache gives one shape-free form many signatures)."""
        return (self.op, self.mode, self.pos, self.kw,
                tuple([(lf.slot, len(lf.shape), lf.dtype, lf.flags) for lf in self.leaves]),
                tuple([sp[1] for sp in self.specs]), self.inited, self.context)


class NodeOp:
    """The op identity a recorded node needs when it is not an ATen op's Lowering (a traced
    higher-order op, a collective): what eager/recordable.RecordedOp reads."""

    __slots__ = ("name", "mode", "random")

    def __init__(self, name: str, mode: str = "functional", random: bool = False):
        self.name = name
        self.mode = mode
        self.random = random

    def __repr__(self) -> str:
        return f"NodeOp({self.name!r}, {self.mode!r}, random={self.random})"
