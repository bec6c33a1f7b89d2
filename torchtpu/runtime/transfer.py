"""Host <-> device transfers and reading a tensor's value out of its storage."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import metrics
from . import geometry, storage
from .jaxenv import device, numpy_to_torch, to_jax_dtype, torch_to_numpy


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _read(buf, shape, stride, offset, dtype):
    return geometry.read(buf, shape, stride, offset, dtype)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros(numel, dtype):
    return jnp.zeros((numel,), dtype)


def buffer(entry: storage.Entry):
    """The storage's concrete buffer: materializes a deferred value, zeros if never written."""
    b = entry.buf
    if b is None:
        entry.buf = b = _zeros(entry.numel, entry.dtype)
    elif not isinstance(b, jax.Array):
        from ..eager import deferred

        if type(b) is deferred.Pending:
            deferred.flush("host_read")
            b = entry.buf
        elif type(b) is deferred.Failed:
            b.raise_()
    return b


def value(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a jax.Array of its shape (a gather for strided views)."""
    entry = storage.lookup(t)
    shape = tuple(t.shape)
    dt = to_jax_dtype(t.dtype)
    buf = buffer(entry)
    if dt.kind == "c" and (t.is_conj() or t.is_neg()):
        x = _read(buf, shape, tuple(t.stride()), t.storage_offset(), dt)
        x = jnp.conj(x) if t.is_conj() else x
        return -x if t.is_neg() else x
    if (
        t.storage_offset() == 0
        and math.prod(shape) == entry.numel
        and dt == entry.dtype
        and geometry.is_contiguous(shape, t.stride())
    ):
        return buf.reshape(shape)
    return _read(buf, shape, tuple(t.stride()), t.storage_offset(), dt)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A new CPU tensor holding a tpu tensor's value (blocks until it is computed)."""
    a = np.asarray(value(t))
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", a.nbytes)
    return numpy_to_torch(a).reshape(t.shape)


def to_device_array(t: torch.Tensor) -> jax.Array:
    """A CPU tensor's value on the device (same shape and dtype)."""
    a = torch_to_numpy(t)  # a private copy: XLA:CPU may alias it rather than copy
    metrics.bump("transfers_to_device")
    metrics.bump("bytes_to_device", a.nbytes)
    return jax.device_put(a, device())
