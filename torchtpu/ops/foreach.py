"""The _foreach_* ops optimizers use: one executable per list, not per tensor."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
