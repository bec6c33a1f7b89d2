"""Elementwise ops: arithmetic, math functions, comparisons, logic, activations."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import ALWAYS_BOOL, DEFAULT, INT_TO_FLOAT, lower


@lower("add.Tensor", "add.Scalar", promote=DEFAULT)
def add(self, other, alpha=1):
    return self + other * alpha if not (isinstance(alpha, int) and alpha == 1) else self + other


@lower("sub.Tensor", "sub.Scalar", promote=DEFAULT)
def sub(self, other, alpha=1):
    return self - other * alpha


@lower("mul.Tensor", "mul.Scalar", promote=DEFAULT)
def mul(self, other):
    return self * other


@lower("relu", promote=DEFAULT)
def relu(self):
    return jnp.maximum(self, 0).astype(self.dtype)


@lower("exp", promote=INT_TO_FLOAT)
def exp(self):
    return jnp.exp(self)


@lower("eq.Tensor", "eq.Scalar", promote=ALWAYS_BOOL)
def eq(self, other):
    return self == other
