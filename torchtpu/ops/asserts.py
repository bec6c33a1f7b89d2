"""Assertions on device values: `torch._assert_async` and the asserts torch.compile puts
in graphs (one_hot's "Class values must be non-negative." under aot_autograd).

They are device-side checks (ops/checks.py): the program keeps running, the assertion
fails at the next host read with its own message, as CUDA's asynchronous asserts do."""
from __future__ import annotations

import jax.numpy as jnp

from . import checks
from .registry import lower


def _falsy(self):
    if self.size != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return jnp.asarray(self).reshape(()) == 0


@lower("_assert_async", variants=False)
def _assert_async(self):
    checks.report(_falsy(self), message="Expected Tensor with single nonzero value, but got zero")


@lower("_assert_async.msg", variants=False)
def _assert_async_msg(self, assert_msg):
    checks.report(_falsy(self), message=assert_msg)
