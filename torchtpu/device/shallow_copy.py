"""`module.to("tpu")` keeps its Parameter objects, as `module.to("cuda")` does.

`nn.Module._apply` moves a parameter in place (`param.data = moved`, the same Python object,
its hooks, `.grad` and every reference held to it) only when
`torch._has_compatible_shallow_copy_type(param, moved)` is true, and `variable.data = t` checks
the same op. Its default answer asks whether both tensors are dense on one of the backends
PyTorch lists in C++ (CPU, CUDA, XPU, ...), and PrivateUse1 is not among them: without this,
every move to or from tpu made new Parameters, and a reference held across the move (an
optimizer built first, a saved weight, a hook's closure) went stale with no error.

The op dispatches on both tensors' keys, so a kernel under AutogradPrivateUse1 answers every
pair that has a tpu tensor in it; pairs without one keep PyTorch's answer."""
from __future__ import annotations

import torch

# the strided backends a tpu tensor shares its TensorImpl layout with (PyTorch's dense list)
_DENSE = frozenset({"cpu", "tpu", "cuda", "xpu", "mps", "hpu", "mtia"})


def compatible(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether `self` may take `other`'s storage and geometry in place (`self.data = other`)."""
    if self.layout != torch.strided or other.layout != torch.strided:
        return self.layout == other.layout and self.device.type == other.device.type
    return self.device.type in _DENSE and other.device.type in _DENSE


_lib = None


def install() -> None:
    global _lib
    if _lib is None:
        _lib = torch.library.Library("aten", "IMPL")
        _lib.impl("_has_compatible_shallow_copy_type", compatible, "AutogradPrivateUse1")
