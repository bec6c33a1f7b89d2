"""The errors an op call raises, as a PyTorch user expects them."""
from __future__ import annotations

import os

from .. import ops as _ops
from ..ops.registry import Lowering
from . import argcheck
from .origin import user_frame

_OPS = os.path.dirname(os.path.abspath(_ops.__file__))  # the lowerings' folder


def describe(low: Lowering, tensors) -> str:
    """"op(shape:dtype, ...)" of a call's tensors."""
    ins = ", ".join(f"{tuple(t.shape)}:{str(t.dtype).removeprefix('torch.')}" for t in tensors)
    return f"{low.name}({ins})"


def user_error(err: BaseException, low: Lowering, tensors, args=None, kwargs=None) -> BaseException:
    """The error a PyTorch user expects: RuntimeError (as CPU/CUDA kernels raise for bad
    shapes) naming the op, its inputs and the user's line. Errors of our own kind pass.
    A lowering that fails in JAX (arguments no check caught) gets CPU's error if CPU
    rejects the same call."""
    if args is not None and not isinstance(err, (RuntimeError, NotImplementedError, IndexError)) \
            and low.own_schema:
        cpu = argcheck.cpu_error(low.overload, args, kwargs)
        if cpu is not None:
            err = cpu
    where = user_frame()
    at = f"\n  issued at {where[0]}:{where[1]} in {where[2]}" if where else ""
    if isinstance(err, (RuntimeError, NotImplementedError, FloatingPointError, IndexError)) or (
            isinstance(err, ValueError) and _raised_in_lowering(err)):
        err.add_note(f"torchtpu: while running {describe(low, tensors)}{at}")
        return err
    return RuntimeError(f"{describe(low, tensors)}: {type(err).__name__}: {err}{at}")


def _raised_in_lowering(err: BaseException) -> bool:
    """Whether `err` was raised by a lowering's own argument check (torchtpu/ops: a ValueError
    there is ATen's TORCH_CHECK_VALUE, which CPU and CUDA raise as ValueError), not by JAX."""
    tb, last = err.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    return last is not None and os.path.dirname(os.path.abspath(last)) == _OPS
