"""The CPU fallback: any op with no tpu lowering runs on the CPU, counted and warned once.

View ops never fall back: their geometry is computed on meta tensors and the
result aliases the tpu storage, so writes through them reach the base.
With the fallback disabled (TORCHTPU_FALLBACK=0 or torchtpu.set_fallback(False))
an op with no lowering raises NotImplementedError naming the overload.
"""
from __future__ import annotations

import threading
import warnings

import torch
from torch.utils._pytree import tree_map

from .. import metrics
from ..config import startup
from ..runtime import placement, rng, storage, tensors

_state = {"enabled": startup.fallback}
_warned: set = set()
_lock = threading.Lock()


def set_enabled(enabled: bool) -> None:
    _state["enabled"] = bool(enabled)


def enabled() -> bool:
    return _state["enabled"]


def is_view_op(op: torch._ops.OpOverload) -> bool:
    rets = op._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    extent = t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    if t.numel() == 0:
        extent = t.storage_offset()
    base = torch.empty(max(extent, 0), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _meta_bits(t: torch.Tensor) -> torch.Tensor:
    """A meta stand-in carrying t's lazy conjugate/negative bits: PyTorch's view kernels read
    them (x.conj().imag is a negative view; view_as_real refuses a conjugate)."""
    m = _meta_like(t)
    if t.is_conj():
        m = m.conj()
    if t.is_neg():
        m = torch._neg_view(m)
    return m


def meta_view(op, args, kwargs):
    """Run a view op on meta stand-ins, then alias the tpu storage with the result's geometry."""
    base = next(a for a in args if isinstance(a, torch.Tensor) and a.device.type == "tpu")
    margs, mkwargs = tree_map(
        lambda a: _meta_bits(a) if isinstance(a, torch.Tensor) and a.device.type == "tpu" else a,
        (args, kwargs),
    )
    res = op(*margs, **mkwargs)

    def wrap(m):
        if isinstance(m, torch.Tensor):
            out = tensors.alias(base, m.shape, m.stride(), m.storage_offset(), m.dtype)
            if out.is_neg() != m.is_neg():
                torch._C._set_neg(out, m.is_neg())
            if out.is_conj() != m.is_conj():
                torch._C._set_conj(out, m.is_conj())
            return out
        return m

    if isinstance(res, (list, tuple)):
        return type(res)(wrap(m) for m in res)
    return wrap(res)


# In-place ops that change only a tensor's geometry: never data, never a fallback.
_INPLACE_VIEWS = {"squeeze_", "unsqueeze_", "transpose_", "t_", "as_strided_", "swapdims_", "swapaxes_"}


def is_inplace_view_op(op: torch._ops.OpOverload) -> bool:
    return op._schema.name.split("::")[-1] in _INPLACE_VIEWS


def meta_inplace_view(op, args, kwargs):
    """Apply an in-place geometry change (x.squeeze_()) computed on a meta stand-in."""
    self = args[0]
    m = _meta_like(self)
    op(m, *args[1:], **kwargs)
    tensors.set_geometry(self, self.untyped_storage(), m.shape, m.stride(), m.storage_offset())
    return self


def _check_devices(name, args, kwargs) -> int:
    """The tpu device of the call (its tensors all on it, else CUDA's error)."""
    index = placement.call_index(name, args, kwargs) if placement.spread() else 0
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor) and a.device.type not in ("tpu", "meta") and a.dim() > 0:
            raise placement.same_device_error(index, str(a.device), name)
    return index


def run_on_cpu(op: torch._ops.OpOverload, args, kwargs):
    name = str(op).removeprefix("aten.")
    if not _state["enabled"]:
        raise NotImplementedError(
            f"torchtpu: {op._schema.name}.{op._overloadname} has no tpu lowering and the CPU "
            "fallback is disabled (TORCHTPU_FALLBACK=0)"
        )
    index = _check_devices(name, args, kwargs)
    with _lock:
        first = name not in _warned
        _warned.add(name)
    if first:
        warnings.warn(
            f"torchtpu: {name} has no tpu lowering; running it on the CPU (copies in and out). "
            "See torchtpu.metrics()['fallback_ops'].",
            stacklevel=3,
        )
    metrics.fallback(name)

    def to_cpu(a):
        if isinstance(a, torch.Tensor) and a.device.type == "tpu":
            return a.cpu()
        if isinstance(a, torch.device) and a.type == "tpu":
            return torch.device("cpu")
        if isinstance(a, torch.Generator):  # a host generator drawn from the tpu one's state
            return rng.host_generator(a)
        return a

    cargs, ckwargs = tree_map(to_cpu, (args, kwargs))
    if "device" in ckwargs and ckwargs["device"] is not None:
        ckwargs["device"] = torch.device("cpu")
    res = op(*cargs, **ckwargs)

    # Mutated arguments: copy the CPU result back into the tpu tensor (resized if needed).
    schema_args = op._schema.arguments
    mutated = {}
    for i, sa in enumerate(schema_args):
        if sa.alias_info is None or not sa.alias_info.is_write:
            continue
        if sa.kwarg_only or i >= len(args):
            orig, new = kwargs.get(sa.name), ckwargs.get(sa.name)
        else:
            orig, new = args[i], cargs[i]
        if isinstance(orig, torch.Tensor) and orig.device.type == "tpu":
            if orig.shape != new.shape:
                orig.resize_(new.shape)
            orig.copy_(new)
            mutated[id(new)] = orig
        elif isinstance(orig, (list, tuple)):
            for o, n in zip(orig, new):
                if isinstance(o, torch.Tensor) and o.device.type == "tpu":
                    o.copy_(n)
                    mutated[id(n)] = o

    def back(r):
        if isinstance(r, torch.Tensor):
            if id(r) in mutated:
                return mutated[id(r)]
            return r.to(torch.device("tpu", index))
        return r

    if isinstance(res, (list, tuple)):
        return type(res)(back(r) for r in res)
    return back(res)
