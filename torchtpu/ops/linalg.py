"""Matrix products, attention, embedding backward, linear algebra."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime.jaxenv import to_jax_dtype, to_torch_dtype
from ._common import LOW_FLOATS as _HALF
from ._common import scalar_type_name
from ._common import opmath_dtype as _acc
from .registry import kernel, lower, private

HIGHEST = None  # float32 matmul precision: torch's setting, through runtime/precision.py

TORCH_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
    torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
    torch.bool: "bool", torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>",
}


def _tname(x) -> str:
    return TORCH_NAMES.get(to_torch_dtype(x.dtype), str(x.dtype))


def _pretty(x) -> str:
    return scalar_type_name(x.dtype)


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


@lower("_trilinear")
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """nn.Bilinear's op (eager runs it as PyTorch's composite; a compiled graph holds it): each
    input unsqueezed at its expand dims, the three multiplied, summed over sumdim."""
    total = i1.ndim + len(expand1)
    if not 0 <= unroll_dim < total:
        raise RuntimeError(f"unroll_dim must be in [0,{total - 1}]")
    acc = _acc(i1.dtype)

    def grown(t, dims):
        for d in sorted(int(d) % total for d in dims):
            t = jnp.expand_dims(t, d)
        return t.astype(acc)

    prod = grown(i1, expand1) * grown(i2, expand2) * grown(i3, expand3)
    dims = sorted({int(d) % total for d in sumdim})
    return (jnp.sum(prod, axis=tuple(dims)) if dims else prod).astype(i1.dtype)


@lower("baddbmm")
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    _bmm_checks(batch1, batch2)
    return _combine(self, _matmul(batch1, batch2), beta, alpha, batch1.dtype)


@lower("addbmm")
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    _bmm_checks(batch1, batch2)
    acc = _acc(batch1.dtype)
    if jnp.dtype(batch1.dtype) in _HALF and batch1.shape[0] > 1:
        # PyTorch CPU runs one addmm_ per batch into the float16/bfloat16 result, rounding it
        # after each: r = beta*self + alpha*b1[0]@b2[0]; then r = r + alpha*b1[i]@b2[i].
        prods = jnp.einsum("bnk,bkp->bnp", batch1, batch2, precision=HIGHEST, preferred_element_type=acc)

        def step(r, p):
            return (r.astype(acc) + _scaled_prod(p, alpha)).astype(batch1.dtype), None

        return jax.lax.scan(step, _combine(self, prods[0], beta, alpha, batch1.dtype), prods[1:])[0]
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
    if jnp.dtype(out) in _HALF:
        # PyTorch CPU's addr kernel computes in the half dtype itself, rounding after every
        # multiply and add: beta*self + (alpha*vec1)*vec2, beta/alpha cast to the dtype;
        # beta == 0 ignores self (NaN/inf included).
        a = jnp.asarray(alpha).astype(out)
        b = jnp.asarray(beta).astype(out)
        prod = (a * vec1.astype(out))[:, None] * vec2.astype(out)[None, :]
        s = b * jnp.broadcast_to(self, prod.shape).astype(out)
        return jnp.where(b == 0, prod, s + prod)
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
# backward relies on it), so the LU these return depends on the input's strides: a kernel
# (eager/composites/linalg.py) picks the operand, these private lowerings do the math.
DET = private("_linalg_det")(_linalg_det_fn)
SLOGDET = private("_linalg_slogdet")(_linalg_slogdet_fn)


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


# matrix_exp as PyTorch computes it (Bader, Blanes & Casas' optimized Taylor polynomials, the
# degree picked per matrix from its 1-norm, scaling and squaring past the last threshold), so the
# rounding errors of large-norm inputs match CPU's rather than a Pade approximant's.
_MEXP_THETAS = {
    4: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02, 5.800524627688768e-01,
        1.461661507209034e+00, 3.010066362817634e+00),
    8: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04, 4.991228871115323e-02,
        2.996158913811580e-01, 1.090863719290036e+00),
}
_T12_B = ((9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
          (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
          (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
          (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359))
_T18_B = ((0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.),
          (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00, 4.98289622525382669416e-01,
           -6.37898194594723280150e-04),
          (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
           -6.98210122488052056106e-03, 3.34975017086070470649e-05),
          (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
           2.95552570429315521194e-02, -1.39180257516060693404e-05),
          (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05))


def _mexp_polys(A):
    """The Taylor approximants T1, T2, T4, T8, T12, T18 of exp(A), A batched (b, n, n)."""
    dt = A.dtype
    real = jnp.finfo(dt).dtype
    I = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=dt), A.shape)
    mm = _matmul
    A2 = mm(A, A).astype(dt)
    A3 = mm(A, A2).astype(dt)

    def comb(mats, coeffs):
        out = jnp.zeros_like(A)
        for m, c in zip(mats, coeffs):
            out = out + jnp.asarray(c, real).astype(dt) * m
        return out

    t1 = I + A
    t2 = I + A + A2 / 2
    t4 = comb((I, A, mm(A2, comb((I, A, A2), (1 / 2.0, 1 / 6.0, 1 / 24.0))).astype(dt)), (1.0, 1.0, 1.0))
    sqrt_177 = 0.1330413469565007072504e+2
    x3 = 2.0 / 3.0
    x1 = x3 * ((1.0 + sqrt_177) / 88.0)
    x2 = x3 * ((1.0 + sqrt_177) / 352.0)
    x4 = (-271.0 + 29.0 * sqrt_177) / (315.0 * x3)
    x5 = (-11.0 + 11.0 * sqrt_177) / (1260.0 * x3)
    x6 = (-99.0 + 11.0 * sqrt_177) / (5040.0 * x3)
    x7 = (89.0 - sqrt_177) / (5040.0 * x3)
    y2 = (857.0 - 58.0 * sqrt_177) / 630.0
    a4 = mm(A2, comb((A, A2), (x1, x2))).astype(dt)
    a8 = mm(comb((A2, a4), (x3, 1.0)), comb((I, A, A2, a4), (x4, x5, x6, x7))).astype(dt)
    t8 = comb((I, A, A2, a8), (1.0, 1.0, y2, 1.0))
    B = [comb((I, A, A2, A3), row) for row in _T12_B]
    B[2] = B[2] + mm(B[3], B[3]).astype(dt)
    t12 = B[0] + mm(B[1] + B[2], B[2]).astype(dt)
    return t1, t2, t4, t8, t12


def _mexp_t18(A):
    dt = A.dtype
    real = jnp.finfo(dt).dtype
    I = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=dt), A.shape)
    A2 = _matmul(A, A).astype(dt)
    A3 = _matmul(A, A2).astype(dt)
    P = [I, A, A2, A3, _matmul(A3, A3).astype(dt)]  # PyTorch's T18 combines I, A, A^2, A^3, A^6
    B = []
    for row in _T18_B:
        out = jnp.zeros_like(A)
        for m, c in zip(P, row):
            out = out + jnp.asarray(c, real).astype(dt) * m
        B.append(out)
    B[3] = B[3] + _matmul(B[0], B[4]).astype(dt)
    return B[1] + _matmul(B[2] + B[3], B[3]).astype(dt)


@lower("linalg_matrix_exp")
def linalg_matrix_exp(self):
    _check_float(self, "linalg.matrix_exp")
    _check_square(self, "linalg.matrix_exp")
    n = self.shape[-1]
    if n == 0 or self.size == 0:
        return self
    if n == 1:
        return jnp.exp(self)
    dt = self.dtype
    A = self.reshape((-1, n, n))
    real = jnp.finfo(dt).dtype
    th = [jnp.asarray(t, real) for t in _MEXP_THETAS[jnp.dtype(real).itemsize]]
    norm = jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)
    # degree 18 with scaling and squaring (norm >= theta_12)
    s = jnp.maximum(0, jnp.ceil(jnp.log2(norm / th[5]))).astype(jnp.int64)
    s = jnp.where(jnp.isfinite(norm), s, 0)
    scaled = A / jnp.power(2.0, s).astype(real)[:, None, None].astype(dt)
    E = _mexp_t18(scaled)

    def square(state):
        p, E = state
        return p + 1, jnp.where((p < s)[:, None, None], _matmul(E, E).astype(dt), E)

    _, E = lax.while_loop(lambda st: st[0] < jnp.max(s), square, (jnp.int64(0), E))
    t1, t2, t4, t8, t12 = _mexp_polys(A)
    out = E
    lo = jnp.asarray(-1, real)
    for i, t in enumerate((t1, t2, t4, t8, t12)):
        pick = (lo < norm) & (norm <= th[i]) & ~(norm >= th[4])
        out = jnp.where(pick[:, None, None], t, out)
        lo = th[i]
    return out.reshape(self.shape).astype(dt)


# --- Householder QR pieces: geqrf, householder_product (orgqr), ormqr ----------------------------


@lower("geqrf")
def geqrf(self):
    _check_float(self, "torch.geqrf")
    if self.ndim < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    m, n = self.shape[-2:]
    if m == 0 or n == 0:
        return self, jnp.zeros(self.shape[:-2] + (min(m, n),), self.dtype)
    from jax._src.lax.linalg import geqrf as _geqrf  # public lax.linalg does not export it

    a, tau = _geqrf(self)
    return a.astype(self.dtype), tau.astype(self.dtype)


def _householder_q(a, tau):
    """H_1 H_2 ... H_k from the reflectors under a's diagonal (LAPACK orgqr); a is (..., m, n), m >= n."""
    m, n = a.shape[-2:]
    if m == 0 or n == 0:
        return jnp.zeros(a.shape, a.dtype)
    k = tau.shape[-1]
    if k == 0:
        return jnp.broadcast_to(jnp.eye(m, n, dtype=a.dtype), a.shape)
    return lax.linalg.householder_product(a, tau)


@lower("linalg_householder_product")
def linalg_householder_product(input, tau):
    api = "torch.linalg.householder_product"
    _check_float(input, api)
    if input.ndim < 2:
        raise RuntimeError(f"{api}: input must have at least 2 dimensions.")
    m, n = input.shape[-2:]
    if m < n:
        raise RuntimeError(f"{api}: input.shape[-2] must be greater than or equal to input.shape[-1]")
    if tau.shape[-1] > n:
        raise RuntimeError(f"{api}: input.shape[-1] must be greater than or equal to tau.shape[-1]")
    if input.ndim - tau.ndim != 1:
        raise RuntimeError(f"{api}: Expected tau to have one dimension less than input, but got "
                           f"tau.ndim equal to {tau.ndim} and input.ndim is equal to {input.ndim}")
    if input.dtype != tau.dtype:
        raise RuntimeError(f"{api}: tau dtype {_pretty(tau)} does not match input dtype {_pretty(input)}")
    return _householder_q(input, tau).astype(input.dtype)


@lower("ormqr")
def ormqr(self, input2, input3, left=True, transpose=False):
    """op(Q) @ C (left) or C @ op(Q), Q the product of geqrf's reflectors (LAPACK ormqr)."""
    api = "torch.ormqr"
    a, tau, C = self, input2, input3
    _check_float(a, api)
    if a.ndim < 2 or C.ndim < 2:
        raise RuntimeError(f"{api}: input and other must have at least 2 dimensions.")
    mq = C.shape[-2] if left else C.shape[-1]
    if a.shape[-2] != mq:
        raise RuntimeError(f"{api}: input.shape[-2] must be equal to other.shape[{-2 if left else -1}]")
    k = tau.shape[-1]
    if k > mq:
        raise RuntimeError(f"{api}: tau.shape[-1] must be less than or equal to input.shape[-2]")
    if a.dtype != tau.dtype or a.dtype != C.dtype:
        raise RuntimeError(f"{api}: Expected input, tau and other to have the same dtype")
    # The full mq x mq Q: pad the reflectors (and tau, with zeros: identity reflectors) to mq columns.
    refl = a[..., :, :k]
    refl = jnp.concatenate([refl, jnp.zeros(a.shape[:-1] + (mq - k,), a.dtype)], axis=-1)
    taus = jnp.concatenate([tau, jnp.zeros(tau.shape[:-1] + (mq - k,), tau.dtype)], axis=-1)
    Q = _householder_q(refl, taus)
    if transpose:
        Q = _mH(Q)
    out = _matmul(Q, C) if left else _matmul(C, Q)
    return out.astype(C.dtype)


# --- eig: XLA has a general eigensolver on the CPU backend only; elsewhere it stays a CPU op ----


def _eig_dtype(self, name: str):
    """Checks an eig input; the complex dtype of its results."""
    _check_float(self, name)
    _check_square(self, name)
    return jnp.complex64 if jnp.dtype(self.dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.complex64)) \
        else jnp.complex128


def _linalg_eig_fn(self):
    cdt = _eig_dtype(self, "linalg.eig")
    if self.shape[-1] == 0:
        return jnp.zeros(self.shape[:-1], cdt), jnp.zeros(self.shape, cdt)
    w, v = lax.linalg.eig(self, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
    return w.astype(cdt), v.astype(cdt)


def _linalg_eigvals_fn(self):
    cdt = _eig_dtype(self, "linalg.eigvals")
    if self.shape[-1] == 0:
        return jnp.zeros(self.shape[:-1], cdt)
    (w,) = lax.linalg.eig(self, compute_left_eigenvectors=False, compute_right_eigenvectors=False)
    return w.astype(cdt)


# served by a kernel (eager/composites/linalg.py): natively on XLA:CPU, else CPU's LAPACK
EIG = private("linalg_eig")(_linalg_eig_fn)
EIGVALS = private("_linalg_eigvals")(_linalg_eigvals_fn)


# --- least squares ---------------------------------------------------------------------------


def _lstsq_fn(self, b, rcond=None, *, driver=None):
    A, B = self, b
    m, n = A.shape[-2:]
    vector = B.ndim == A.ndim - 1
    B_ = B[..., None] if vector else B
    A_, B_ = _batch_broadcast(A, B_)
    real = to_jax_dtype(_real_dtype(A))
    if rcond is None:
        rcond = float(jnp.finfo(real).eps) * max(m, n)
    if m == 0 or n == 0:
        X = jnp.zeros(A_.shape[:-2] + (n, B_.shape[-1]), A.dtype)
        s = jnp.zeros(A_.shape[:-2] + (0,), real)
        rank = jnp.zeros(A_.shape[:-2], jnp.int64)
    elif driver == "gels":
        # QR; A has full rank (LAPACK gels assumes it)
        if m >= n:
            q, r = lax.linalg.qr(A_, full_matrices=False)
            X = lax.linalg.triangular_solve(r, _matmul(_mH(q), B_).astype(A.dtype), left_side=True, lower=False)
        else:
            q, r = lax.linalg.qr(_mH(A_), full_matrices=False)
            y = lax.linalg.triangular_solve(r, B_, left_side=True, lower=False, transpose_a=True,
                                            conjugate_a=jnp.iscomplexobj(r))
            X = _matmul(q, y)
        s = jnp.zeros(A_.shape[:-2] + (0,), real)
        rank = jnp.zeros(A_.shape[:-2], jnp.int64)
    else:
        # the minimum-norm solution through the SVD, singular values under rcond * s_max dropped
        u, s, vh = lax.linalg.svd(A_, full_matrices=False, compute_uv=True)
        cut = s[..., :1] * rcond if rcond >= 0 else jnp.zeros_like(s[..., :1])
        keep = s > cut
        sinv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(A.dtype)
        X = _matmul(_mH(vh), sinv[..., :, None] * _matmul(_mH(u), B_).astype(A.dtype))
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    X = X.astype(A.dtype)
    if m > n and driver != "gelsy":
        R = _matmul(A_, X).astype(A.dtype) - B_
        res = jnp.sum(jnp.real(R * jnp.conj(R)) if jnp.iscomplexobj(R) else R * R, axis=-2).astype(real)
    else:
        res = jnp.zeros((0,), real)
    if driver == "gelsy":
        s = jnp.zeros((0,), real)
    elif driver == "gels":
        s = jnp.zeros((0,), real)
        rank = jnp.zeros((0,), jnp.int64)
    if vector:
        X = X[..., 0]
        if res.ndim and res.shape[-1] and res.ndim > 1:
            res = res[..., 0]
    return X, res, rank, s


# served by a kernel (eager/composites/linalg.py): CPU's argument checks, and the residuals
# of gelsd/gelss dropped unless every matrix has full rank (a host read)
LSTSQ = private("linalg_lstsq")(_lstsq_fn)


# --- LDL^T with Bunch-Kaufman pivoting (LAPACK sytf2/sytrs, lower storage) ---------------------
# Real matrices natively, step by step as LAPACK's unblocked sytf2 does (the blocked sytrf gives
# the same factors at these sizes); complex ones stay on CPU (LAPACK pivots on |re| + |im| there).

_BK_ALPHA = (1.0 + 17.0 ** 0.5) / 8.0


def _sym_lower(M):
    return jnp.tril(M) + jnp.tril(M, -1).T


def _sytf2_lower(A):
    """One real (n, n) matrix, lower triangle read: (LD with the upper triangle zero, 1-based int32
    pivots -- negative for 2x2 blocks --, int32 info)."""
    n = A.shape[-1]
    dt = A.dtype
    idx = jnp.arange(n)
    alpha = jnp.asarray(_BK_ALPHA, dt)

    def body(state):
        M, LD, piv, info, k = state
        colk = M[:, k]
        absakk = jnp.abs(M[k, k])
        below = jnp.where(idx > k, jnp.abs(colk), -1)
        imax = jnp.argmax(below)
        colmax = jnp.where(k < n - 1, jnp.maximum(below[imax], 0), 0).astype(dt)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        rowv = jnp.where((idx >= k) & (idx != imax), jnp.abs(M[imax, :]), 0)
        rowmax = jnp.max(rowv)
        c1 = absakk >= alpha * colmax
        c2 = absakk >= alpha * colmax * (colmax / jnp.where(rowmax == 0, 1, rowmax))
        c3 = jnp.abs(M[imax, imax]) >= alpha * rowmax
        one = zero | c1 | c2
        kp = jnp.where(one, k, imax)
        kstep = jnp.where(one | c3, 1, 2)
        kk = k + kstep - 1
        # interchange rows and columns kk and kp of the trailing (symmetric) matrix
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        M = M[perm][:, perm]

        def step1(M, LD):
            d = M[k, k]
            x = jnp.where(idx > k, M[:, k], 0)
            r1 = 1 / d
            M = _sym_lower(M + jnp.tril(x[:, None] * (-r1 * x)[None, :]))
            col = jnp.where(idx > k, r1 * x, jnp.where(idx == k, d, 0))
            return M, LD.at[:, k].set(col)

        def step2(M, LD):
            k1 = k + 1
            d21 = M[k1, k]
            d11 = M[k1, k1] / d21
            d22 = M[k, k] / d21
            t = 1 / (d11 * d22 - 1)
            d21 = t / d21
            rest = idx > k1
            a0 = jnp.where(rest, M[:, k], 0)
            a1 = jnp.where(rest, M[:, k1], 0)
            wk = d21 * (d11 * a0 - a1)
            wkp1 = d21 * (d22 * a1 - a0)
            M = _sym_lower(M - jnp.tril(a0[:, None] * wk[None, :] + a1[:, None] * wkp1[None, :]))
            c0 = jnp.where(rest, wk, jnp.where(idx == k, M[k, k], jnp.where(idx == k1, M[k1, k], 0)))
            c1_ = jnp.where(rest, wkp1, jnp.where(idx == k1, M[k1, k1], 0))
            return M, LD.at[:, k].set(c0).at[:, k1].set(c1_)

        def stepz(M, LD):  # a zero (or NaN) column: LAPACK leaves it and records info
            col = jnp.where(idx >= k, M[:, k], 0)
            return M, LD.at[:, k].set(col)

        branch = jnp.where(zero, 0, jnp.where(kstep == 1, 1, 2))
        M, LD = lax.switch(branch, (stepz, step1, step2), M, LD)
        info = jnp.where(zero & (info == 0), k + 1, info)
        p1 = (kp + 1).astype(jnp.int32)
        piv = jnp.where(kstep == 1, piv.at[k].set(p1), piv.at[k].set(-p1).at[jnp.minimum(k + 1, n - 1)].set(-p1))
        return M, LD, piv, info, k + kstep

    state = (_sym_lower(A), jnp.zeros_like(A), jnp.zeros((n,), jnp.int32), jnp.int32(0), jnp.int32(0))
    _, LD, piv, info, _ = lax.while_loop(lambda s: s[4] < n, body, state)
    return LD, piv, info


def _ldl_factor_fn(self, *, hermitian=False, check_errors=False):
    n = self.shape[-1]
    batch = self.shape[:-2]
    if n == 0 or any(b == 0 for b in batch):
        return self, jnp.zeros(self.shape[:-1], jnp.int32), jnp.zeros(batch, jnp.int32)
    flat = self.reshape((-1, n, n))
    LD, piv, info = jax.vmap(_sytf2_lower)(flat)
    return LD.reshape(self.shape), piv.reshape(self.shape[:-1]), info.reshape(batch)


def _sytrs_lower(LD, piv, B):
    """Solve A X = B from sytf2's lower factors (LAPACK sytrs)."""
    n = LD.shape[-1]
    idx = jnp.arange(n)

    def swap(B, i, j):
        perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return B[perm]

    def fwd(state):  # L D Y = P^T B
        B, k = state
        p = piv[k]

        def one(B):
            B = swap(B, k, p - 1)
            l = jnp.where(idx > k, LD[:, k], 0)
            B = B - l[:, None] * B[k][None, :]
            return B.at[k].set(B[k] / LD[k, k])

        def two(B):
            k1 = k + 1
            B = swap(B, k1, -p - 1)
            l0 = jnp.where(idx > k1, LD[:, k], 0)
            l1 = jnp.where(idx > k1, LD[:, k1], 0)
            B = B - l0[:, None] * B[k][None, :] - l1[:, None] * B[k1][None, :]
            akm1k = LD[k1, k]
            akm1 = LD[k, k] / akm1k
            ak = LD[k1, k1] / akm1k
            denom = akm1 * ak - 1
            bkm1 = B[k] / akm1k
            bk = B[k1] / akm1k
            return B.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)

        B = lax.cond(p > 0, one, two, B)
        return B, k + jnp.where(p > 0, 1, 2)

    def bwd(state):  # L^T P^T X = Y
        B, k = state
        p = piv[k]

        def one(B):
            l = jnp.where(idx > k, LD[:, k], 0)
            B = B.at[k].add(-(l @ B))
            return swap(B, k, p - 1)

        def two(B):
            km1 = k - 1
            l = jnp.where(idx > k, LD[:, k], 0)
            lm = jnp.where(idx > k, LD[:, km1], 0)
            B = B.at[k].add(-(l @ B)).at[km1].add(-(lm @ B))
            return swap(B, k, -p - 1)

        B = lax.cond(p > 0, one, two, B)
        return B, k - jnp.where(p > 0, 1, 2)

    B, _ = lax.while_loop(lambda s: s[1] < n, fwd, (B, jnp.int32(0)))
    B, _ = lax.while_loop(lambda s: s[1] >= 0, bwd, (B, jnp.int32(n - 1)))
    return B


def _ldl_solve_fn(LD, pivots, B, *, hermitian=False):
    n = LD.shape[-1]
    batch = jnp.broadcast_shapes(LD.shape[:-2], B.shape[:-2])
    out_shape = batch + B.shape[-2:]
    if n == 0 or B.shape[-1] == 0 or any(b == 0 for b in batch):
        return jnp.zeros(out_shape, B.dtype)
    LD_ = jnp.broadcast_to(LD, batch + LD.shape[-2:]).reshape((-1, n, n))
    piv_ = jnp.broadcast_to(pivots, batch + pivots.shape[-1:]).reshape((-1, n))
    B_ = jnp.broadcast_to(B, out_shape).reshape((-1,) + B.shape[-2:])
    X = jax.vmap(_sytrs_lower)(LD_, piv_, B_)
    return X.reshape(out_shape).astype(B.dtype)


# served by kernels (eager/composites/linalg.py): real matrices natively, complex ones on CPU
LDL_FACTOR = private("linalg_ldl_factor_ex")(_ldl_factor_fn)
LDL_SOLVE = private("linalg_ldl_solve")(_ldl_solve_fn)
