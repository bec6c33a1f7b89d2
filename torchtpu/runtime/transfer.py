"""Host <-> device transfers and reading a tensor's value out of its storage."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import metrics
from . import geometry, leaf, pending, storage
from .jaxenv import device, numpy_to_torch, to_jax_dtype, torch_to_numpy


@functools.partial(jax.jit, static_argnums=(1,))
def _read_static(buf, lf):
    return leaf.read((buf,), lf)


@functools.partial(jax.jit, static_argnums=(1,))
def _read_at(buf, lf, offset):
    return leaf.read((buf,), lf, offset)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros(numel, dtype):
    return jnp.zeros((numel,), dtype)


def buffer(entry: storage.Entry):
    """The storage's concrete buffer: materializes a deferred value, zeros if never written."""
    b = entry.buf
    if b is None:
        entry.buf = b = _zeros(entry.numel, entry.dtype)
    elif not isinstance(b, jax.Array):
        b = pending.concrete(entry, "host_read")
    return b


def value(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a jax.Array of its shape (a gather for strided views)."""
    entry = storage.lookup(t)
    buf = buffer(entry)
    lf = leaf.leaf_of(t, 0, offsets := [])
    if offsets:  # a nonzero offset is a runtime argument (one program for all rows)
        return _read_at(buf, lf, np.int64(offsets[0]))
    if not lf.flags and math.prod(lf.shape) == entry.numel and lf.dtype == entry.dtype \
            and geometry.is_contiguous(lf.shape, lf.stride):
        return buf.reshape(lf.shape)
    return _read_static(buf, lf)


def _host_value(t: torch.Tensor) -> np.ndarray:
    """The tensor's value on the host. Cut out of its storage buffer on the host when the
    buffer is not much bigger than the tensor: any device-side op (even a reshape) would
    queue behind every program already dispatched, so reading a loss after launching the
    backward and optimizer programs would wait for them all; the buffer itself is ready as
    soon as the program that wrote it is done."""
    entry = storage.lookup(t)
    dt = to_jax_dtype(t.dtype)
    numel = math.prod(t.shape)
    if dt == entry.dtype and not leaf.flags_of(t) \
            and entry.numel <= max(4 * numel, 1 << 16):
        flat = np.asarray(buffer(entry))
        if numel == entry.numel and geometry.is_contiguous(tuple(t.shape), t.stride()):
            return flat.reshape(t.shape)
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat[t.storage_offset():] if numel else flat, shape=tuple(t.shape),
            strides=tuple(s * item for s in t.stride()), writeable=False)
        return np.ascontiguousarray(view)
    return np.asarray(value(t))


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A new CPU tensor holding a tpu tensor's value (blocks until it is computed).
    A host read is where device-side check failures surface (runtime/checks.py)."""
    from . import checks

    a = _host_value(t)  # (runs the deferred region that computes it, if any)
    if checks._pending or checks._tripped:
        checks.raise_pending()
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", a.nbytes)
    return numpy_to_torch(a).reshape(t.shape)


def to_device_array(t: torch.Tensor) -> jax.Array:
    """A CPU tensor's value on the device (same shape and dtype)."""
    a = torch_to_numpy(t)  # a private copy: XLA:CPU may alias it rather than copy
    metrics.bump("transfers_to_device")
    metrics.bump("bytes_to_device", a.nbytes)
    return jax.device_put(a, device())


def storage_to_host(entry: storage.Entry) -> np.ndarray:
    """A storage's bytes on the host, as a flat uint8 array (blocks until computed)."""
    a = np.asarray(buffer(entry)).reshape(-1)
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", a.nbytes)
    return a.view(np.uint8)


def bytes_to_device(data: np.ndarray, dtype) -> jax.Array:
    """Host bytes (flat uint8, length a multiple of dtype's size) as a device buffer of dtype."""
    a = np.array(data, dtype=np.uint8, copy=True).view(dtype)  # private copy: XLA:CPU may alias
    metrics.bump("transfers_to_device")
    metrics.bump("bytes_to_device", a.nbytes)
    return jax.device_put(a, device())
