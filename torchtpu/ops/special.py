"""Special functions and numeric odds and ends (jax.scipy.special where it has them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import kernel, lower
