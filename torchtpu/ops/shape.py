"""Shape ops that copy: cat, flip, roll, repeat, pad, triangular masks."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.jaxenv import to_jax_dtype, to_torch_dtype
from ._common import wrap_dim as _wrap
from . import casts
from .registry import lower


# --- cat -------------------------------------------------------------------


@lower("cat")
def cat(tensors, dim=0):
    if not tensors:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    dt = functools.reduce(torch.promote_types, [to_torch_dtype(t.dtype) for t in tensors])
    dt = to_jax_dtype(dt)
    # legacy behaviour: 1-D empty tensors are skipped whatever the other shapes
    keep = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not keep:
        return jnp.zeros((0,), dt)
    ref = keep[0]
    if ref.ndim == 0:
        raise RuntimeError("zero-dimensional tensor (at position 0) cannot be concatenated")
    dim = _wrap(dim, ref.ndim)
    for i, t in enumerate(keep):
        if t.ndim != ref.ndim:
            raise RuntimeError(
                f"Tensors must have same number of dimensions: got {ref.ndim} and {t.ndim}"
            )
        for d in range(ref.ndim):
            if d != dim and t.shape[d] != ref.shape[d]:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {dim}. Expected size "
                    f"{ref.shape[d]} but got size {t.shape[d]} for tensor number {i} in the list."
                )
    parts = [casts.cast(t, dt) for t in keep]
    if dt in casts.FLOAT8:  # XLA:CPU's concatenate rewrites e5m2 NaN payloads; CPU's moves bytes
        return casts.as_bytes(jnp.concatenate([casts.as_bytes(p) for p in parts], axis=dim), dt)
    return jnp.concatenate(parts, axis=dim)


# --- flip / roll / repeat / triangles --------------------------------------


@lower("flip")
def flip(self, dims):
    if self.ndim == 0:
        return self
    dims = tuple(_wrap(d, self.ndim) for d in dims)
    if len(set(dims)) != len(dims):
        raise RuntimeError("dims has duplicates")
    return jnp.flip(self, dims) if dims else self


@lower("roll")
def roll(self, shifts, dims=()):
    shifts, dims = list(shifts), list(dims)
    if not dims:
        if len(shifts) != 1:
            raise RuntimeError(f"`shifts` required to be of size 1 when dims is empty, got {len(shifts)}")
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    dims = [_wrap(d, self.ndim) for d in dims]
    if self.ndim == 0:
        return self
    return jnp.roll(self, shifts, dims)


@lower("repeat")
def repeat(self, repeats):
    repeats = tuple(repeats)
    if len(repeats) < self.ndim:
        raise RuntimeError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor"
        )
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    if any(r == 0 for r in repeats) or x.size == 0:
        return jnp.zeros(tuple(s * r for s, r in zip(x.shape, repeats)), self.dtype)
    return jnp.tile(x, repeats)


def _triangle(x, diagonal, upper: bool, op: str):
    if x.ndim < 2:
        raise RuntimeError(f"{op}: input tensor must have at least 2 dimensions")
    # the diagonal is a runtime value: a causal mask rebuilt each step with an offset that
    # moves (kv - q + 1) compiles once, not once per offset
    rows = lax.broadcasted_iota(jnp.int64, x.shape[-2:], 0)
    cols = lax.broadcasted_iota(jnp.int64, x.shape[-2:], 1)
    d = jnp.asarray(diagonal, jnp.int64)
    keep = cols - rows >= d if upper else cols - rows <= d
    return jnp.where(keep, x, jnp.zeros((), x.dtype))


@lower("tril", dynamic=("diagonal",))
def tril(self, diagonal=0):
    return _triangle(self, diagonal, False, "tril")


@lower("triu", dynamic=("diagonal",))
def triu(self, diagonal=0):
    return _triangle(self, diagonal, True, "triu")


# --- padding ---------------------------------------------------------------


@lower("constant_pad_nd")
def constant_pad_nd(self, pad, value=0):
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        raise RuntimeError(
            f"Length of pad must be even but instead it equals {len(pad)}"
            if len(pad) % 2 else
            "Length of pad should be no more than twice the number of dimensions of the input."
        )
    cfg = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        d = self.ndim - 1 - i
        cfg[d] = (pad[2 * i], pad[2 * i + 1], 0)
    for d, (lo, hi, _) in enumerate(cfg):
        if self.shape[d] + lo + hi < 0:
            raise RuntimeError(
                f"The input size {self.shape[d]}, plus negative padding {lo} and {hi} resulted in a "
                f"negative output size, which is invalid. Check dimension {d} of your input."
            )
    if self.dtype == jnp.bool_:
        v = jnp.asarray(value) != 0
    else:
        v = jnp.asarray(value).astype(self.dtype)
    if self.size == 0:
        shape = tuple(s + lo + hi for s, (lo, hi, _) in zip(self.shape, cfg))
        return jnp.full(shape, v, self.dtype)
    return lax.pad(self, v, cfg)


def _pad_mode(self, padding, mode, nspatial):
    padding = list(padding)
    cfg = [(0, 0)] * self.ndim
    for i in range(nspatial):
        d = self.ndim - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        if mode == "reflect" and (lo >= self.shape[d] or hi >= self.shape[d]):
            raise RuntimeError(
                f"Argument #4: Padding size should be less than the corresponding input dimension, "
                f"but got: padding ({lo}, {hi}) at dimension {d} of input {list(self.shape)}"
            )
        cfg[d] = (lo, hi)
    x = jnp.pad(self, [(max(lo, 0), max(hi, 0)) for lo, hi in cfg], mode=mode)
    # negative pads crop
    out = []
    for d, (lo, hi) in enumerate(cfg):
        n = x.shape[d]
        out.append(slice(max(-lo, 0), n - max(-hi, 0)))
    return x[tuple(out)]


def _pad_fn(mode, nspatial):
    def fwd(self, padding):
        if self.ndim not in (nspatial + 1, nspatial + 2):
            raise RuntimeError(
                f"Expected {nspatial + 1}D or {nspatial + 2}D (batch mode) tensor with possibly 0 batch size "
                f"and other non-zero dimensions for input, but got: {list(self.shape)}"
            )
        return _pad_mode(self, padding, mode, nspatial)

    def bwd(grad_output, self, padding):
        _, vjp = jax.vjp(lambda x: _pad_mode(x, padding, mode, nspatial), self)
        return vjp(grad_output.astype(self.dtype))[0]

    return fwd, bwd


for _n in (1, 2, 3):
    _f, _b = _pad_fn("reflect", _n)
    lower(f"reflection_pad{_n}d")(_f)
    lower(f"reflection_pad{_n}d_backward")(_b)
    _f, _b = _pad_fn("edge", _n)
    lower(f"replication_pad{_n}d")(_f)
    lower(f"replication_pad{_n}d_backward")(_b)


# --- copies of views -------------------------------------------------------


@lower("narrow_copy")
def narrow_copy(self, dim, start, length):
    # narrow's own checks and messages, as devices other than CPU give them (CPU's
    # narrow_copy kernel has its own, internal ones): on a meta stand-in
    torch.empty(self.shape, device="meta").narrow(dim, start, length)
    dim = _wrap(dim, self.ndim)
    if start < 0:
        start += self.shape[dim]
    return lax.slice_in_dim(self, start, start + length, axis=dim)


@lower("expand_copy")
def expand_copy(self, size, *, implicit=False):
    size = list(size)
    lead = len(size) - self.ndim
    shape = [self.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size)]
    return jnp.broadcast_to(self, tuple(shape))


@lower("permute_copy")
def permute_copy(self, dims):
    return jnp.transpose(self, [_wrap(d, self.ndim) for d in dims]) if self.ndim else self


@lower("t_copy")
def t_copy(self):
    return self.T if self.ndim == 2 else self


@lower("transpose_copy.int")
def transpose_copy(self, dim0, dim1):
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, _wrap(dim0, self.ndim), _wrap(dim1, self.ndim))


# --- scatters into views (functional): out = self with a view of it replaced by src ------------
# Lowered here rather than left to their CompositeExplicitAutograd kernels: those clone `self`
# through `clone_preserve_strides`, which sizes the clone by the storage's nbytes -- zero for a
# tpu storage (its data lives in the jax buffer), so the clone came out empty.


def _check_src(src, want, op):
    if tuple(src.shape) != tuple(want):
        raise RuntimeError(f"{op}: expected src to have a size equal to the slice of self. "
                           f"src size = {list(src.shape)}, slice size = {list(want)}")


@lower("select_scatter")
def select_scatter(self, src, dim, index):
    if self.ndim == 0:
        raise IndexError("select_scatter(): cannot be applied to a 0-dim tensor.")
    dim = _wrap(dim, self.ndim)
    n = self.shape[dim]
    if not -n <= index < n:
        raise IndexError(f"select_scatter(): index {index} out of range for tensor of size "
                         f"{list(self.shape)} at dimension {dim}")
    index = index + n if index < 0 else index
    _check_src(src, self.shape[:dim] + self.shape[dim + 1:], "select_scatter")
    return self.at[(slice(None),) * dim + (index,)].set(src.astype(self.dtype))


def _slice_index(shape, dim, start, end, step, op):
    """The index of `aten.slice(dim, start, end, step)` over `shape` (PyTorch's clamping)."""
    if not shape:
        raise IndexError(f"{op}(): cannot be applied to a 0-dim tensor.")
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    dim = _wrap(dim, len(shape))
    n = shape[dim]
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return (slice(None),) * dim + (slice(start, end, step),)


@lower("slice_scatter")
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    idx = _slice_index(self.shape, dim, start, end, step, "slice_scatter")
    _check_src(src, self[idx].shape, "slice_scatter")
    return self.at[idx].set(src.astype(self.dtype))


@lower("slice_backward")
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    # One program where PyTorch's composite is two (zeros, then copy_ into the slice); with the
    # sizes a rule can bucket (ops/dynamism.py SliceBackward: rotate_half's backward per length).
    base = jnp.zeros(tuple(input_sizes), grad_output.dtype)
    idx = _slice_index(base.shape, dim, start, end, step, "slice_backward")
    # copy_'s broadcast of the gradient; a shape it cannot broadcast is refused by CPU's own
    # checks before any program is built (the executor's argcheck, once per signature)
    return base.at[idx].set(jnp.broadcast_to(grad_output, base[idx].shape))


@lower("diagonal_scatter")
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _wrap(dim1, self.ndim), _wrap(dim2, self.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n1, n2 = self.shape[d1], self.shape[d2]
    if offset >= 0:
        length = max(0, min(n1, n2 - offset))
        rows, cols = jnp.arange(length), jnp.arange(length) + offset
    else:
        length = max(0, min(n1 + offset, n2))
        rows, cols = jnp.arange(length) - offset, jnp.arange(length)
    moved = jnp.moveaxis(self, (d1, d2), (-2, -1))
    _check_src(src, moved.shape[:-2] + (length,), "diagonal_scatter")
    if length == 0:
        return self
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lower("as_strided_scatter")
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    # The view's geometry addresses `self`'s elements in row-major order (exact for a contiguous
    # `self`, which is how the functional op is used: on a fresh clone of a base).
    from ..runtime import geometry

    size, stride = tuple(size), tuple(stride)
    offset = 0 if storage_offset is None else storage_offset
    _check_src(src, size, "as_strided_scatter")
    if len(size) != len(stride):
        raise RuntimeError(f"mismatch in length of strides and shape: {list(size)} vs {list(stride)}")
    numel = 1
    for s in self.shape:
        numel *= s
    if all(s > 0 for s in size):
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        if offset < 0 or last >= numel:
            item = jnp.dtype(self.dtype).itemsize  # CPU's message (setStorage), in bytes
            raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
                               f"and itemsize {item} requiring a storage size of {(last + 1) * item} are out of "
                               f"bounds for storage of size {numel * item}")
    flat = geometry.write(self.reshape(-1), src.astype(self.dtype), size, stride, offset)
    return flat.reshape(self.shape)
