"""torch._grouped_mm (F.grouped_mm): the grouped matrix product of MoE expert layers.

CPU PyTorch 2.13 runs it for float32, bfloat16 and float16 (GroupedMMUtils.h: a loop of
mm_out over the slices `offs` delimits); its Python meta kernel, which FakeTensor and so
torch.compile use, accepts bfloat16 only (it mirrors the CUDA kernel). Here:

- the lowering, one JAX function per layout: 2D x 3D and 3D x 2D are `lax.ragged_dot`
  (a native ragged matmul on TPU), 2D x 2D a `ragged_dot_general` ragged in the
  contracting dim, 3D x 3D a batched matmul;
- CPU's argument checks, in CPU's order and with its messages, on torch tensors (strides
  included), run by the eager kernel before the lowering (the lowering's "check") and by the fake
  rule torch.compile uses for tpu tensors (PyTorch's meta kernel keeps serving other
  devices);
- the backward is PyTorch's own derivative formula, which calls _grouped_mm again.

`offs[g]` ends group g, which starts where group g-1 ended. CPU's loop writes each slice
in turn with at::slice's clamping, so out-of-range or decreasing offsets are defined for
the rows some slice covers (the last write wins) and rows none covers are left
uninitialized: here every row gets its last writer's value and uncovered rows are zero.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from . import checks as _checks
from ._common import opmath_dtype as _acc
from ._common import scalar_type_name
from .linalg import TORCH_NAMES
from .registry import LOWERINGS, lower

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


# --- CPU's checks, on torch tensors ------------------------------------------------


def _strides_ok(t: torch.Tensor) -> None:
    """check_valid_strides_and_return_transposed: row- or column-major in the last two
    dims, the leading stride a multiple of 16 bytes (2.13 no longer checks the data
    pointer's alignment)."""
    alignment = 16 // t.element_size()
    sizes, strides = list(t.shape), list(t.stride())
    end = t.dim() - 1
    if strides[end - 1] == 1 and strides[end] >= max(1, sizes[end - 1]):
        if strides[end] % alignment:
            raise RuntimeError("strides should be multiple of 16 bytes")
    elif strides[end] == 1 and strides[end - 1] >= max(1, sizes[end]):
        if strides[end - 1] % alignment:
            raise RuntimeError("strides should be multiple of 16 bytes")
    else:
        raise RuntimeError(f"Invalid strides/sizes, got {strides} for strides and {sizes} for sizes")


def check(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Raise what CPU's _grouped_mm raises for these arguments (before it computes);
    return the result's shape and dtype."""
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        if m.dtype not in _FLOATS:
            raise RuntimeError(
                f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {scalar_type_name(m.dtype)}"
            )
    if mat_a.dim() not in (2, 3):
        raise RuntimeError("mat_a has to be 2 or 3d")
    if mat_b.dim() not in (2, 3):
        raise RuntimeError("mat_b has to be 2 or 3d")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if (not a2 or not b2) and mat_a.shape[-1] != mat_b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    _strides_ok(mat_a)
    _strides_ok(mat_b)
    if (offs is not None) != (a2 or b2):
        raise RuntimeError(
            "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d"
        )
    if offs is not None:
        if offs.dim() != 1:
            raise RuntimeError("offs has to be 1D")
        if offs.dtype != torch.int32:
            raise RuntimeError("Offsets have to be int32")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    dtype = mat_a.dtype if out_dtype is None else out_dtype
    if dtype != mat_a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if a2 and b2:
        shape = (offs.shape[0], mat_a.shape[0], mat_b.shape[1])
    elif a2:
        if offs.shape[0] != mat_b.shape[0]:
            raise RuntimeError("matrix batch sizes have to match")
        shape = (mat_a.shape[0], mat_b.shape[-1])
    elif b2:
        if offs.shape[0] != mat_a.shape[0]:
            raise RuntimeError("matrix batch sizes have to match")
        shape = (mat_a.shape[1], mat_b.shape[1])
    else:
        if mat_a.shape[0] != mat_b.shape[0]:
            raise RuntimeError("batched dimension has to match")
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1])
    # the product itself: mm_out per group (bmm_out for 3D x 3D) rejects mixed dtypes
    if mat_a.dtype != mat_b.dtype and (offs is None or offs.shape[0] > 0):
        if not a2 and not b2:
            raise RuntimeError(
                f"expected scalar type {scalar_type_name(mat_a.dtype)} but found {scalar_type_name(mat_b.dtype)}"
            )
        raise RuntimeError(
            "expected m1 and m2 to have the same dtype, but got: "
            f"{TORCH_NAMES[mat_a.dtype]} != {TORCH_NAMES[mat_b.dtype]}"
        )
    return shape, dtype


# --- the lowering -------------------------------------------------------------------


def _slices(offs, n):
    """Group g's slice [start, end) of a dim of size n, clamped as at::slice clamps."""
    ends = offs.astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])

    def norm(x):
        x = jnp.where(x < 0, x + n, x)
        return jnp.clip(x, 0, n)

    s = norm(starts)
    return s, jnp.maximum(norm(ends), s)


def _grouping(offs, n):
    """(order, sizes): a stable order of the n positions by the group that writes them last
    (uncovered positions last), and each group's count, for lax.ragged_dot."""
    g = offs.shape[0]
    s, e = _slices(offs, n)
    pos = jnp.arange(n, dtype=jnp.int32)
    cover = (pos[None, :] >= s[:, None]) & (pos[None, :] < e[:, None])  # (G, n)
    gid = jnp.max(jnp.where(cover, jnp.arange(g, dtype=jnp.int32)[:, None], -1), axis=0, initial=-1)
    key = jnp.where(gid < 0, g, gid)
    order = jnp.argsort(key, stable=True)
    sizes = jnp.sum(gid[None, :] == jnp.arange(g, dtype=jnp.int32)[:, None], axis=1).astype(jnp.int32)
    return order, sizes


def _unsort(x, order):
    return jnp.zeros_like(x).at[order].set(x)


@lower("_grouped_mm")
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    a, b = self, mat2
    acc = _acc(a.dtype)
    a2, b2 = a.ndim == 2, b.ndim == 2
    if not a2 and not b2:  # (G, M, K) x (G, K, N): a batched matmul
        return jnp.matmul(a, b, preferred_element_type=acc).astype(a.dtype)
    if offs.shape[0] == 0:
        shape = (0, a.shape[0], b.shape[1]) if a2 and b2 else ((a.shape[0], b.shape[-1]) if a2 else (a.shape[1], b.shape[1]))
        return jnp.zeros(shape, a.dtype)
    if a2 and not b2:  # (S, K) x (G, K, N), groups of rows
        order, sizes = _grouping(offs, a.shape[0])
        out = lax.ragged_dot(a[order], b, sizes, preferred_element_type=acc)
        return _unsort(out, order).astype(a.dtype)
    if b2 and not a2:  # (G, M, K) x (K, N), groups of columns: (N, K) x (G, K, M), transposed
        order, sizes = _grouping(offs, b.shape[1])
        out = lax.ragged_dot(b.T[order], jnp.swapaxes(a, 1, 2), sizes, preferred_element_type=acc)
        return _unsort(out, order).T.astype(a.dtype)
    # (M, K) x (K, N) -> (G, M, N), groups of the contracting dim (weight gradients)
    ka, kb = a.shape[1], b.shape[0]
    if ka != kb:  # each group's slice must have one length in both (mm_out raises otherwise)
        sa, ea = _slices(offs, ka)
        sb, eb = _slices(offs, kb)
        la, lb = ea - sa, eb - sb
        bad = la != lb
        m, n = a.shape[0], b.shape[1]
        _checks.report(
            bad, _checks.first(bad, la), _checks.first(bad, lb),
            message=lambda v0, v1: f"mat1 and mat2 shapes cannot be multiplied ({m}x{v0} and {v1}x{n})",
        )
        k = min(ka, kb)  # without an error every slice lies below both sizes
        a, b = a[:, :k], b[:k]
    order, sizes = _grouping(offs, a.shape[1])
    dn = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
    )
    out = lax.ragged_dot_general(a[:, order], b[order], sizes, dn, preferred_element_type=acc)
    return out.astype(a.dtype)


def _args(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    return mat_a, mat_b, offs, bias, out_dtype


def _eager_check(*args, **kwargs):
    check(*_args(*args, **kwargs))


# The eager kernel runs it on the tpu tensors before the lowering (strict or deferred).
LOWERINGS["_grouped_mm"].check = _eager_check


def _fake(fake_mode, func, *args, **kwargs):
    """torch.compile's shape rule for tpu tensors: CPU's checks, not the bfloat16-only
    meta kernel (which keeps serving every other device)."""
    mat_a = _args(*args, **kwargs)[0]
    if mat_a.device.type != "tpu":
        return NotImplemented
    shape, dtype = check(*_args(*args, **kwargs))
    with fake_mode:
        return torch.empty(shape, dtype=dtype, device=mat_a.device)


def _register_fake() -> None:
    from torch._subclasses import fake_impls

    op = torch.ops.aten._grouped_mm.default
    fake_impls.register_op_impl(lambda func: func is op)(_fake)


_register_fake()
