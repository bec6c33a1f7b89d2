"""Appending to a tensor that grows along one dim (eager/growth.py decides when).

`torchtpu::grow_append(base, new, at, capacity)`: `base` is a storage's whole flat
buffer, `new` is written at element `at` of a buffer of `capacity` elements. `at` is a
runtime value and `capacity` a power-of-two bucket, so appending token after token
compiles one program per bucket, not one per length.
"""
from __future__ import annotations

import torch
from jax import lax
import jax.numpy as jnp

from .registry import lower

_lib = torch.library.Library("torchtpu", "FRAGMENT")
_lib.define("grow_append(Tensor base, Tensor new, int at, int capacity) -> Tensor")


@lower("torchtpu::grow_append", static=("capacity",), dynamic=("at",), variants=False)
def grow_append(base, new, at, capacity):
    n = base.shape[0]
    out = base[:capacity] if n >= capacity else jnp.concatenate([base, jnp.zeros((capacity - n,), base.dtype)])
    return lax.dynamic_update_slice(out, new.astype(out.dtype), (at,))
