"""Tensors as the process group's programs see them: flat 1-D blocks.

A tensor enters a collective as its flat storage buffer (free when the tensor owns its
whole storage, else its value read out), and the block each rank gets back is written
into its output tensor: directly as the new storage buffer when the output owns its
whole storage, else through copy_.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import jaxenv, storage, tensors, transfer


def _owns_storage(t: torch.Tensor, entry) -> bool:
    return (
        t.storage_offset() == 0
        and t.numel() == entry.numel
        and jaxenv.to_jax_dtype(t.dtype) == entry.dtype
        and t.is_contiguous()
    )


def flat_in(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a flat 1-D array on this process's device."""
    if t.device.type == "tpu":
        entry = storage.lookup(t)
        if _owns_storage(t, entry):
            return transfer.buffer(entry)
        return transfer.value(t).reshape(-1)
    return transfer.to_device_array(t.reshape(-1))


def store(t: torch.Tensor, flat: jax.Array) -> None:
    """Write a flat result into tensor `t` (tpu or cpu), whatever its geometry."""
    if t.device.type == "tpu":
        entry = storage.lookup(t)
        if _owns_storage(t, entry):
            entry.buf = flat
        else:
            t.copy_(tensors.empty(t.shape, t.dtype, flat))
    else:
        with torch.no_grad():
            t.copy_(jaxenv.numpy_to_torch(np.asarray(flat)).reshape(t.shape))


def dtype_of(a) -> np.dtype:
    return jnp.dtype(a.dtype)


def zeros(n: int, dtype: torch.dtype) -> jax.Array:
    """A flat block of n zeros on this process's device (a receive or non-root slot)."""
    return jax.device_put(np.zeros(n, jaxenv.to_jax_dtype(dtype)), jaxenv.device())
