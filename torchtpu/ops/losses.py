"""Loss functions and their backward ops."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
