"""The collective bodies: JAX on this rank's block, inside `shard_map` over `AXIS`.

The process group's own programs ("skinny" collectives, one executable each) see each
rank's tensors as flat 1-D blocks; `body_*` build their bodies (`w` is the group size).
`allreduce_block` and `reduce_scatter_block` are shared with the functional collectives
of compiled graphs and fused regions (spmd/functional.py), so every path reduces alike.
A PREMUL_SUM collective ("premul_sum", spmd/reduce.py) takes one more input, last: each
rank's factor as a one-element block (a runtime value: a new factor compiles nothing).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..runtime import cache as _caches
from .mesh import AXIS


def _combine(stacked, kind):
    """Reduce a (w, n) stack of every rank's block over its first axis."""
    if kind in ("sum", "avg"):
        return jnp.sum(stacked, axis=0, dtype=stacked.dtype)
    if kind == "max":
        return jnp.max(stacked, axis=0)
    if kind == "min":
        return jnp.min(stacked, axis=0)
    if kind == "prod":
        return jnp.prod(stacked, axis=0, dtype=stacked.dtype)
    fn = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[kind]
    out = stacked[0]
    for i in range(1, stacked.shape[0]):
        out = fn(out, stacked[i])
    return out


def _avg(x, w):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return (x / w).astype(x.dtype)
    # integers: rounded toward zero, as NCCL's AVG (FuncSumPostDiv), not floored
    return jax.lax.div(x, jnp.asarray(w, x.dtype))


def premul(x, factor):
    """PREMUL_SUM's local step: x times its rank's factor (a one-element block, any float
    dtype), the factor cast to x's dtype first as NCCL's scalar is, the product in x's dtype."""
    return x * factor.reshape(()).astype(x.dtype)


def allreduce_block(x, kind: str, w: int):
    """Every rank's x reduced by `kind` (spmd/reduce.py), on every rank."""
    if x.dtype == jnp.bool_:
        y = x.astype(jnp.uint8)
        return (jax.lax.pmax(y, AXIS) if kind == "max" else
                jax.lax.pmin(y, AXIS) if kind == "min" else
                _combine(jax.lax.all_gather(y, AXIS), "bxor")).astype(jnp.bool_)
    if kind == "sum":
        return jax.lax.psum(x, AXIS)
    if kind == "avg":
        return _avg(jax.lax.psum(x, AXIS), w)
    if kind == "max":
        return jax.lax.pmax(x, AXIS)
    if kind == "min":
        return jax.lax.pmin(x, AXIS)
    return _combine(jax.lax.all_gather(x, AXIS), kind)


def reduce_scatter_block(x, kind: str, w: int):
    """Flat x reduced over the ranks; rank r keeps the r-th of w equal chunks."""
    k = x.shape[0] // w
    if kind in ("sum", "avg") and x.dtype != jnp.bool_:
        y = jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
        return _avg(y, w) if kind == "avg" else y
    # every rank's chunk for me, then combine here
    y = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    parts = jax.lax.all_to_all(y, AXIS, 0, 0, tiled=True).reshape(w, k)
    out = _combine(parts, kind)
    return out.astype(x.dtype)


def body_allreduce(kind, w):
    if kind == "premul_sum":  # the last input is the factor
        return lambda *xs: tuple(allreduce_block(premul(x, xs[-1]), "sum", w) for x in xs[:-1])
    return lambda *xs: tuple(allreduce_block(x, kind, w) for x in xs)


def body_broadcast(src, w):
    return lambda *xs: tuple(jax.lax.all_gather(x, AXIS)[src] for x in xs)


def body_allgather(w):
    return lambda *xs: tuple(jax.lax.all_gather(x, AXIS, tiled=True) for x in xs)


def body_reduce_scatter(kind, w):
    if kind == "premul_sum":  # the last input is the factor
        return lambda *xs: tuple(reduce_scatter_block(premul(x, xs[-1]), "sum", w) for x in xs[:-1])
    return lambda *xs: tuple(reduce_scatter_block(x, kind, w) for x in xs)


def body_alltoall(w):
    return lambda x: jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)


def body_scatter(src, w):
    def body(x):
        k = x.shape[0] // w
        return jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)[src * k:(src + 1) * k]

    return body


def body_p2p(dirs):
    """One slot per message between a pair of ranks: direction 0 is mesh index 0 -> 1."""
    perms = {0: [(0, 1)], 1: [(1, 0)]}
    return lambda *xs: tuple(jax.lax.ppermute(x, AXIS, perms[d]) for x, d in zip(xs, dirs))


# Uneven all_to_all: the program must be the same on every rank, so each chunk is padded
# to the largest chunk anywhere in the group before it and cut after it (local programs).

@functools.lru_cache(maxsize=256)
def pad_chunks(send_sizes, m):
    """Local (no collective): this rank's chunks, each padded to m elements, back to back."""
    off = np.concatenate([[0], np.cumsum(send_sizes)]).astype(int)

    @jax.jit
    def pad(x):
        return jnp.concatenate([jnp.pad(x[off[j]:off[j + 1]], (0, m - send_sizes[j])) for j in range(len(send_sizes))])

    return pad


@functools.lru_cache(maxsize=256)
def unpad_chunks(recv_sizes, m):
    """Local: the first recv_sizes[j] elements of each m-element chunk, back to back."""

    @jax.jit
    def unpad(y):
        y = y.reshape(len(recv_sizes), m)
        return jnp.concatenate([y[j, : recv_sizes[j]] for j in range(len(recv_sizes))])

    return unpad


_caches.register("all_to_all chunk layouts", pad_chunks)
_caches.register("all_to_all chunk unlayouts", unpad_chunks)
