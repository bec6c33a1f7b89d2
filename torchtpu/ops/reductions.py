"""Reductions, scans, sorting, softmax."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower
