"""GradScaler's kernels on torch tensors (torch.amp.GradScaler's unscale_ and update): ATen's
argument checks, then the lowerings UNSCALE / UPDATE of ops/amp.py with the mutated tensors
passed as ONE list. The functional overloads run the in-place ones on clones here; compiled
graphs use their table lowerings instead."""
from __future__ import annotations

import torch

from ...ops.amp import UNSCALE, UPDATE
from ...ops.registry import kernel
from ..executor import execute


# --- checks (ATen's messages) ---------------------------------------------------------


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



@kernel("_amp_foreach_non_finite_check_and_unscale_")
def amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    _check_unscale(self, found_inf, inv_scale)
    if self:
        execute(UNSCALE, (list(self) + [found_inf], inv_scale), {})


@kernel("_amp_foreach_non_finite_check_and_unscale")
def amp_foreach_non_finite_check_and_unscale_functional(self, found_inf, inv_scale):
    grads, found = [g.clone() for g in self], found_inf.clone()
    amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
    return grads, found


@kernel("_amp_update_scale_")
def amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                      growth_interval):
    _check_update(self, growth_tracker, found_inf)
    execute(UPDATE, ([self, growth_tracker], found_inf, float(scale_growth_factor),
                     float(scale_backoff_factor), int(growth_interval)), {})
    return self


@kernel("_amp_update_scale")
def amp_update_scale_functional(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                                growth_interval):
    scale, tracker = self.clone(), growth_tracker.clone()
    amp_update_scale_(scale, tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval)
    return scale, tracker
