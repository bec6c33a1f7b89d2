"""Running a function as one SPMD program over a group's mesh: how compiled graphs and
defer_and_fuse regions with collectives execute."""
from __future__ import annotations

import jax
import numpy as np

from ..metrics import bump
from .mesh import AXIS, Context


def spmd(run, ctx: Context, donate: bool):
    """jit(shard_map(run)) over the group's mesh, called with this rank's local values.

    Every value crosses as a 1-D block of a global array (a tpu input is its flat
    storage buffer already, so wrapping it is free); the program's outputs are
    1-D too, so this rank's block of each is its result as it is.
    """
    from jax.sharding import PartitionSpec as P

    shapes: dict = {}

    def body(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        leaves = [x.reshape(s) for x, s in zip(leaves, shapes["in"])]
        return run(*jax.tree_util.tree_unflatten(tree, leaves))

    sm = jax.shard_map(body, mesh=ctx.mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False)
    fn = jax.jit(sm, donate_argnums=(0,) if donate else ())
    device = ctx.mesh.devices.flat[ctx.group.rank()]
    sharding = ctx.sharding
    w = ctx.size

    def globalize(x):
        if not isinstance(x, jax.Array):
            x = jax.device_put(np.asarray(x).reshape(-1), device)
        elif x.ndim != 1:
            x = x.reshape(-1)
        return jax.make_array_from_single_device_arrays((w * x.shape[0],), sharding, [x])

    def call(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        if "in" not in shapes:
            shapes["in"] = [np.shape(x) for x in leaves]
        glob = jax.tree_util.tree_unflatten(tree, [globalize(x) for x in leaves])
        out = fn(*glob)
        bump("spmd_executions")
        return jax.tree_util.tree_map(lambda o: o.addressable_data(0), out)

    call.lower = lambda *a: fn.lower(*jax.tree_util.tree_map(globalize, a))
    return call
