"""The two kernels torch.amp.GradScaler needs, lowered natively.

_amp_foreach_non_finite_check_and_unscale_ unscales every gradient and raises
found_inf in one executable; _amp_update_scale_ grows or backs off the scale. Both
run on the device: a scaler step reads nothing back but the one found_inf that
GradScaler.step itself reads (as on CUDA).

Each in-place overload mutates two arguments (the grads and found_inf; the scale and
its growth tracker) and the executor writes back one mutated argument, so their kernels
(eager/composites/amp.py, with ATen's argument checks) pass the mutated tensors as ONE
list and the lowerings UNSCALE / UPDATE return that list updated (the fused optimizers
in foreach.py do the same). The functional overloads, which
torch.compile's functionalized graphs contain, are lowered in the table directly.
Arithmetic follows ATen's CPU/CUDA kernels: opmath (float32) products, the scale
updated in double and rounded to float.
"""
from __future__ import annotations

import jax.numpy as jnp

from .registry import ArgInfo, Lowering, lower, overload


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


# --- functional overloads (torch.compile graphs) ----------------------------------------


@lower("_amp_foreach_non_finite_check_and_unscale", variants=False)
def amp_foreach_non_finite_check_and_unscale(self, found_inf, inv_scale):
    return _unscale(self, found_inf, inv_scale)


@lower("_amp_update_scale", dynamic=("scale_growth_factor", "scale_backoff_factor"), variants=False)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                     growth_interval):
    return _update(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                   growth_interval)


# --- in-place overloads (eager kernels): the mutated tensors travel as one list ----------


def _unscale_math(self, inv_scale):
    grads, found = _unscale(self[:-1], self[-1], inv_scale)
    return grads + [found]


UNSCALE = Lowering(
    "_amp_foreach_non_finite_check_and_unscale_", _unscale_math,
    overload("_amp_foreach_non_finite_check_and_unscale_"),
    [ArgInfo("self", "tensor_list", False, True), ArgInfo("inv_scale", "tensor", False, False)],
    mode="inplace", mutated=("self",),
)


def _update_math(self, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    return list(_update(self[0], self[1], found_inf, scale_growth_factor, scale_backoff_factor,
                        growth_interval))


UPDATE = Lowering(
    "_amp_update_scale_", _update_math, overload("_amp_update_scale_"),
    [ArgInfo("self", "tensor_list", False, True), ArgInfo("found_inf", "tensor", False, False),
     ArgInfo("scale_growth_factor", "scalar", False, False),
     ArgInfo("scale_backoff_factor", "scalar", False, False),
     ArgInfo("growth_interval", "scalar", False, False)],
    mode="inplace", mutated=("self",),
)
