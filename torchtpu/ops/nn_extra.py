"""Less common nn ops: grid sampling, unpooling, embedding bags, CTC, distances, margin losses."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import kernel, lower
