"""Which ATen ops aot_autograd decomposes before they reach the compiler.

PyTorch's decompositions (core ATen and the rest of torch._decomp), minus every op the lowering table serves
natively (a native lowering is one XLA op or a hand-fused few; its
decomposition would be many) and minus what the compiler handles itself.
"""
from __future__ import annotations

import functools

import torch

from ..ops import registry
from . import graph


@functools.lru_cache(maxsize=1)
def table() -> dict:
    from torch._decomp import core_aten_decompositions, decomposition_table

    out = {}
    candidates = dict(decomposition_table)
    candidates.update(core_aten_decompositions())
    for op, fn in candidates.items():
        if not isinstance(op, torch._ops.OpOverload):
            continue
        name = graph.overload_name(op)
        low = registry.LOWERINGS.get(name)
        if low is not None and low.mode == "functional":
            continue
        if op in graph.SPECIAL or graph.is_view(op):
            continue
        out[op] = fn
    out.update(_random_factories())
    return out


# Random factories. Eager reaches them through PyTorch's composite kernels (an empty tensor, then
# the in-place draw: uniform_, normal_, random_), each a lowered op; aot_autograd keeps them whole,
# and no lowering serves the whole op, so a compiled graph ran them on CPU (torch.randn: reformer's
# LSH rotations; randn_like: vits' and vibevoice's noise; rrelu in training). Each decomposes here
# to the same draw as eager's: a fresh tensor and the lowered functional twin of the in-place op
# (rrelu: eager's own kernel, written in torch ops).
# (aten.randn's own decomposition ends in prims.normal, which no lowering serves either.)
_aten = torch.ops.aten
_random_from = getattr(_aten.random, "from")  # random.from: `from` is a Python keyword


def _empty(size, dtype, layout, device, pin_memory, default=None):
    return torch.empty(size, dtype=dtype if dtype is not None else (default or torch.get_default_dtype()),
                       layout=layout, device=device, pin_memory=pin_memory)


def _empty_like(self, dtype, layout, device, pin_memory, memory_format):
    return torch.empty_like(self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                            memory_format=memory_format if memory_format is not None else torch.preserve_format)


def _randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _aten.normal.float_float(0.0, 1.0, size, generator=generator, dtype=dtype, layout=layout, device=device,
                                    pin_memory=pin_memory)


def _rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _aten.uniform(_empty(size, dtype, layout, device, pin_memory), 0.0, 1.0, generator=generator)


def _randint(high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint_low(0, high, size, generator=generator, dtype=dtype, layout=layout, device=device,
                        pin_memory=pin_memory)


def _randint_low(low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    empty = _empty(size, dtype, layout, device, pin_memory, default=torch.int64)
    return _random_from(empty, low, high, generator=generator)


def _randn_like(self, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                memory_format=None):
    empty = _empty_like(self, dtype, layout, device, pin_memory, memory_format)
    return _aten.normal_functional(empty, 0.0, 1.0, generator=generator)


def _rand_like(self, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    empty = _empty_like(self, dtype, layout, device, pin_memory, memory_format)
    return _aten.uniform(empty, 0.0, 1.0, generator=generator)


def _randint_like(self, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                  memory_format=None):
    return _randint_like_low(self, 0, high, generator=generator, dtype=dtype, layout=layout, device=device,
                             pin_memory=pin_memory, memory_format=memory_format)


def _randint_like_low(self, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                      memory_format=None):
    empty = _empty_like(self, dtype, layout, device, pin_memory, memory_format)
    return _random_from(empty, low, high, generator=generator)


def _random_factories() -> dict:
    from ..ops.nn_extra import rrelu_with_noise_functional  # eager's kernel: torch ops that trace

    return {
        _aten.randn.default: _randn, _aten.randn.generator: _randn,
        _aten.rand.default: _rand, _aten.rand.generator: _rand,
        _aten.randint.default: _randint, _aten.randint.generator: _randint,
        _aten.randint.low: _randint_low, _aten.randint.low_generator: _randint_low,
        _aten.randn_like.default: _randn_like, _aten.randn_like.generator: _randn_like,
        _aten.rand_like.default: _rand_like, _aten.rand_like.generator: _rand_like,
        _aten.randint_like.default: _randint_like, _aten.randint_like.generator: _randint_like,
        _aten.randint_like.low_dtype: _randint_like_low, _aten.randint_like.low_generator_dtype: _randint_like_low,
        _aten.rrelu_with_noise_functional.default: rrelu_with_noise_functional,
        _aten.repeat_interleave.Tensor: _repeat_interleave_tensor,
    }


def _repeat_interleave_tensor(repeats, *, output_size=None):
    """With output_size the result's shape is known: eager's composite of lowered ops (kimi_k25's
    patch-to-video index). Without it the size is data-dependent and the op stays whole."""
    if output_size is None:
        return NotImplemented
    from ..ops.indexing import repeat_interleave_sized

    return repeat_interleave_sized(repeats, output_size)


# PyTorch serves two loss ops by a Python decomposition at the Autograd key (a py_impl that runs
# whenever the Python dispatcher is on, as under aot_autograd), so a compiled graph records the
# decomposition's ops in place of the op, whatever the decomposition table says. Those two
# decompositions compute something else than the kernels: multilabel_margin_loss_forward counts
# the targets after a row's first -1 (a row [1, -1, 2, 2, 2] of a (3, 5) input: 6.65 where CPU's
# kernel gives 0.33) and multi_margin_loss's reduction='none' of a 1-D input has shape [1] where
# CPU's has []. Without the py_impl the op reaches the graph whole (its lowering, as in eager) and
# its backward is the op's own derivative formula, as in eager.
_WRONG_AUTOGRAD_DECOMPOSITIONS = (_aten.multilabel_margin_loss_forward.default, _aten.multi_margin_loss.default)


def keep_whole() -> None:
    """Drop PyTorch's Autograd-key decompositions of the ops above (once, before tracing)."""
    from torch._C import DispatchKey

    for op in _WRONG_AUTOGRAD_DECOMPOSITIONS:
        if op.py_kernels.pop(DispatchKey.Autograd, None) is not None:
            op._dispatch_cache.clear()
