"""Zero-copy interop between tpu tensors and JAX arrays, and DLPack both ways.

A tpu tensor's data is a flat JAX buffer (runtime/storage.py), so its JAX array is that
buffer with the tensor's geometry applied: the buffer itself, reshaped, when the tensor is
its whole storage in order; a strided read for any other view. A JAX array becomes a tpu
tensor by adopting its buffer as the new storage's. JAX arrays are immutable and a write to
a tpu tensor replaces its storage's buffer, so sharing is safe both ways: writing to the
tensor never changes an array handed out before.

DLPack: PyTorch's C++ exporter cannot see our storage (its bytes live in JAX, the
TensorImpl's storage is empty), so `Tensor.__dlpack__` / `__dlpack_device__` hand a tpu
tensor's JAX array to the consumer; everything else takes PyTorch's own path.
`torch.from_dlpack(a, device="tpu")` adopts a JAX array (or any DLPack producer JAX reads)
as a tpu tensor, and so does a plain `torch.from_dlpack(a)` of a JAX array that lives on
the accelerator behind "tpu" (TPU or GPU). On XLA:CPU a JAX array is host memory and a
plain `torch.from_dlpack` keeps PyTorch's behaviour: a CPU tensor sharing it.
"""
from __future__ import annotations

import jax
import torch

from .. import metrics
from ..runtime import jaxenv, placement, tensors, transfer


def to_jax(t: torch.Tensor) -> jax.Array:
    """The JAX array behind tpu tensor `t`, its view geometry applied (no host round trip;
    a deferred value is computed first)."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        raise TypeError(f"torchtpu.to_jax: expected a tpu tensor, got "
                        f"{t.device if isinstance(t, torch.Tensor) else type(t).__name__}")
    if t.requires_grad:
        t = t.detach()
    return transfer.value(t)


def from_jax(a) -> torch.Tensor:
    """A tpu tensor over JAX array `a`'s buffer: on the tpu device it lives on, else (another
    platform's device, or sharded) moved to the current tpu device first."""
    if not isinstance(a, jax.Array):
        raise TypeError(f"torchtpu.from_jax: expected a jax.Array, got {type(a).__name__}")
    on = a.devices()
    local = placement.devices()
    index = local.index(next(iter(on))) if len(on) == 1 and next(iter(on)) in local else None
    if index is None:
        index = placement.current()
        a = jax.device_put(a, placement.jax_device(index))
        metrics.bump("transfers_to_device")
        metrics.bump("bytes_to_device", a.nbytes)
    dtype = jaxenv.to_torch_dtype(a.dtype)
    flat = a.reshape(-1) if a.ndim != 1 else a
    with placement.at(index, "from_jax"):
        return tensors.empty(a.shape, dtype, flat)


# --- DLPack -------------------------------------------------------------------------------

_orig_dlpack = torch.Tensor.__dlpack__
_orig_dlpack_device = torch.Tensor.__dlpack_device__
_orig_from_dlpack = torch.utils.dlpack.from_dlpack
_orig_to_dlpack = torch.utils.dlpack.to_dlpack


def _jax_dlpack(self, what, fn):
    try:
        return fn(to_jax(self))
    except (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError) as err:
        if str(err).startswith("torchtpu"):
            raise
        raise BufferError(f"torchtpu: DLPack {what} of a tpu tensor ({self.device}, platform "
                          f"{jaxenv.platform()}): JAX cannot export its buffer: {err}") from err


def _dlpack(self, *args, **kwargs):
    if self.device.type == "tpu":
        return _jax_dlpack(self, "export", lambda a: a.__dlpack__(*args, **kwargs))
    return _orig_dlpack(self, *args, **kwargs)


def _dlpack_device(self):
    if self.device.type == "tpu":
        return _jax_dlpack(self, "device", lambda a: a.__dlpack_device__())
    return _orig_dlpack_device(self)


def to_dlpack(tensor):
    """torch.utils.dlpack.to_dlpack: a tpu tensor's capsule is its JAX buffer's (PyTorch's C++
    exporter would describe the tpu storage, which holds no bytes, by a null pointer)."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
        return _dlpack(tensor)
    return _orig_to_dlpack(tensor)


def _on_tpu_device(ext) -> bool:
    return isinstance(ext, jax.Array) and jaxenv.platform() != "cpu" and len(ext.devices()) == 1 \
        and next(iter(ext.devices())) in placement.devices()


def from_dlpack(ext_tensor, *, device=None, copy=None) -> torch.Tensor:
    target = torch.device(device) if device is not None else None
    if isinstance(ext_tensor, torch.Tensor) and ext_tensor.device.type == "tpu" and (
            target is None or target == ext_tensor.device or (target.type == "tpu" and target.index is None)):
        # a tpu tensor producer on its own device: a tensor sharing its storage, as CUDA's
        return ext_tensor.detach().clone() if copy else ext_tensor.detach()
    if (target is not None and target.type == "tpu") or (target is None and _on_tpu_device(ext_tensor)):
        if target is not None and target.index is not None:
            placement.index_of(target, "from_dlpack")
        if isinstance(ext_tensor, torch.Tensor) and ext_tensor.device.type == "tpu":
            return ext_tensor.detach().to(target, copy=bool(copy))  # another tpu device: a copy
        if not isinstance(ext_tensor, jax.Array) and not hasattr(ext_tensor, "__dlpack__"):
            # a raw capsule (to_dlpack's): JAX reads only producers; PyTorch reads it on the
            # host or device it describes, and the tensor moves to tpu
            return _orig_from_dlpack(ext_tensor).to(target)
        a = ext_tensor if isinstance(ext_tensor, jax.Array) else jax.dlpack.from_dlpack(ext_tensor)
        if copy:
            a = a.copy()
        if target is not None and target.index is not None and a.devices() != {placement.jax_device(target.index)}:
            a = jax.device_put(a, placement.jax_device(target.index))
        return from_jax(a)
    return _orig_from_dlpack(ext_tensor, device=device, copy=copy)


from_dlpack.__doc__ = _orig_from_dlpack.__doc__


def install() -> None:
    """Route DLPack through the JAX arrays behind tpu tensors (idempotent)."""
    if torch.Tensor.__dlpack__ is not _dlpack:
        torch.Tensor.__dlpack__ = _dlpack
        torch.Tensor.__dlpack_device__ = _dlpack_device
        torch.utils.dlpack.from_dlpack = from_dlpack
        torch.utils.dlpack.to_dlpack = to_dlpack
        torch.from_dlpack = from_dlpack
