"""Loss functions and their backward ops."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import checks
from ._common import opmath_dtype as _acc
from .promotion import result_dtypes
from .registry import DEFAULT, lower


def _reduce(loss, reduction):
    if reduction == 0:
        return loss
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _grad_scale(grad_output, numel, reduction):
    """grad_output as it multiplies each element's local gradient."""
    if reduction == 1:
        return grad_output / numel
    return grad_output


def _pair(self, target):
    """(computation dtype, result dtype) and both operands cast."""
    comp, res = result_dtypes(DEFAULT, self, target)
    return self.astype(comp), target.astype(comp), res


# --- nll_loss ---------------------------------------------------------------------


def _nll_parts(self, target, weight, ignore_index, class_axis):
    """Per-element (loss, weight) with the class axis removed."""
    C = self.shape[class_axis]
    x = self.astype(_acc(self.dtype))
    w = jnp.ones((C,), x.dtype) if weight is None else weight.astype(x.dtype)
    t = target.astype(jnp.int64)
    valid = t != ignore_index
    # CPU raises on a target outside [0, C) that is not ignore_index; XLA would clamp it
    bad = valid & ((t < 0) | (t >= C))
    checks.report(bad, checks.first(bad, t), exc=IndexError, message=lambda v, _: f"Target {v} is out of bounds.")
    tc = jnp.where(valid, t, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(tc, class_axis), axis=class_axis)
    picked = jnp.squeeze(picked, class_axis)
    wt = jnp.where(valid, w[tc] if C else jnp.zeros(tc.shape, x.dtype), jnp.zeros((), x.dtype))
    return -picked * wt, wt


def _nll_forward(self, target, weight, reduction, ignore_index, batched):
    dt = jnp.dtype(self.dtype)
    if not batched:  # (C,) input, () target
        loss, wt = _nll_parts(self[None], target[None], weight, ignore_index, 1)
        loss, wt = loss[0], wt[0]
        if reduction == 1:
            loss = loss / wt
        return loss.astype(dt), wt.astype(dt)
    loss, wt = _nll_parts(self, target, weight, ignore_index, 1)
    if reduction == 0:
        return loss.astype(dt), jnp.zeros((), dt)
    total = jnp.sum(wt)
    out = jnp.sum(loss)
    if reduction == 1:
        out = out / total
    return out.astype(dt), total.astype(dt)


def _check_weight(self, weight, two_d):
    """CPU's check of a class weight: one per class (XLA would read past it or broadcast)."""
    if weight is None:
        return
    n = self.shape[1] if two_d else self.shape[-1]
    if weight.size != n or (not two_d and weight.ndim != 1):
        raise RuntimeError(f"weight tensor should be defined either for all {n} classes or no classes but got "
                           f"weight tensor of shape: [{', '.join(str(d) for d in weight.shape)}]")


def _check_nll(self, target, two_d, weight=None):
    if two_d:
        if self.ndim != 4 or target.ndim != 3:
            raise RuntimeError(
                f"only batches of spatial targets supported (3D tensors) but got targets of dimension: {target.ndim}"
            )
        _check_weight(self, weight, True)
        return
    if self.ndim not in (1, 2):
        raise RuntimeError("input tensor should be 1D or 2D")
    if target.ndim > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if self.ndim == 2 and self.shape[0] != target.shape[0]:
        raise ValueError(
            f"Expected input batch_size ({self.shape[0]}) to match target batch_size ({target.shape[0]})."
        )
    _check_weight(self, weight, False)


@lower("nll_loss_forward")
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    _check_nll(self, target, False, weight)
    return _nll_forward(self, target, weight, reduction, ignore_index, self.ndim == 2)


@lower("nll_loss2d_forward")
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    _check_nll(self, target, True, weight)
    return _nll_forward(self, target, weight, reduction, ignore_index, True)


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    dt = jnp.dtype(self.dtype)
    batched = self.ndim != 1
    x = self if batched else self[None]
    t = target if batched else target[None]
    C = x.shape[1]
    acc = _acc(dt)
    w = jnp.ones((C,), acc) if weight is None else weight.astype(acc)
    t = t.astype(jnp.int64)
    valid = t != ignore_index
    tc = jnp.where(valid, t, 0)
    wt = jnp.where(valid, w[tc] if C else jnp.zeros(tc.shape, acc), jnp.zeros((), acc))
    g = grad_output.astype(acc)
    if reduction == 0 and batched:
        scale = g  # per element, same shape as target
    elif reduction == 1:
        scale = g / total_weight.astype(acc)
    else:
        scale = g
    # CPU writes only the rows it does not ignore: an ignored row stays 0 even where the
    # scale is not finite (a mean over targets that are all ignored divides by a total of 0)
    per = jnp.where(valid, -wt * scale, jnp.zeros((), acc))  # shape of t
    classes = jax.lax.broadcasted_iota(jnp.int64, x.shape, 1)
    hot = classes == jnp.expand_dims(tc, 1)
    grad = jnp.where(hot, jnp.expand_dims(per, 1), jnp.zeros((), acc))
    if not batched:
        grad = grad[0]
    return grad.astype(dt)


@lower("nll_loss_backward")
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@lower("nll_loss2d_backward")
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


# --- regression losses -------------------------------------------------------------


@lower("mse_loss")
def mse_loss(self, target, reduction=1):
    x, t, res = _pair(self, target)
    d = x - t
    return _reduce(d * d, reduction).astype(res)


@lower("mse_loss_backward")
def mse_loss_backward(grad_output, self, target, reduction):
    x, t, res = _pair(self, target)
    d = x - t
    n = d.size
    return (2 * d * _grad_scale(grad_output.astype(x.dtype), n, reduction)).astype(res)


@lower("smooth_l1_loss")
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    x, t, res = _pair(self, target)
    z = jnp.abs(x - t)
    if beta == 0:
        loss = z
    else:
        loss = jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    return _reduce(loss, reduction).astype(res)


@lower("smooth_l1_loss_backward")
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    x, t, res = _pair(self, target)
    d = x - t
    if beta == 0:
        local = jnp.sign(d)
    else:
        local = jnp.where(jnp.abs(d) < beta, d / beta, jnp.sign(d))
    return (local * _grad_scale(grad_output.astype(x.dtype), d.size, reduction)).astype(res)


@lower("huber_loss")
def huber_loss(self, target, reduction=1, delta=1.0):
    x, t, res = _pair(self, target)
    z = jnp.abs(x - t)
    loss = jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))
    return _reduce(loss, reduction).astype(res)


@lower("huber_loss_backward")
def huber_loss_backward(grad_output, self, target, reduction, delta):
    x, t, res = _pair(self, target)
    d = x - t
    local = jnp.clip(d, -delta, delta)
    return (local * _grad_scale(grad_output.astype(x.dtype), d.size, reduction)).astype(res)


# --- classification losses ---------------------------------------------------------


def _check_probabilities(x, t):
    """CPU's check, element by element in order, that input and target lie in [0, 1] (a NaN
    does not): the first element failing either names which."""
    bad_x = ~((x >= 0) & (x <= 1))
    bad = bad_x | ~((t >= 0) & (t <= 1))
    checks.report(bad, checks.first(bad, bad_x), message=lambda v, _: (
        f"all elements of {'input' if v else 'target'} should be between 0 and 1"))


@lower("binary_cross_entropy")
def binary_cross_entropy(self, target, weight=None, reduction=1):
    dt = jnp.dtype(self.dtype)
    acc = _acc(dt)
    x, t = self.astype(acc), target.astype(acc)
    _check_probabilities(x, jnp.broadcast_to(t, x.shape))
    lo = jnp.asarray(-100, acc)
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), lo) - t * jnp.maximum(jnp.log(x), lo)
    if weight is not None:
        loss = loss * weight.astype(acc)
    return _reduce(loss, reduction).astype(dt)


@lower("binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    dt = jnp.dtype(self.dtype)
    acc = _acc(dt)
    x, t = self.astype(acc), target.astype(acc)
    eps = jnp.asarray(1e-12, acc)
    g = _grad_scale(grad_output.astype(acc), x.size, reduction)
    grad = g * (x - t) / jnp.maximum((1 - x) * x, eps)
    if weight is not None:
        grad = grad * weight.astype(acc)
    return jnp.broadcast_to(grad, x.shape).astype(dt)


@lower("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    dt = jnp.dtype(self.dtype)
    acc = _acc(dt)
    x, t = self.astype(acc), target.astype(acc)
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, jnp.zeros((), acc))  # log(1+exp(-x))
    if pos_weight is not None:
        lw = (pos_weight.astype(acc) - 1) * t + 1
        loss = (1 - t) * x + lw * softplus_neg
    else:
        loss = (1 - t) * x + softplus_neg
    if weight is not None:
        loss = loss * weight.astype(acc)
    return _reduce(loss, reduction).astype(dt)


@lower("soft_margin_loss")
def soft_margin_loss(self, target, reduction=1):
    x, t, res = _pair(self, target)
    z = -t * x
    loss = jnp.log1p(jnp.exp(z))
    return _reduce(loss, reduction).astype(res)


@lower("soft_margin_loss_backward")
def soft_margin_loss_backward(grad_output, self, target, reduction):
    x, t, res = _pair(self, target)
    z = jnp.exp(-t * x)
    local = -t * z / (1 + z)
    return (local * _grad_scale(grad_output.astype(x.dtype), x.size, reduction)).astype(res)
