"""Matrix products, attention, embedding backward, linear algebra."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime.jaxenv import to_jax_dtype, to_torch_dtype
from .registry import Lowering, kernel, lower, overload, schema_args

HIGHEST = lax.Precision.HIGHEST
_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))

_TORCH_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
    torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
    torch.bool: "bool", torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>",
}
_PRETTY = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
    torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}


def _tname(x) -> str:
    return _TORCH_NAMES.get(to_torch_dtype(x.dtype), str(x.dtype))


def _pretty(x) -> str:
    return _PRETTY.get(to_torch_dtype(x.dtype), str(x.dtype))


def _acc(dtype):
    """Accumulation dtype: float16/bfloat16 accumulate in float32 like PyTorch CPU."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(jnp.float32) if dtype in _HALF else dtype


def _check_matmul_dtype(x, dtype_name):
    if jnp.dtype(x.dtype) == jnp.dtype(jnp.bool_):
        raise NotImplementedError(f'"{dtype_name}" not implemented for \'Bool\'')


def _matmul(a, b):
    """a @ b at full precision, accumulated (and returned) in the accumulation dtype."""
    acc = _acc(a.dtype)
    return jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=acc)


def _is_static(v):
    return isinstance(v, (bool, int, float, complex))


def _scaled_self(self, beta, shape, acc):
    """beta * self broadcast to `shape`; beta == 0 ignores self (NaN/inf included), like PyTorch."""
    s = jnp.broadcast_to(self, shape).astype(acc)
    if _is_static(beta):
        if beta == 0:
            return jnp.zeros(shape, acc)
        if beta == 1:
            return s
        return s * beta
    return jnp.where(beta == 0, jnp.zeros(shape, acc), s * beta)


def _scaled_prod(prod, alpha):
    if _is_static(alpha) and alpha == 1:
        return prod
    return prod * alpha


def _combine(self, prod, beta, alpha, out_dtype):
    acc = prod.dtype
    if jnp.dtype(out_dtype) == jnp.dtype(jnp.bool_):
        # boolean addmm-likes: beta/alpha act as logical and, + as logical or
        b = jnp.asarray(beta).astype(bool)
        a = jnp.asarray(alpha).astype(bool)
        return (jnp.broadcast_to(self, prod.shape).astype(bool) & b) | (prod.astype(bool) & a)
    if jnp.dtype(acc).kind in "iu":
        # integer addmm-likes convert beta/alpha to the integer type first (C++ truncation)
        beta = int(beta) if _is_static(beta) else jnp.asarray(beta).astype(acc)
        alpha = int(alpha) if _is_static(alpha) else jnp.asarray(alpha).astype(acc)
    return (_scaled_self(self, beta, prod.shape, acc) + _scaled_prod(prod, alpha)).astype(out_dtype)


# --- matrix products -----------------------------------------------------------


def _mm_checks(self, mat2, name="mm"):
    if self.ndim != 2:
        raise RuntimeError("self must be a matrix")
    if mat2.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied "
            f"({self.shape[0]}x{self.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})"
        )
    if self.dtype != mat2.dtype:
        raise RuntimeError(
            f"expected m1 and m2 to have the same dtype, but got: {_tname(self)} != {_tname(mat2)}"
        )
    _check_matmul_dtype(self, "addmm_impl_cpu_")


@lower("mm")
def mm(self, mat2):
    _mm_checks(self, mat2)
    return _matmul(self, mat2).astype(self.dtype)


def _addmm_checks(self, mat1, mat2):
    _mm_checks(mat1, mat2)
    if self.dtype != mat1.dtype:
        raise RuntimeError(
            f"self and mat2 must have the same dtype, but got {_pretty(self)} and {_pretty(mat2)}"
        )
    out_shape = (mat1.shape[0], mat2.shape[1])
    try:
        ok = jnp.broadcast_shapes(self.shape, out_shape) == out_shape
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(
            f"The expanded size of the tensor ({out_shape[-1]}) must match the existing size "
            f"({self.shape[-1] if self.ndim else 1}) at non-singleton dimension. "
            f"Target sizes: {list(out_shape)}.  Tensor sizes: {list(self.shape)}"
        )


@lower("addmm")
def addmm(self, mat1, mat2, beta=1, alpha=1):
    _addmm_checks(self, mat1, mat2)
    return _combine(self, _matmul(mat1, mat2), beta, alpha, mat1.dtype)


@lower("_addmm_activation")
def _addmm_activation(self, mat1, mat2, beta=1, alpha=1, use_gelu=False):
    _addmm_checks(self, mat1, mat2)
    acc = _acc(mat1.dtype)
    r = _combine(self, _matmul(mat1, mat2), beta, alpha, acc)
    if use_gelu:
        r = jax.nn.gelu(r, approximate=False)
    else:
        r = jnp.maximum(r, jnp.zeros((), r.dtype))
    return r.astype(mat1.dtype)


def _bmm_checks(self, mat2, n1="batch1", n2="batch2"):
    if self.ndim != 3:
        raise RuntimeError(f"{n1} must be a 3D tensor")
    if mat2.ndim != 3:
        raise RuntimeError(f"{n2} must be a 3D tensor")
    b, n, k = self.shape
    if mat2.shape[0] != b or mat2.shape[1] != k:
        raise RuntimeError(
            f"Expected size for first two dimensions of {n2} tensor to be: [{b}, {k}] but got: "
            f"[{mat2.shape[0]}, {mat2.shape[1]}]."
        )
    if self.dtype != mat2.dtype:
        raise RuntimeError(
            f"expected scalar type {_pretty(self)} but found {_pretty(mat2)}"
        )
    _check_matmul_dtype(self, "bmm")


@lower("bmm")
def bmm(self, mat2):
    _bmm_checks(self, mat2)
    return _matmul(self, mat2).astype(self.dtype)


@lower("baddbmm")
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    _bmm_checks(batch1, batch2)
    return _combine(self, _matmul(batch1, batch2), beta, alpha, batch1.dtype)


@lower("addbmm")
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    _bmm_checks(batch1, batch2)
    acc = _acc(batch1.dtype)
    prod = jnp.einsum("bnk,bkp->np", batch1, batch2, precision=HIGHEST, preferred_element_type=acc)
    return _combine(self, prod, beta, alpha, batch1.dtype)


def _mv_checks(mat, vec, self=None):
    if mat.ndim != 2 or vec.ndim != 1 or mat.shape[1] != vec.shape[0]:
        got = f"input ({'x'.join(map(str, self.shape))}), " if self is not None else ""
        raise RuntimeError(
            f"size mismatch, got {got}mat ({'x'.join(map(str, mat.shape))}), "
            f"vec ({'x'.join(map(str, vec.shape))})"
        )
    if mat.dtype != vec.dtype:
        raise RuntimeError(
            f"expected scalar type {_pretty(mat)} but found {_pretty(vec)}"
        )


@lower("mv")
def mv(self, vec):
    _mv_checks(self, vec)
    return _matmul(self, vec).astype(self.dtype)


@lower("addmv")
def addmv(self, mat, vec, beta=1, alpha=1):
    _mv_checks(mat, vec, self)
    return _combine(self, _matmul(mat, vec), beta, alpha, mat.dtype)


def _dot_checks(self, other, name):
    if self.ndim != 1 or other.ndim != 1:
        raise RuntimeError(
            f"1D tensors expected, but got {self.ndim}D and {other.ndim}D tensors"
        )
    if self.shape[0] != other.shape[0]:
        raise RuntimeError(
            f"inconsistent tensor size, expected tensor [{self.shape[0]}] and src [{other.shape[0]}] "
            f"to have the same number of elements, but got {self.shape[0]} and {other.shape[0]} "
            "elements respectively"
        )
    if self.dtype != other.dtype:
        raise RuntimeError(
            f"{name} : expected both vectors to have same dtype, but found {_pretty(self)} and "
            f"{_pretty(other)}"
        )


@lower("dot")
def dot(self, tensor):
    _dot_checks(self, tensor, "dot")
    return _matmul(self, tensor).astype(self.dtype)


@lower("vdot")
def vdot(self, other):
    _dot_checks(self, other, "vdot")
    return _matmul(jnp.conj(self), other).astype(self.dtype)


@lower("addr")
def addr(self, vec1, vec2, beta=1, alpha=1):
    if vec1.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(
            f"addr: Expected 1-D argument vec1, but got {vec1.ndim}-D"
            if vec1.ndim != 1 else f"addr: Expected 1-D argument vec2, but got {vec2.ndim}-D"
        )
    from .promotion import result_dtypes
    from .registry import DEFAULT

    _, out = result_dtypes(DEFAULT, self, vec1, vec2)
    acc = _acc(out)
    if jnp.dtype(out) == jnp.dtype(jnp.bool_):
        prod = vec1.astype(bool)[:, None] & vec2.astype(bool)[None, :]
    else:
        prod = vec1.astype(acc)[:, None] * vec2.astype(acc)[None, :]
    return _combine(self, prod, beta, alpha, out)


# --- embedding backward --------------------------------------------------------


@lower("embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    d = grad_output.shape[-1]
    acc = _acc(grad_output.dtype)
    g = grad_output.reshape(-1, d).astype(acc)
    idx = indices.reshape(-1).astype(jnp.int64)
    keep = idx != padding_idx
    g = jnp.where(keep[:, None], g, jnp.zeros((), acc))
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[idx].add(jnp.ones_like(idx, dtype=acc), mode="drop")
        g = g / jnp.take(counts, idx, mode="clip")[:, None]
    out = jnp.zeros((num_weights, d), acc).at[idx].add(g, mode="drop")
    return out.astype(grad_output.dtype)


# --- attention ----------------------------------------------------------------


@lower("_safe_softmax")
def _safe_softmax(self, dim, dtype=None):
    """softmax whose fully -inf rows give 0 (scaled_dot_product_attention's math path)."""
    x = self if dtype is None else self.astype(to_jax_dtype(dtype))
    out_dtype = x.dtype
    if self.ndim == 0:
        return jnp.where(jnp.isneginf(self), 0, 1).astype(out_dtype)
    acc = _acc(out_dtype)
    xa = x.astype(acc)
    m = jnp.max(xa, axis=dim, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, jnp.zeros((), acc))
    e = jnp.exp(xa - m)
    s = e / jnp.sum(e, axis=dim, keepdims=True)
    masked = jnp.all(jnp.isneginf(self), axis=dim, keepdims=True)
    return jnp.where(masked, jnp.zeros((), acc), s).astype(out_dtype)


# --- small matrix helpers ------------------------------------------------------


@lower("trace")
def trace(self):
    if self.ndim != 2:
        raise RuntimeError("trace: expected a matrix, but got tensor with dim " + str(self.ndim))
    dt = jnp.dtype(self.dtype)
    out = jnp.dtype(jnp.int64) if (dt.kind in "biu") else dt
    acc = _acc(out)
    return jnp.trace(self.astype(acc)).astype(out)


@lower("diag_embed")
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    nd = self.ndim + 1
    d1, d2 = dim1 % nd, dim2 % nd
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = self.shape[-1] if self.ndim else 1
    x = self if self.ndim else self.reshape(1)
    m = n + abs(offset)
    out = jnp.zeros(x.shape[:-1] + (m, m), self.dtype)
    i = jnp.arange(n, dtype=jnp.int64)
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    out = out.at[..., rows, cols].set(x)
    return jnp.moveaxis(out, (-2, -1), (d1, d2))


@lower("linalg_cross")
def linalg_cross(self, other, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    nd = len(shape)
    d = dim % nd if nd else 0
    if shape[d] != 3:
        raise RuntimeError(
            f"linalg.cross: inputs dimension {dim} must have length 3. Got {self.shape[d] if self.ndim > d else 1} "
            f"and {other.shape[d] if other.ndim > d else 1}"
        )
    if self.dtype != other.dtype:
        raise RuntimeError(
            f"linalg.cross: expected self and other to have the same dtype, but got {_pretty(self)} "
            f"and {_pretty(other)}"
        )
    a = jnp.broadcast_to(self, shape)
    b = jnp.broadcast_to(other, shape)
    a0, a1, a2 = (jnp.take(a, k, axis=d) for k in range(3))
    b0, b1, b2 = (jnp.take(b, k, axis=d) for k in range(3))
    return jnp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=d).astype(self.dtype)


# --- linear algebra -----------------------------------------------------------


def _check_float(A, api):
    if jnp.dtype(A.dtype).kind not in "fc" or jnp.dtype(A.dtype) in _HALF:
        raise RuntimeError(
            f"{api}: Expected a floating point or complex tensor as input. Got {_pretty(A)}"
        )


def _check_square(A, api):
    if A.ndim < 2:
        raise RuntimeError(
            f"{api}: The input tensor A must have at least 2 dimensions."
        )
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"{api}: A must be batches of square matrices, but they are {A.shape[-2]} by "
            f"{A.shape[-1]} matrices"
        )


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _lu(A):
    """LAPACK-style LU: (LU, 1-based int32 pivots, permutation, int32 info)."""
    if A.shape[-1] == 0 or A.shape[-2] == 0:
        k = min(A.shape[-2], A.shape[-1])
        return (A, jnp.ones(A.shape[:-2] + (k,), jnp.int32),
                jnp.broadcast_to(jnp.arange(A.shape[-2], dtype=jnp.int32), A.shape[:-1]),
                jnp.zeros(A.shape[:-2], jnp.int32))
    lu, piv, perm = lax.linalg.lu(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diag == 0
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
    return lu, (piv + 1).astype(jnp.int32), perm, info


def _batch_broadcast(a, b):
    """Broadcast the batch dimensions (all but the last two) of a and b."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _permute_rows(x, perm, inverse=False):
    """x[..., perm, :] (or the inverse permutation), with batched perm."""
    perm, x = jnp.broadcast_to(perm, x.shape[:-2] + perm.shape[-1:]), x
    if inverse:
        perm = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(x, perm[..., :, None].astype(jnp.int64), axis=-2)


def _lu_solve(lu, perm, B, trans=0):
    """Solve op(A) X = B with A = P L U (A[perm] = L U); trans 0: A, 1: A^T, 2: A^H."""
    lu, B = _batch_broadcast(lu, B)
    conj = trans == 2 and jnp.iscomplexobj(lu)
    if trans == 0:
        y = _permute_rows(B, perm)
        y = lax.linalg.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    y = lax.linalg.triangular_solve(lu, B, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
    y = lax.linalg.triangular_solve(lu, y, left_side=True, lower=True, transpose_a=True,
                                    conjugate_a=conj, unit_diagonal=True)
    return _permute_rows(y, perm, inverse=True)


def _pivots_to_perm(pivots, m):
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


@lower("linalg_lu_factor_ex")
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    _check_float(A, "torch.linalg.lu_factor_ex")
    if A.ndim < 2:
        raise RuntimeError("torch.linalg.lu_factor_ex: Expected tensor with 2 or more dimensions. "
                           f"Got size: {list(A.shape)} instead")
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, piv, _, info = _lu(A)
    return lu, piv, info


@lower("linalg_lu")
def linalg_lu(A, pivot=True):
    _check_float(A, "linalg.lu")
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the CPU")
    m, n = A.shape[-2:]
    k = min(m, n)
    lu, _, perm, _ = _lu(A)
    P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=A.dtype), -1, -2)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=A.dtype)
    U = jnp.triu(lu[..., :k, :])
    return P, L, U


@lower("lu_unpack")
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    if unpack_data:
        L = jnp.tril(LU_data[..., :, :k], -1) + jnp.eye(m, k, dtype=LU_data.dtype)
        U = jnp.triu(LU_data[..., :k, :])
    else:
        L = jnp.zeros((0,), LU_data.dtype)
        U = jnp.zeros((0,), LU_data.dtype)
    if unpack_pivots:
        perm = _pivots_to_perm(LU_pivots, m)
        P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=LU_data.dtype), -1, -2)
    else:
        P = jnp.zeros((0,), LU_data.dtype)
    return P, L, U


@lower("linalg_lu_solve")
def linalg_lu_solve(LU, pivots, B, left=True, adjoint=False):
    m = LU.shape[-1]
    perm = _pivots_to_perm(pivots, m)
    if left:
        return _lu_solve(LU, perm, B, 2 if adjoint else 0).astype(B.dtype)
    # X op(A) = B  <=>  op(A)^T X^T = B^T
    if adjoint:  # X A^H = B <=> A conj(X)^T = conj(B)^T
        return jnp.conj(_mT(_lu_solve(LU, perm, jnp.conj(_mT(B)), 0))).astype(B.dtype)
    return _mT(_lu_solve(LU, perm, _mT(B), 1)).astype(B.dtype)


def _is_vector_rhs(A, B):
    return B.ndim == 1 or (A.ndim - 1 == B.ndim and tuple(B.shape) == tuple(A.shape[:-1]))


@lower("_linalg_solve_ex")
def _linalg_solve_ex(A, B, left=True, check_errors=False):
    _check_float(A, "linalg.solve")
    if A.dtype != B.dtype:
        raise RuntimeError(
            "linalg.solve: Expected A and B to have the same dtype, but found A of type "
            f"{_pretty(A)} and B of type {_pretty(B)} instead"
        )
    _check_square(A, "linalg.solve")
    vector = _is_vector_rhs(A, B)
    if vector and not left:
        raise RuntimeError(
            "linalg.solve: Vector broadcasting of the left hand side is not supported for left=False. "
            "In this case linalg.solve is equivalent to B / A.squeeze(-1)"
        )
    B_ = B[..., None] if vector else B
    n = A.shape[-1]
    if (B_.shape[-2] if left else B_.shape[-1]) != n:
        raise RuntimeError(
            f"linalg.solve: Incompatible shapes of A and B for the equation "
            f"{'AX = B' if left else 'XA = B'} ({A.shape[-2]}x{A.shape[-1]} and "
            f"{B_.shape[-2]}x{B_.shape[-1]})"
        )
    lu, piv, perm, info = _lu(A)
    if left:
        X = _lu_solve(lu, perm, B_, 0)
    else:
        X = _mT(_lu_solve(lu, perm, _mT(B_), 1))
    if vector:
        X = X[..., 0]
    return X.astype(B.dtype), lu, piv, info


@lower("linalg_inv_ex")
def linalg_inv_ex(A, check_errors=False):
    _check_float(A, "linalg.inv")
    _check_square(A, "linalg.inv")
    lu, _, perm, info = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, perm, eye, 0).astype(A.dtype), info


def _det_parts(A):
    lu, piv, _, _ = _lu(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    n = A.shape[-1]
    swaps = jnp.sum(piv != jnp.arange(1, n + 1, dtype=jnp.int32), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(A.dtype)
    return lu, piv, diag, parity


def _linalg_det_fn(A):
    _check_float(A, "linalg.det")
    _check_square(A, "linalg.det")
    lu, piv, diag, parity = _det_parts(A)
    return (parity * jnp.prod(diag, axis=-1)).astype(A.dtype), lu, piv


def _linalg_slogdet_fn(A):
    _check_float(A, "linalg.slogdet")
    _check_square(A, "linalg.slogdet")
    lu, piv, diag, parity = _det_parts(A)
    absd = jnp.abs(diag)
    logabs = jnp.sum(jnp.log(absd), axis=-1)
    if jnp.iscomplexobj(A):
        phase = jnp.where(absd == 0, 0, diag / jnp.where(absd == 0, 1, absd))
        sign = parity * jnp.prod(phase, axis=-1)
    else:
        sign = parity * jnp.prod(jnp.sign(diag), axis=-1)
    return sign.astype(A.dtype), logabs.astype(to_jax_dtype(_real_dtype(A))), lu, piv


def _real_dtype(A):
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(
        to_torch_dtype(A.dtype), to_torch_dtype(A.dtype)
    )


# PyTorch factors A^T instead of A for contiguous real inputs of det/slogdet (and its
# backward relies on it), so the LU these return depends on the input's strides:
# a small kernel picks the operand, a private lowering does the math.
def _private(name, fn):
    op = overload(name)
    return Lowering(name, fn, op, schema_args(op))


_DET = _private("_linalg_det", _linalg_det_fn)
_SLOGDET = _private("_linalg_slogdet", _linalg_slogdet_fn)


def _transposed_if_contiguous(A):
    return A.mT if (A.dim() >= 2 and A.is_contiguous() and not A.is_complex()) else A


@kernel("_linalg_det")
def _linalg_det(A):
    from ..eager.executor import execute

    return execute(_DET, (_transposed_if_contiguous(A),), {})


@kernel("_linalg_slogdet")
def _linalg_slogdet(A):
    from ..eager.executor import execute

    return execute(_SLOGDET, (_transposed_if_contiguous(A),), {})


@kernel("_linalg_check_errors")
def _linalg_check_errors(info, api_name, is_matrix):
    """Raise PyTorch's LinAlgError when info is non-zero (needs the value on the host, as on CUDA)."""
    from ..runtime import transfer

    v = np.asarray(transfer.value(info))
    if not v.any():
        return None
    torch.ops.aten._linalg_check_errors(torch.from_numpy(v.copy()), api_name, is_matrix=is_matrix)
    return None


def _cholesky_info(A):
    """LAPACK potrf's info: 1-based order of the first leading minor that is not PD, else 0."""
    n = A.shape[-1]
    ar = jnp.arange(n)

    def body(k, carry):
        M, info = carry
        piv = jnp.real(M[..., k, k])
        bad = ~(piv > 0) & (info == 0)
        info = jnp.where(bad, k + 1, info)
        safe = jnp.where(piv > 0, piv, 1)
        col = jnp.where(ar > k, M[..., :, k], 0)
        row = jnp.where(ar > k, M[..., k, :], 0)
        M = M - col[..., :, None] * row[..., None, :] / safe[..., None, None]
        return M, info

    _, info = lax.fori_loop(0, n, body, (A, jnp.zeros(A.shape[:-2], jnp.int32)))
    return info


def _cholesky_lower(A, upper):
    """Lower Cholesky factor reading only the triangle PyTorch reads; plus info."""
    if A.shape[-1] == 0:
        return A, jnp.zeros(A.shape[:-2], jnp.int32)
    if upper:
        # the upper triangle of A is the lower triangle of A^H
        A = _mH(A)
    Ah = jnp.tril(A) + _mH(jnp.tril(A, -1))  # the Hermitian matrix PyTorch's potrf sees
    L = lax.linalg.cholesky(Ah, symmetrize_input=False)
    ok = jnp.all(jnp.isfinite(L), axis=(-2, -1))
    info = lax.cond(jnp.all(ok), lambda a: jnp.zeros(a.shape[:-2], jnp.int32), _cholesky_info, Ah)
    info = jnp.where(ok, 0, info).astype(jnp.int32)
    return jnp.tril(L), info


@lower("linalg_cholesky_ex")
def linalg_cholesky_ex(self, upper=False, check_errors=False):
    _check_float(self, "linalg.cholesky")
    _check_square(self, "linalg.cholesky")
    L, info = _cholesky_lower(self, upper)
    return (_mH(L) if upper else L).astype(self.dtype), info


@lower("cholesky")
def cholesky(self, upper=False):
    _check_float(self, "cholesky")
    _check_square(self, "cholesky")
    L, _ = _cholesky_lower(self, upper)
    return (_mH(L) if upper else L).astype(self.dtype)


def _cholesky_factor_solve(L, B, upper):
    """Solve (L L^H) X = B, or (U^H U) X = B when upper."""
    L, B = _batch_broadcast(L, B)
    conj = jnp.iscomplexobj(L)
    if upper:
        y = lax.linalg.triangular_solve(L, B, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
        return lax.linalg.triangular_solve(L, y, left_side=True, lower=False)
    y = lax.linalg.triangular_solve(L, B, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True, conjugate_a=conj)


@lower("cholesky_solve")
def cholesky_solve(self, input2, upper=False):
    return _cholesky_factor_solve(input2, self, upper).astype(self.dtype)


@lower("cholesky_inverse")
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return _cholesky_factor_solve(self, eye, upper).astype(self.dtype)


@lower("linalg_qr")
def linalg_qr(A, mode="reduced"):
    _check_float(A, "linalg.qr")
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', or 'complete'"
        )
    q, r = lax.linalg.qr(A, full_matrices=(mode == "complete"))
    if mode == "r":
        return jnp.zeros((0,), A.dtype), r
    return q, r


@lower("_linalg_svd")
def _linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    _check_float(A, "linalg.svd")
    real = to_jax_dtype(_real_dtype(A))
    if not compute_uv:
        s = lax.linalg.svd(A, full_matrices=False, compute_uv=False)
        return jnp.zeros((0,), A.dtype), s.astype(real), jnp.zeros((0,), A.dtype)
    u, s, vh = lax.linalg.svd(A, full_matrices=full_matrices, compute_uv=True)
    return u, s.astype(real), vh


@lower("_linalg_eigh")
def _linalg_eigh(A, UPLO="L", compute_v=True):
    _check_float(A, "linalg.eigh")
    _check_square(A, "linalg.eigh")
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    real = to_jax_dtype(_real_dtype(A))
    lower = UPLO == "L"
    H = jnp.tril(A) + _mH(jnp.tril(A, -1)) if lower else jnp.triu(A) + _mH(jnp.triu(A, 1))
    v, w = lax.linalg.eigh(H, lower=lower, symmetrize_input=False)
    if not compute_v:
        return w.astype(real), jnp.zeros((0,), A.dtype)
    return w.astype(real), v


@lower("triangular_solve")
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    _check_float(A, "triangular_solve")
    A_, B_ = _batch_broadcast(A, self)
    x = lax.linalg.triangular_solve(
        A_, B_, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x.astype(self.dtype), A_


@lower("linalg_solve_triangular")
def linalg_solve_triangular(self, B, upper, left=True, unitriangular=False):
    _check_float(self, "linalg.solve_triangular")
    if self.dtype != B.dtype:
        raise RuntimeError(
            f"linalg.solve_triangular: Expected A and B to have the same dtype, but found A of type "
            f"{_pretty(self)} and B of type {_pretty(B)} instead"
        )
    A_, B_ = _batch_broadcast(self, B)
    return lax.linalg.triangular_solve(
        A_, B_, left_side=left, lower=not upper, unit_diagonal=unitriangular
    ).astype(B.dtype)


@lower("linalg_matrix_exp")
def linalg_matrix_exp(self):
    _check_float(self, "linalg.matrix_exp")
    _check_square(self, "linalg.matrix_exp")
    if self.shape[-1] == 0:
        return self
    flat = self.reshape((-1,) + self.shape[-2:])
    out = jax.vmap(jax.scipy.linalg.expm)(flat)
    return out.reshape(self.shape).astype(self.dtype)
