"""Random ops, keyed by torch's seed through runtime.rng."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
