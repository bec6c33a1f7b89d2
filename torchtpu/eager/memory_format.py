"""Where an op's results lie in memory: the strides CPU PyTorch gives them.

A channels_last input keeps its results channels_last through conv, pooling,
batch/group norm, upsampling, activations, dropout and their backward; a
pointwise op follows its inputs' layout by TensorIterator's rules (a transposed
matrix plus one is transposed too); `clone`/`contiguous`/`to` honour their
`memory_format`. A lowering itself computes logical (NCHW) values; the executor
asks `result_strides` once per compiled signature and writes each result whose
strides are not the contiguous ones in that physical order (a transpose inside the
same program, fused by XLA), then gives the tensor those strides.

The decision is PyTorch's own: the op's meta kernel run on stand-ins with the
inputs' exact strides (structured kernels share their stride logic with CPU's), except
where CPU's kernel decides differently from its meta kernel (convolution picks its
layout from the backend CPU would run; group_norm keeps the input's suggested
format). Inputs that are all plainly contiguous, with no memory_format asked for,
give contiguous results without asking: the common case costs nothing.
"""
from __future__ import annotations

import warnings

import jax.numpy as jnp
import torch
from torch._prims_common import suggest_memory_format
from torch.utils._pytree import tree_map

from ..runtime import geometry

_CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)


def result_strides(low, args, kwargs) -> tuple | None:
    """Per output of a functional call, (shape, strides) CPU gives it where the strides are
    not the contiguous ones (else None); None when every output is contiguous."""
    if low.mode != "functional":
        return None
    asked = _asked_format(low, args, kwargs)
    if asked in (None, torch.preserve_format, torch.contiguous_format) and all(
            _plain(t) for t in _tensors(args, kwargs)):
        return None
    if asked is torch.contiguous_format:
        return None
    rule = _RULES.get(low.overload.__name__.partition(".")[0])
    try:
        outs = rule(low, args, kwargs) if rule is not None else _meta(low, args, kwargs)
    except Exception:  # noqa: BLE001  (no meta kernel, data-dependent: contiguous as before)
        return None
    if outs is None:
        return None
    # Inputs all contiguous but for size-1 dims (an N,C,1,1 channels_last tensor): CPU's
    # TensorIterator takes its contiguous fast path, where meta kernels report the
    # channels_last strides of a result that is contiguous anyway; trust only CPU's own rules.
    exact = rule is not None or not all(t.is_contiguous() for t in _tensors(args, kwargs))
    found = tuple(_strides_of(o, exact) for o in outs)
    return found if any(s is not None for s in found) else None


def physical_order(shape, strides) -> tuple[int, ...]:
    """The dims from outermost to innermost in memory: transposing a logical value to this
    order and flattening it gives the buffer of a dense tensor with `strides`."""
    return tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))


def physical(x, strides):
    """A logical value `x` (a JAX array) in the physical order of `strides` (None: as is)."""
    if strides is None or len(strides) != x.ndim:
        return x
    return jnp.transpose(x, physical_order(x.shape, strides))


def fake_strides(v) -> tuple | None:
    """The strides of a traced (fake) tensor when a fresh buffer can hold them and they are
    not the contiguous ones; else None (dynamic sizes included)."""
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    shape, strides = tuple(v.shape), tuple(v.stride())
    if not all(isinstance(n, int) for n in shape + strides):
        return None
    return laid_out(shape, strides)


def laid_out(shape, strides) -> tuple | None:
    """`strides` when a fresh buffer of `shape` can hold them and they are not the contiguous
    ones (a permuted dense layout); else None."""
    if strides == geometry.contiguous_strides(shape) or not _dense(shape, strides):
        return None
    return tuple(strides)


def dense_strides(shape, memory_format) -> tuple:
    """Strides of a dense tensor of `shape` in `memory_format` (contiguous if it does not apply)."""
    if memory_format in _CHANNELS_LAST and len(shape) == (4 if memory_format is torch.channels_last else 5):
        order = [1] + list(range(len(shape) - 1, 1, -1)) + [0]  # channels innermost, batch outermost
        strides = [0] * len(shape)
        acc = 1
        for d in order:
            strides[d] = acc
            acc *= max(shape[d], 1)
        return tuple(strides)
    return geometry.contiguous_strides(shape)


# --- the decision -----------------------------------------------------------


def _tensors(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _plain(t: torch.Tensor) -> bool:
    """Contiguous with exactly the default strides, size-1 dims included: nothing in it
    suggests another layout (an N,C,1,1 channels_last tensor is contiguous, yet a
    convolution of it is channels_last on CPU)."""
    return t.dim() < 2 or t.stride() == geometry.contiguous_strides(t.shape)


def _asked_format(low, args, kwargs):
    if "memory_format" in kwargs:
        return kwargs["memory_format"]
    for i, a in enumerate(low.args):
        if a.name == "memory_format":
            return args[i] if i < len(args) else None
    return None


def _outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _meta(low, args, kwargs):
    if not _own_schema(low):
        return None
    margs, mkwargs = tree_map(_meta_standin, (args, kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _outputs(low.overload(*margs, **mkwargs))


def _meta_standin(a):
    """A tpu tensor as a meta tensor of its sizes, strides and dtype (all a layout depends on);
    the tpu device as meta."""
    if isinstance(a, torch.Tensor):
        if a.device.type != "tpu":
            return a  # a CPU scalar operand
        return torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="meta")
    if isinstance(a, torch.device) and a.type == "tpu":
        return torch.device("meta")
    if isinstance(a, str) and a.split(":")[0] == "tpu":
        return "meta"
    return a


def _own_schema(low) -> bool:
    return low.overload.namespace == "aten" and \
        [a.name for a in low.args] == [a.name for a in low.overload._schema.arguments]


def _strides_of(o, exact: bool) -> tuple | None:
    if not isinstance(o, torch.Tensor) or o.numel() == 0 or o.dim() < 2:
        return None
    shape, strides = tuple(o.shape), tuple(o.stride())
    # exact strides: an N,C,1,1 result is contiguous either way, but CPU may report channels_last's
    if strides == geometry.contiguous_strides(shape) or not _dense(shape, strides) or \
            (not exact and geometry.is_contiguous(shape, strides)):
        return None
    return shape, strides


def _dense(shape, strides) -> bool:
    """A permutation of a contiguous layout (what a fresh buffer can be written in)."""
    expected = 1
    for d in sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: strides[d]):
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True


# --- where CPU's kernel decides otherwise than its meta kernel ---------------


def _cpu_standin(t):
    """A CPU tensor with `t`'s sizes, strides and dtype (never written: only looked at)."""
    if t is None:
        return None
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")


def _convolution(low, args, kwargs):
    """CPU lays a convolution's result (and its backward's grad_input and grad_weight) out
    as the backend it picks wants them: mkldnn and the slow 2-d kernels channels_last if the
    input or the weight is, the slow 3-d kernels contiguous."""
    fmt = conv_format(**_bind(low, args, kwargs))
    out = _meta(low, args, kwargs)
    if out is None:
        return None
    return [o if o is None or o.dim() < 3 else torch.empty_strided(o.shape, dense_strides(tuple(o.shape), fmt),
                                                                   device="meta") for o in out]


def conv_format(input, weight, stride, padding, dilation, transposed, output_padding, groups, bias=None,
                bias_sizes=None, **_) -> torch.memory_format:
    """The memory format of the convolution CPU would run on tensors of these geometries."""
    x, w = _cpu_standin(input), _cpu_standin(weight)
    backend = torch._C._select_conv_backend(
        x, w, _cpu_standin(bias), stride, padding, dilation, transposed, output_padding, groups, bias_sizes)
    return torch._C._conv_determine_backend_memory_format(x, w, backend)


def _group_norm(low, args, kwargs):
    """CPU's group norm (and its backward) keeps the input's suggested format for its first
    result; its meta kernel returns it contiguous."""
    bound = _bind(low, args, kwargs)
    x = bound["input"] if "input" in bound else bound["X"]
    fmt = suggest_memory_format(x)
    out = _meta(low, args, kwargs)
    if out is None or out[0] is None:
        return None
    first = torch.empty_strided(out[0].shape, dense_strides(tuple(out[0].shape), fmt), device="meta")
    return [first] + out[1:]


def _bind(low, args, kwargs) -> dict:
    bound = dict(zip((a.name for a in low.args), args))
    bound.update(kwargs)
    return bound


_RULES = {
    "convolution": _convolution,
    "convolution_overrideable": _convolution,
    "convolution_backward": _convolution,
    "convolution_backward_overrideable": _convolution,
    "native_group_norm": _group_norm,
    "native_group_norm_backward": _group_norm,
}
