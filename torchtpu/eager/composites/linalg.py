"""Linear-algebra kernels on torch tensors around the private lowerings of ops/linalg.py:
the operand chosen by the input's strides (det, slogdet), CPU's LAPACK where XLA has no
solver (eig off XLA:CPU, complex LDL^T), CPU's argument checks and a host-side rank check
(lstsq)."""
from __future__ import annotations

import torch

from ...ops.linalg import DET, EIG, EIGVALS, LDL_FACTOR, LDL_SOLVE, LSTSQ, SLOGDET
from ...ops.registry import kernel
from ...runtime.jaxenv import platform
from .. import fallback
from ..executor import execute


def _transposed_if_contiguous(A):
    # PyTorch factors A^T for contiguous real inputs (its backward relies on that LU)
    return A.mT if (A.dim() >= 2 and A.is_contiguous() and not A.is_complex()) else A


@kernel("_linalg_det")
def _linalg_det(A):
    return execute(DET, (_transposed_if_contiguous(A),), {})


@kernel("_linalg_slogdet")
def _linalg_slogdet(A):
    return execute(SLOGDET, (_transposed_if_contiguous(A),), {})


# --- eig: XLA has a general eigensolver on the CPU backend only; elsewhere it stays a CPU op ----


def _on_xla_cpu() -> bool:
    return platform() == "cpu"


@kernel("linalg_eig")
def linalg_eig(self):
    if _on_xla_cpu():
        return execute(EIG, (self,), {})
    return fallback.run_on_cpu(torch.ops.aten.linalg_eig.default, (self,), {})


@kernel("_linalg_eigvals")
def _linalg_eigvals(self):
    if _on_xla_cpu():
        return execute(EIGVALS, (self,), {})
    return fallback.run_on_cpu(torch.ops.aten._linalg_eigvals.default, (self,), {})


@kernel("linalg_lstsq")
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """LAPACK's gelsy/gelsd/gelss/gels semantics (CPU's default: gelsy). The residuals of gelsd/gelss
    exist only when every matrix has full rank: a host-side check, as on CPU."""
    api = "torch.linalg.lstsq"
    if self.dim() < 2:
        raise RuntimeError(f"{api}: input must have at least 2 dimensions.")
    if b.dim() < 1:
        raise RuntimeError(f"{api}: other must have at least 1 dimension.")
    if not (self.is_floating_point() or self.is_complex()) or self.dtype in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"{api}: Expected a floating point or complex tensor as input. Got {self.dtype}")
    if self.dtype != b.dtype:
        raise RuntimeError(f"{api}: Expected input and other to have the same dtype, but got "
                           f"input's dtype {self.dtype} and other's dtype {b.dtype}")
    vector = b.dim() == self.dim() - 1
    if self.shape[-2] != b.shape[-1 if vector else -2]:
        raise RuntimeError(f"{api}: input.size(-2) should match other.size({-1 if vector else -2})")
    driver = driver or "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise RuntimeError(f"{api}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    X, res, rank, s = execute(LSTSQ, (self, b), {"rcond": rcond, "driver": driver})
    m, n = self.shape[-2:]
    if m > n and driver in ("gelsd", "gelss") and not bool((rank.cpu() == n).all()):
        res = torch.empty((0,), dtype=res.dtype, device=res.device)
    return X, res, rank, s


# --- LDL^T: real matrices natively; complex ones stay on CPU (LAPACK pivots on |re| + |im| there) ---


def _real_float(t) -> bool:
    return t.dtype in (torch.float32, torch.float64)


@kernel("linalg_ldl_factor_ex")
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    api = "torch.linalg.ldl_factor_ex"
    if self.dim() < 2:
        raise RuntimeError(f"{api}: The input tensor A must have at least 2 dimensions.")
    if self.shape[-1] != self.shape[-2]:
        raise RuntimeError(f"{api}: A must be batches of square matrices, but they are "
                           f"{self.shape[-2]} by {self.shape[-1]} matrices")
    if not _real_float(self):
        return fallback.run_on_cpu(torch.ops.aten.linalg_ldl_factor_ex.default, (self,),
                                   {"hermitian": hermitian, "check_errors": check_errors})
    LD, piv, info = execute(LDL_FACTOR, (self,), {"hermitian": hermitian, "check_errors": check_errors})
    if check_errors:
        torch.ops.aten._linalg_check_errors(info, "torch.linalg.ldl_factor_ex", is_matrix=self.dim() == 2)
    return LD, piv, info


@kernel("linalg_ldl_solve")
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    api = "torch.linalg.ldl_solve"
    if LD.dim() < 2 or B.dim() < 2:
        raise RuntimeError(f"{api}: LD and B must have at least 2 dimensions.")
    if LD.shape[-1] != B.shape[-2]:
        raise RuntimeError(f"{api}: Incompatible shapes of A and B for the equation AX = B "
                           f"({LD.shape[-2]}x{LD.shape[-1]} and {B.shape[-2]}x{B.shape[-1]})")
    if pivots.dtype != torch.int32:
        raise RuntimeError(f"{api}: Expected LD.dtype to be int32, but got pivots with dtype {pivots.dtype}")
    if LD.dtype != B.dtype:
        raise RuntimeError(f"{api}: Expected LD and B to have the same dtype, but got {LD.dtype} and {B.dtype}")
    if not _real_float(LD):
        return fallback.run_on_cpu(torch.ops.aten.linalg_ldl_solve.default, (LD, pivots, B),
                                   {"hermitian": hermitian})
    return execute(LDL_SOLVE, (LD, pivots, B), {"hermitian": hermitian})
