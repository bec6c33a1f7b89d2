"""Indexing, gather/scatter, masking."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
