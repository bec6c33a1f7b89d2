"""Reading and writing strided tensors out of flat storage buffers, inside a trace.

A tensor is (flat buffer, sizes, strides, offset). These functions run while a
JAX function is being traced, so sizes and strides are static and the common cases
(contiguous, slice, permutation, broadcast) lower to slices and transposes
rather than gathers; anything else is a gather/scatter with a constant index.

The offset may be a Python int or a traced integer scalar. Executables take a
view's nonzero offset as a runtime value (`x[i] = t` for 1,000 different i, a row
loop, unbind, a KV-cache write at a moving position: one program, not one per
offset); the read is then a dynamic_slice of the same box, the write a
dynamic_update_slice.
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


def _static(offset) -> bool:
    return isinstance(offset, (int, np.integer))


def _whole(offset, numel: int, buf) -> bool:
    """The view is all of `buf` (only a static zero offset can tell at trace time)."""
    return _static(offset) and offset == 0 and numel == buf.shape[0]


def _index(shape, strides, offset) -> np.ndarray:
    idx = np.full(tuple(shape), offset if _static(offset) else 0, dtype=np.int64)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[d] = size
        idx = idx + (np.arange(size, dtype=np.int64) * stride).reshape(view)
    return idx


def bitcast(x, dtype):
    """Reinterpret a flat buffer's bytes as `dtype` (element count scales with itemsize)."""
    dtype = jnp.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype.kind == "c":  # complex storage seen as its float parts (.real/.imag views)
        parts = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).reshape(-1)
        return bitcast(parts, dtype)
    if dtype.kind == "c":
        part = jnp.dtype(jnp.float32 if dtype == jnp.complex64 else jnp.float64)
        f = bitcast(x, part).reshape(-1, 2)
        return lax.complex(f[:, 0], f[:, 1])
    if x.dtype == jnp.bool_:
        return bitcast(x.astype(jnp.uint8), dtype)
    if dtype == jnp.bool_:
        return bitcast(x, jnp.uint8).astype(jnp.bool_)
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
    buf = bitcast(buf, dtype)
    if is_contiguous(shape, strides):
        if _whole(offset, numel, buf):
            return buf.reshape(shape)
        if not _static(offset):
            return lax.dynamic_slice(buf, (offset,), (numel,)).reshape(shape)
        return lax.slice(buf, (offset,), (offset + numel,)).reshape(shape)
    box = _box(shape, strides)
    if box is None:
        idx = _index(shape, strides, offset)
        return buf[idx if _static(offset) else idx + offset]
    kept, box_shape, span = box
    region = _region(buf, offset, span, extent_of(shape, strides)).reshape(box_shape)
    sizes = tuple(shape[d] for d in kept)
    region = region[_box_index(sizes, box_shape)].reshape(sizes)
    # Put the kept dims back in their original order, then broadcast the rest.
    order = sorted(range(len(kept)), key=lambda i: kept[i])
    region = jnp.transpose(region, order) if order != list(range(len(kept))) else region
    return lax.broadcast_in_dim(region, shape, tuple(sorted(kept)))


def read_clamped(buf: jax.Array, shape, strides, offset, dtype) -> jax.Array:
    """read() of a view that may reach past the buffer's end, as a gather: positions past it
    read the last element (a bucket's padding, which the caller masks)."""
    buf = bitcast(buf, dtype)
    idx = _index(shape, strides, offset)
    return buf[jnp.clip(idx if _static(offset) else idx + offset, 0, buf.shape[0] - 1)]


def _box(shape, strides):
    """Describe a strided view as a slice of a dense box cut from the flat buffer.

    Dims with size > 1 and nonzero stride, by decreasing stride s_0 > s_1 > ...,
    with each s_{i-1} a multiple of s_i holding at least n_i steps, are the box
    (n_0, s_0/s_1, ..., s_{m-2}/s_{m-1}, s_{m-1}) over buf[offset : offset + n_0*s_0];
    the view is box[:, :n_1, ..., :n_{m-1}, 0]. Slices, strided slices, splits and
    transposes all fit; anything else returns None (a gather).
    """
    kept = [d for d in range(len(shape)) if shape[d] != 1 and strides[d] != 0]
    kept.sort(key=lambda d: -strides[d])
    if not kept:
        return (), (1,), 1
    box = [shape[kept[0]]]
    for a, b in zip(kept, kept[1:]):
        sa, sb = strides[a], strides[b]
        if sb <= 0 or sa <= 0 or sa % sb or shape[b] > sa // sb:
            return None
        box.append(sa // sb)
    box.append(strides[kept[-1]])
    if strides[kept[-1]] <= 0:
        return None
    return tuple(kept), tuple(box), shape[kept[0]] * strides[kept[0]]


def _box_index(sizes, box_shape):
    idx = [slice(None)]
    for n in sizes[1:]:
        idx.append(slice(0, n))
    idx.append(slice(0, 1))
    return tuple(idx[: len(box_shape)])


def extent_of(shape, strides) -> int:
    """Elements from a (nonempty) view's first element to its last, inclusive."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)


def _overhang(buf_len: int, offset, span: int, extent: int) -> int:
    """Zeros to append so buf[offset : offset + span] exists. A runtime offset is only
    known to keep the view itself in bounds (offset + extent <= len): pad for the worst."""
    if _static(offset):
        return max(0, offset + span - buf_len)
    return max(0, span - extent, span - buf_len)


def _region(buf, offset, span: int, extent: int):
    """buf[offset : offset + span], zero-padded past the end (the box's last row may overhang)."""
    pad = _overhang(buf.shape[0], offset, span, extent)
    if pad:
        buf = jnp.concatenate([buf, jnp.zeros((pad,), buf.dtype)])
    if _whole(offset, span, buf):
        return buf
    if not _static(offset):
        return lax.dynamic_slice(buf, (offset,), (span,))
    return lax.slice(buf, (offset,), (offset + span,))


def write(buf: jax.Array, value: jax.Array, shape, strides, offset: int) -> jax.Array:
    """`buf` with the tensor at (shape, strides, offset) replaced by `value`."""
    shape = tuple(shape)
    numel = int(np.prod(shape)) if shape else 1
    if numel == 0:
        return buf
    value = jnp.broadcast_to(value, shape)
    if value.dtype != buf.dtype:  # a view with another dtype: write in its bytes
        return bitcast(write(bitcast(buf, value.dtype), value, shape, strides, offset), buf.dtype)
    if is_contiguous(shape, strides):
        flat = value.reshape(-1)
        if _whole(offset, numel, buf):
            return flat
        return lax.dynamic_update_slice(buf, flat, (offset,))
    box = _box(shape, strides) if all(strides[d] != 0 or shape[d] == 1 for d in range(len(shape))) else None
    if box is not None:
        kept, box_shape, span = box
        sizes = tuple(shape[d] for d in kept)
        ordered = jnp.transpose(value, _full_perm(shape, kept)).reshape(sizes + (1,) * (len(box_shape) - len(sizes)))
        n = buf.shape[0]
        pad = _overhang(n, offset, span, extent_of(shape, strides))
        padded = jnp.concatenate([buf, jnp.zeros((pad,), buf.dtype)]) if pad else buf
        region = _region(padded, offset, span, span).reshape(box_shape)
        region = region.at[_box_index(sizes, box_shape)].set(ordered.reshape(_sliced(sizes, box_shape)))
        region = region.reshape(-1)
        if _whole(offset, span, padded):
            return region[:n]
        if _static(offset):  # the overhang past the end is dropped
            return lax.dynamic_update_slice(buf, region[: max(0, min(span, n - offset))], (offset,))
        return lax.dynamic_update_slice(padded, region, (offset,))[:n] if pad else \
            lax.dynamic_update_slice(buf, region, (offset,))
    idx = _index(shape, strides, offset).reshape(-1)
    return buf.at[idx if _static(offset) else idx + offset].set(value.reshape(-1))


def _sliced(sizes, box_shape):
    return tuple(sizes) + (1,) if len(box_shape) > len(sizes) else tuple(sizes)


def _full_perm(shape, kept):
    """A permutation of all dims putting size-1 dims first, then `kept` by decreasing stride."""
    ones = [d for d in range(len(shape)) if d not in kept]
    return tuple(ones + list(kept))
