"""The functional collectives (`_c10d_functional` ops: DTensor, FSDP2, compiled DDP) as
JAX inside a SPMD program, for compiled graphs (compile/graph.py) and fused regions
(distributed/fused.py). Each takes the Context first, then the op's own arguments;
the group name is the last and not used (the Context is its group)."""
from __future__ import annotations

import jax
import torch

from .bodies import allreduce_block, reduce_scatter_block
from .mesh import AXIS
from .reduce import reduce_kind_named

funcol = torch.ops._c10d_functional


def _all_reduce(ctx, x, reduce_op, group_name):
    return allreduce_block(x, reduce_kind_named(reduce_op, x.dtype, "all_reduce"), ctx.size)


def _all_reduce_coalesced(ctx, xs, reduce_op, group_name):
    return [_all_reduce(ctx, x, reduce_op, group_name) for x in xs]


def _all_gather(ctx, x, group_size, group_name):
    if x.ndim == 0:
        x = x.reshape(1)
    return jax.lax.all_gather(x, AXIS, axis=0, tiled=True)


def _all_gather_coalesced(ctx, xs, group_size, group_name):
    return [_all_gather(ctx, x, group_size, group_name) for x in xs]


def _reduce_scatter(ctx, x, reduce_op, group_size, group_name):
    w = ctx.size
    out_shape = (x.shape[0] // w,) + tuple(x.shape[1:])
    # dim 0 is the outermost, so rank r's rows are the r-th flat chunk
    kind = reduce_kind_named(reduce_op, x.dtype, "reduce_scatter_tensor")
    return reduce_scatter_block(x.reshape(-1), kind, w).reshape(out_shape)


def _reduce_scatter_coalesced(ctx, xs, reduce_op, group_size, group_name):
    return [_reduce_scatter(ctx, x, reduce_op, group_size, group_name) for x in xs]


def _all_to_all_single(ctx, x, output_split_sizes, input_split_sizes, group_name):
    return jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)


def _broadcast(ctx, x, src, group_name):
    return jax.lax.all_gather(x, AXIS)[src]


LOWERINGS = {
    funcol.all_reduce.default: _all_reduce,
    funcol.all_reduce_coalesced.default: _all_reduce_coalesced,
    funcol.all_gather_into_tensor.default: _all_gather,
    funcol.all_gather_into_tensor_coalesced.default: _all_gather_coalesced,
    funcol.reduce_scatter_tensor.default: _reduce_scatter,
    funcol.reduce_scatter_tensor_coalesced.default: _reduce_scatter_coalesced,
    funcol.all_to_all_single.default: _all_to_all_single,
    funcol.broadcast.default: _broadcast,
}
