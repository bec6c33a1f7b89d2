"""Batch-norm overloads that update running_mean/var in place outside their schema
(native_batch_norm, _native_batch_norm_legit, _batch_norm_with_update): the functional
lowering of ops/nn.py computes the new statistics, these kernels copy them into the
running buffers."""
from __future__ import annotations

import torch

from ...ops.registry import LOWERINGS, kernel
from ..executor import execute

_FUNCTIONAL = LOWERINGS["_native_batch_norm_legit_functional"]
_NATIVE = LOWERINGS["native_batch_norm"]


def _functional_bn(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return execute(_FUNCTIONAL, (input, weight, bias, running_mean, running_var, training, momentum, eps), {})


@kernel("native_batch_norm")
def _native_batch_norm_kernel(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm updates running_mean/var in place in training mode (not in its schema)."""
    if training and running_mean is not None and running_var is not None:
        out, sm, si, rm, rv = _functional_bn(input, weight, bias, running_mean, running_var, True, momentum, eps)
        running_mean.copy_(rm)
        running_var.copy_(rv)
        return out, sm, si
    return execute(_NATIVE, (input, weight, bias, running_mean, running_var, training, momentum, eps), {})


@kernel("_native_batch_norm_legit")
def _native_batch_norm_legit_kernel(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, si, rm, rv = _functional_bn(input, weight, bias, running_mean, running_var, training, momentum, eps)
    if training:
        running_mean.copy_(rm)
        running_var.copy_(rv)
    return out, sm, si


@kernel("_batch_norm_with_update")
def _batch_norm_with_update_kernel(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, si, rm, rv = _functional_bn(input, weight, bias, running_mean, running_var, True, momentum, eps)
    running_mean.copy_(rm)
    running_var.copy_(rv)
    return out, sm, si, torch.empty((0,), dtype=torch.uint8, device=input.device)
