"""Reading and writing strided tensors out of flat storage buffers, inside a trace.

A tensor is (flat buffer, sizes, strides, offset). These functions run while a
JAX function is being traced, so the geometry is static and the common cases
(contiguous, slice, permutation, broadcast) lower to slices and transposes
rather than gathers; anything else is a gather/scatter with a constant index.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def is_contiguous(shape, strides) -> bool:
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _plan(shape, strides):
    """Split a geometry into broadcast dims and a permutation of a packed block.

    Returns (kept, perm) where `kept` are dims with nonzero stride and size > 1,
    ordered by decreasing stride, if they form a packed (contiguous) block; else None.
    """
    kept = [d for d, (s, st) in enumerate(zip(shape, strides)) if s != 1 and st != 0]
    kept.sort(key=lambda d: -strides[d])
    expected = 1
    for d in reversed(kept):
        if strides[d] != expected:
            return None
        expected *= shape[d]
    return kept


def _index(shape, strides, offset) -> np.ndarray:
    idx = np.full(tuple(shape), offset, dtype=np.int64)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[d] = size
        idx = idx + (np.arange(size, dtype=np.int64) * stride).reshape(view)
    return idx


def _bitcast(x, dtype):
    """Reinterpret a flat buffer's bytes as `dtype` (element count scales with itemsize)."""
    dtype = jnp.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype.kind == "c":  # complex storage seen as its float parts (.real/.imag views)
        parts = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).reshape(-1)
        return _bitcast(parts, dtype)
    if dtype.kind == "c":
        part = jnp.dtype(jnp.float32 if dtype == jnp.complex64 else jnp.float64)
        f = _bitcast(x, part).reshape(-1, 2)
        return lax.complex(f[:, 0], f[:, 1])
    if x.dtype == jnp.bool_:
        return _bitcast(x.astype(jnp.uint8), dtype)
    if dtype == jnp.bool_:
        return _bitcast(x, jnp.uint8).astype(jnp.bool_)
    if x.dtype.itemsize == dtype.itemsize:
        return lax.bitcast_convert_type(x, dtype)
    if x.dtype.itemsize > dtype.itemsize:
        return lax.bitcast_convert_type(x, dtype).reshape(-1)
    k = dtype.itemsize // x.dtype.itemsize
    return lax.bitcast_convert_type(x.reshape(-1, k), dtype)


def read(buf: jax.Array, shape, strides, offset: int, dtype) -> jax.Array:
    shape = tuple(shape)
    numel = int(np.prod(shape)) if shape else 1
    if numel == 0:
        return jnp.zeros(shape, dtype)
    buf = _bitcast(buf, dtype)
    if is_contiguous(shape, strides):
        if offset == 0 and numel == buf.shape[0]:
            return buf.reshape(shape)
        return lax.slice(buf, (offset,), (offset + numel,)).reshape(shape)
    kept = _plan(shape, strides)
    if kept is None:
        return buf[_index(shape, strides, offset)]
    block_shape = tuple(shape[d] for d in kept)
    block_numel = int(np.prod(block_shape)) if block_shape else 1
    block = lax.slice(buf, (offset,), (offset + block_numel,)).reshape(block_shape)
    # Put the kept dims back in their original order, then broadcast the rest.
    order = sorted(range(len(kept)), key=lambda i: kept[i])
    block = jnp.transpose(block, order) if order != list(range(len(kept))) else block
    kept_sorted = sorted(kept)
    return lax.broadcast_in_dim(block, shape, tuple(kept_sorted))


def write(buf: jax.Array, value: jax.Array, shape, strides, offset: int) -> jax.Array:
    """`buf` with the tensor at (shape, strides, offset) replaced by `value`."""
    shape = tuple(shape)
    numel = int(np.prod(shape)) if shape else 1
    if numel == 0:
        return buf
    value = jnp.broadcast_to(value, shape)
    if value.dtype != buf.dtype:  # a view with another dtype: write in its bytes
        return _bitcast(write(_bitcast(buf, value.dtype), value, shape, strides, offset), buf.dtype)
    if is_contiguous(shape, strides):
        flat = value.reshape(-1)
        if offset == 0 and numel == buf.shape[0]:
            return flat
        return lax.dynamic_update_slice(buf, flat, (offset,))
    kept = _plan(shape, strides)
    if kept is not None and all(strides[d] != 0 or shape[d] == 1 for d in range(len(shape))):
        block = jnp.transpose(value.reshape(tuple(s for s in shape)), _full_perm(shape, kept))
        block = block.reshape(-1)
        if offset == 0 and numel == buf.shape[0]:
            return block
        return lax.dynamic_update_slice(buf, block, (offset,))
    idx = _index(shape, strides, offset).reshape(-1)
    return buf.at[idx].set(value.reshape(-1))


def _full_perm(shape, kept):
    """A permutation of all dims putting size-1 dims first, then `kept` by decreasing stride."""
    ones = [d for d in range(len(shape)) if d not in kept]
    return tuple(ones + list(kept))
