"""Tensor type names in autograd's error messages, as PyTorch prints them for CUDA.

ATen names a tensor's type in C++ messages as backend + scalar type + "Type"
(`TensorBase::toString`); for a renamed PrivateUse1 backend the backend part is the new
name, so a tpu float tensor is "tpuFloatType". PyTorch rewrites these names into Python
ones when the exception crosses into Python ("CUDAFloatType" -> "torch.cuda.FloatTensor"),
but from a table fixed at build time that lists only CPU and CUDA (and only the Byte,
Char, Short, Int, Long, Half, Float and Double types). Neither the name's source nor the
table is reachable from Python, so the messages of the autograd engine, where users meet
these names ("one of the variables needed for gradient computation has been modified by
an inplace operation: [tpuFloatType [3]]"), are rewritten the same way on their way
out: the types CUDA's table covers become "torch.tpu.<T>Tensor" (what `t.type()` says),
the others keep ATen's name, as they do for CUDA.
"""
from __future__ import annotations

import functools
import re

import torch

_ATEN_TYPE = re.compile(r"\btpu(Byte|Char|Short|Int|Long|Half|Float|Double)Type\b")


def python_names(message: str) -> str:
    """`message` with ATen's tpu type names replaced by PyTorch's Python ones."""
    return _ATEN_TYPE.sub(lambda m: f"torch.tpu.{m.group(1)}Tensor", message)


_done = False


def install() -> None:
    """Wrap the one function torch.autograd.backward and torch.autograd.grad run the engine
    through, translating the message of an exception that carries a tpu type name."""
    global _done
    if _done:
        return
    run = torch.autograd._engine_run_backward

    @functools.wraps(run)
    def _engine_run_backward(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except RuntimeError as err:
            if err.args and isinstance(err.args[0], str) and "tpu" in err.args[0]:
                err.args = (python_names(err.args[0]),) + err.args[1:]
            raise

    torch.autograd._engine_run_backward = _engine_run_backward
    _done = True
