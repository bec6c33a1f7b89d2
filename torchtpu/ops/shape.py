"""Shape ops that copy: cat, flip, roll, repeat, pad, triangular masks."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
