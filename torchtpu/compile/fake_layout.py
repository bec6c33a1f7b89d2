"""Fake tpu convolutions laid out as CPU lays them out.

torch.compile traces with fake tensors, and a compiled graph's outputs take their
fake values' strides (compile/runtime.py). PyTorch's fake convolution asks which
backend a real device would run to pick the result's layout; for a PrivateUse1
device it has no answer and says contiguous, where eager tpu convolutions (and CPU's,
eager or compiled) keep channels_last. A rule ahead of PyTorch's restrides the tpu
case's results to the format CPU's backend picks (eager/memory_format.conv_format),
so compiled and eager agree.
"""
from __future__ import annotations

import torch

from ..eager import memory_format

_aten = torch.ops.aten
_OPS = (_aten.convolution.default, _aten.convolution_backward.default)
_installed = [False]


def install() -> None:
    """Put the rule first among fake tensors' op implementations (once)."""
    if _installed[0]:
        return
    from torch._subclasses import fake_impls

    fake_impls.op_implementations_checks.insert(0, (_OPS.__contains__, _tpu_conv))
    _installed[0] = True


def _concrete(*ts) -> bool:
    return all(isinstance(n, int) for t in ts if t is not None for n in (*t.shape, *t.stride()))


def _tpu_conv(fake_mode, func, *args, **kwargs):
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.operator_schemas import normalize_function

    got = normalize_function(func, args=args, kwargs=kwargs, normalize_to_only_use_kwargs=True)
    if got is None:
        return NotImplemented
    kw = got[1]
    x, w = kw["input"], kw["weight"]
    if getattr(x, "fake_device", None) is None or x.fake_device.type != "tpu" or not _concrete(x, w):
        return NotImplemented  # PyTorch's own rule
    out = fake_impls.conv(fake_mode, func, *args, **kwargs)
    fmt = memory_format.conv_format(**kw)
    if fmt is torch.contiguous_format:
        return out

    def laid_out(t):
        if t is None or t.dim() < 3 or not _concrete(t):
            return t
        with fake_impls.in_kernel_invocation_manager(fake_mode):
            meta = torch.empty_strided(tuple(t.shape), memory_format.dense_strides(tuple(t.shape), fmt),
                                       dtype=t.dtype, device="meta")
        return FakeTensor(fake_mode, meta, t.fake_device)

    if func is _aten.convolution.default:
        return laid_out(out)
    return (laid_out(out[0]), laid_out(out[1]), out[2])
