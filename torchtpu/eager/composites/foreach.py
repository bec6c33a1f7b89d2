"""_foreach_* and fused-optimizer kernels on torch tensors around the lowerings of
ops/foreach.py: a CPU `scalars` tensor moved to the device, and the fused Adam/AdamW/SGD/Adagrad
steps, whose mutated lists travel to their lowering as ONE list (the executor writes back one
mutated argument)."""
from __future__ import annotations

import torch

from ...ops.foreach import FUSED_ADAGRAD, FUSED_ADAM, FUSED_ADAMW, FUSED_SGD
from ...ops.registry import LOWERINGS, kernel, variants_of
from ..executor import execute


# --- _foreach_addc{mul,div}.Tensor with a CPU `scalars` tensor -----------------
# PyTorch requires that 1-D tensor on the CPU; the executor only carries 0-d CPU
# tensors, so these kernels move it to the device first and run the lowering.


def _tensor_scalars_kernel(name):
    found = []

    def run(self, tensor1, tensor2, scalars):
        if not found:  # the in-place twin is generated when eager/kernels serves the table
            base = LOWERINGS[name.replace("_.", ".", 1)]
            found.append(base if base.name == name else next(v for v in variants_of(base) if v.name == name))
        if scalars.device.type != "cpu":  # CUDA's check (convert_tensor_to_scalar_list)
            raise RuntimeError(f"Expected scalars to be on CPU, got {scalars.device} instead.")
        scalars = scalars.to("tpu")
        return execute(found[0], (self, tensor1, tensor2, scalars), {})

    return run


for _op in ("addcmul", "addcdiv"):
    kernel(f"_foreach_{_op}.Tensor")(_tensor_scalars_kernel(f"_foreach_{_op}.Tensor"))
    kernel(f"_foreach_{_op}_.Tensor")(_tensor_scalars_kernel(f"_foreach_{_op}_.Tensor"))


# --- fused optimizers (optimizer(..., fused=True)) ----------------------------------


def _adam_kernel(low):
    name, adamw = low.name, low is FUSED_ADAMW

    def run(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
            weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        n = len(self)
        if not n:
            return None
        lists = [grads, exp_avgs, exp_avg_sqs, state_steps] + ([max_exp_avg_sqs] if amsgrad else [])
        if any(len(x) != n for x in lists):
            raise RuntimeError(f"{name}: all tensor lists must have the same length")
        lr_t = lr if isinstance(lr, torch.Tensor) else None
        combined = list(self) + list(grads) + list(exp_avgs) + list(exp_avg_sqs)
        combined += list(max_exp_avg_sqs) if amsgrad else []
        execute(low, (combined, list(state_steps), grad_scale, found_inf, lr_t), dict(
            lr=0.0 if lr_t is not None else float(lr), beta1=float(beta1), beta2=float(beta2),
            eps=float(eps), n=n, amsgrad=bool(amsgrad), maximize=bool(maximize),
            weight_decay=float(weight_decay), adamw=adamw,
        ))
        return None

    return run


for _low in (FUSED_ADAM, FUSED_ADAMW):
    kernel(_low.name, f"{_low.name}.tensor_lr")(_adam_kernel(_low))


@kernel("_fused_sgd_", "_fused_sgd_.tensor_lr")
def fused_sgd_(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov,
               maximize, is_first_step, grad_scale=None, found_inf=None):
    n = len(self)
    if not n:
        return None
    has_momentum = momentum != 0
    if len(grads) != n or (has_momentum and len(momentum_buffer_list) != n):
        raise RuntimeError("_fused_sgd_: all tensor lists must have the same length")
    lr_t = lr if isinstance(lr, torch.Tensor) else None
    combined = list(self) + list(grads) + (list(momentum_buffer_list) if has_momentum else [])
    execute(FUSED_SGD, (combined, grad_scale, found_inf, lr_t), dict(
        lr=0.0 if lr_t is not None else float(lr), momentum=float(momentum),
        dampening=float(dampening), n=n, weight_decay=float(weight_decay),
        has_momentum=bool(has_momentum), nesterov=bool(nesterov), maximize=bool(maximize),
        is_first_step=bool(is_first_step),
    ))
    return None


@kernel("_fused_adagrad_", "_fused_adagrad_.tensor_lr")
def fused_adagrad_(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                   grad_scale=None, found_inf=None):
    n = len(self)
    if not n:
        return None
    if any(len(x) != n for x in (grads, state_sums, state_steps)):
        raise RuntimeError("_fused_adagrad_: all tensor lists must have the same length")
    lr_t = lr if isinstance(lr, torch.Tensor) else None
    execute(FUSED_ADAGRAD, (list(self) + list(grads) + list(state_sums), list(state_steps), grad_scale,
                            found_inf, lr_t), dict(
        lr=0.0 if lr_t is not None else float(lr), eps=float(eps), n=n, lr_decay=float(lr_decay),
        weight_decay=float(weight_decay), maximize=bool(maximize),
    ))
    return None
