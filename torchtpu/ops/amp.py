"""The two kernels torch.amp.GradScaler needs, lowered natively.

_amp_foreach_non_finite_check_and_unscale_ unscales every gradient and raises
found_inf in one executable; _amp_update_scale_ grows or backs off the scale. Both
run on the device: a scaler step reads nothing back but the one found_inf that
GradScaler.step itself reads (as on CUDA).

Each in-place overload mutates two arguments (the grads and found_inf; the scale and
its growth tracker) and the executor writes back one mutated argument, so the kernels
pass the mutated tensors as ONE list and the lowering returns that list updated (the
fused optimizers in foreach.py do the same). The functional overloads, which
torch.compile's functionalized graphs contain, are lowered in the table directly.
Arithmetic follows ATen's CPU/CUDA kernels: opmath (float32) products, the scale
updated in double and rounded to float.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from .registry import ArgInfo, Lowering, kernel, lower, overload


def _unscale(grads, found_inf, inv_scale):
    inv = inv_scale.reshape(()).astype(jnp.float32)
    bad = jnp.zeros((), jnp.bool_)
    out = []
    for g in grads:
        odt = jnp.float64 if g.dtype == jnp.float64 else jnp.float32
        gf = g.astype(odt)
        bad = bad | ~jnp.all(jnp.isfinite(gf))
        out.append(jnp.where(inv == 1, gf, gf * inv.astype(odt)).astype(g.dtype))
    found = jnp.where(bad, jnp.ones((), found_inf.dtype), found_inf.reshape(())).reshape(found_inf.shape)
    return out, found


def _update(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    s = scale.reshape(()).astype(jnp.float64)
    tracker = growth_tracker.reshape(())
    inf = found_inf.reshape(()) != 0
    successful = tracker + 1
    grow = successful == growth_interval
    grown = (s * growth_factor).astype(jnp.float32)
    grown = jnp.where(jnp.isfinite(grown), grown, s.astype(jnp.float32))
    new_scale = jnp.where(inf, (s * backoff_factor).astype(jnp.float32), jnp.where(grow, grown, s.astype(jnp.float32)))
    new_tracker = jnp.where(inf | grow, jnp.zeros((), tracker.dtype), successful.astype(tracker.dtype))
    return new_scale.reshape(scale.shape), new_tracker.reshape(growth_tracker.shape)


# --- checks (ATen's messages) -----------------------------------------------------------


def _check_unscale(grads, found_inf, inv_scale):
    if inv_scale.numel() != 1:
        raise RuntimeError("inv_scale must be a 1-element tensor.")
    if found_inf.numel() != 1:
        raise RuntimeError("found_inf must be a 1-element tensor.")
    if inv_scale.dtype != torch.float32:
        raise RuntimeError("inv_scale must be a float tensor.")
    if found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a float tensor.")
    if not grads:
        return
    for t, what in ((inv_scale, "inv_scale"), (found_inf, "found_inf")):
        if t.device.type != "tpu":
            raise RuntimeError(f"{what} must be a tpu tensor.")
    for g in grads:
        if g.device.type != "tpu":
            raise RuntimeError("one of scaled_grads was not a tpu tensor.")
        if g.layout != torch.strided:
            raise RuntimeError("one of scaled_grads was not a strided tensor.")
        if not g.is_floating_point():
            raise RuntimeError("scaled_grads must be floating point")


def _check_update(scale, growth_tracker, found_inf):
    for t, what in ((scale, "current_scale"), (growth_tracker, "growth_tracker"), (found_inf, "found_inf")):
        if t.device.type != "tpu":
            raise RuntimeError(f"{what} must be a tpu tensor.")
    if scale.numel() != 1:
        raise RuntimeError("current_scale must be a 1-element tensor.")
    if growth_tracker.numel() != 1:
        raise RuntimeError("growth_tracker must be a 1-element tensor.")
    if found_inf.numel() != 1:
        raise RuntimeError("found_inf must be a 1-element tensor.")
    if growth_tracker.dtype != torch.int32:
        raise RuntimeError("growth_tracker must be an int tensor.")
    if scale.dtype != torch.float32:
        raise RuntimeError("current_scale must be a float tensor.")
    if found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a float tensor.")


# --- functional overloads (torch.compile graphs) ----------------------------------------


@lower("_amp_foreach_non_finite_check_and_unscale", variants=False)
def amp_foreach_non_finite_check_and_unscale(self, found_inf, inv_scale):
    return _unscale(self, found_inf, inv_scale)


@lower("_amp_update_scale", dynamic=("scale_growth_factor", "scale_backoff_factor"), variants=False)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                     growth_interval):
    return _update(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                   growth_interval)


# --- in-place overloads (eager): the mutated tensors travel as one list -----------------


def _unscale_math(self, inv_scale):
    grads, found = _unscale(self[:-1], self[-1], inv_scale)
    return grads + [found]


_UNSCALE = Lowering(
    "_amp_foreach_non_finite_check_and_unscale_", _unscale_math,
    overload("_amp_foreach_non_finite_check_and_unscale_"),
    [ArgInfo("self", "tensor_list", False, True), ArgInfo("inv_scale", "tensor", False, False)],
    mode="inplace", mutated=("self",),
)


def _update_math(self, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    return list(_update(self[0], self[1], found_inf, scale_growth_factor, scale_backoff_factor,
                        growth_interval))


_UPDATE = Lowering(
    "_amp_update_scale_", _update_math, overload("_amp_update_scale_"),
    [ArgInfo("self", "tensor_list", False, True), ArgInfo("found_inf", "tensor", False, False),
     ArgInfo("scale_growth_factor", "scalar", False, False),
     ArgInfo("scale_backoff_factor", "scalar", False, False),
     ArgInfo("growth_interval", "scalar", False, False)],
    mode="inplace", mutated=("self",),
)


@kernel("_amp_foreach_non_finite_check_and_unscale_")
def amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    from ..eager.executor import execute

    _check_unscale(self, found_inf, inv_scale)
    if self:
        execute(_UNSCALE, (list(self) + [found_inf], inv_scale), {})


@kernel("_amp_foreach_non_finite_check_and_unscale")
def amp_foreach_non_finite_check_and_unscale_functional(self, found_inf, inv_scale):
    grads, found = [g.clone() for g in self], found_inf.clone()
    amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
    return grads, found


@kernel("_amp_update_scale_")
def amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                      growth_interval):
    from ..eager.executor import execute

    _check_update(self, growth_tracker, found_inf)
    execute(_UPDATE, ([self, growth_tracker], found_inf, float(scale_growth_factor),
                      float(scale_backoff_factor), int(growth_interval)), {})
    return self


@kernel("_amp_update_scale")
def amp_update_scale_functional(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                                growth_interval):
    scale, tracker = self.clone(), growth_tracker.clone()
    amp_update_scale_(scale, tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval)
    return scale, tracker
