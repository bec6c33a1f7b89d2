"""Tensor factories: arange, linspace, full, eye, scalar_tensor."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
