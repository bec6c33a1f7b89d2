"""CPU's checked conversion of a Python number into a tensor's dtype (c10::checked_convert).

fill_, full, masked_fill, index_fill, scatter's value and clamp's bounds convert their number
to the dtype they write with `Scalar::to<T>()`, which refuses a value the dtype cannot hold:
`torch.full((2,), 300, dtype=torch.uint8)`, `x.fill_(float("nan"))` on int64, `clamp(min=1e39)`
on float32 raise "value cannot be converted to type uint8_t without overflow". JAX wraps or
saturates them into a number (44, 0, inf). c10's rules, for the checks below:

- a float value: NaN overflows a dtype without NaN (the integers), +-inf never overflows a
  dtype with infinities, else anything below the dtype's lowest or above its max;
- an integer value into an unsigned dtype: above max, or below -max (two's complement wrap is
  allowed: -1 fills uint8 with 255); into any other dtype, float16's included: below its
  lowest or above its max;
- a bool value, and anything into bool or a complex dtype: never (complex values are the dtype
  verdicts' business, eager/argcheck.py).

Then pow of an integer (or bool) tensor by a negative integer number, which CPU refuses with
"Integers to negative integer powers are not allowed." (a negative exponent tensor computes).
"""
from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .registry import LOWERINGS

# c10's names for the dtypes in its message
_C_NAMES = {
    torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int",
    torch.int64: "int64_t", torch.uint16: "uint16_t", torch.uint32: "uint32_t", torch.uint64: "uint64_t",
    torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float", torch.float64: "double",
}


def overflows(value, dtype: torch.dtype) -> bool:
    """Whether c10 refuses to convert the number `value` into `dtype`."""
    if dtype not in _C_NAMES or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    if isinstance(value, float):
        if math.isnan(value):
            return not dtype.is_floating_point
        if math.isinf(value) and dtype.is_floating_point:
            return False
        return value < info.min or value > info.max
    if info.min == 0:  # unsigned: negative values wrap
        return value > info.max or -value > info.max
    return value < info.min or value > info.max


def check_convert(value, dtype: torch.dtype) -> None:
    if overflows(value, dtype):
        raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dtype]} without overflow")


def _number(v):
    """A Python number, or a 0-d CPU tensor's (a Scalar argument may arrive as one)."""
    if isinstance(v, torch.Tensor):  # (a compiled graph's FakeTensor has no value to read)
        real = v.device.type == "cpu" and v.dim() == 0 and not v.is_complex() and not isinstance(v, FakeTensor)
        return v.item() if real else None
    return v


def _value_check(name: str, position: int):
    """The check of an op writing its number argument `name` (positional `position`) into self."""
    def check(self, *args, **kwargs):
        value = args[position - 1] if len(args) >= position else kwargs.get(name)
        check_convert(_number(value), self.dtype)
    return check


def _full_check(size, fill_value, *rest, dtype=None, **kw):
    v = _number(fill_value)
    if dtype is None:  # full infers its dtype from the value
        if isinstance(v, bool) or not isinstance(v, float):
            return
        dtype = torch.get_default_dtype()
    check_convert(v, dtype)


def _clamp_check(self, min=None, max=None, *rest, **kw):
    bounds = [b for b in (_number(min), _number(max)) if isinstance(b, (int, float)) and not isinstance(b, bool)]
    if not bounds:
        return
    dt = torch.result_type(self, bounds[0]) if len(bounds) == 1 else \
        torch.promote_types(torch.result_type(self, bounds[0]), torch.result_type(self, bounds[1]))
    for b in bounds:
        check_convert(b, dt)


def _one_bound_check(self, bound, *rest, **kw):
    b = _number(bound)
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        check_convert(b, torch.result_type(self, b))


def _pow_check(self, exponent, *rest, **kw):
    e = _number(exponent)
    if isinstance(e, int) and not isinstance(e, bool) and e < 0 and isinstance(self, torch.Tensor) \
            and not (self.dtype.is_floating_point or self.dtype.is_complex):
        raise RuntimeError("Integers to negative integer powers are not allowed.")


_CHECKS = {
    "fill.Scalar": _value_check("value", 1),
    "masked_fill.Scalar": _value_check("value", 2),
    "index_fill.int_Scalar": _value_check("value", 3),
    "scatter.value": _value_check("value", 3),
    "scatter.value_reduce": _value_check("value", 3),
    "full": _full_check,
    "clamp": _clamp_check,
    "clamp_min": _one_bound_check,
    "clamp_max": _one_bound_check,
    "pow.Tensor_Scalar": _pow_check,
}

for _name, _check in _CHECKS.items():
    assert LOWERINGS[_name].check is None, _name  # (one check per lowering: none was set before)
    _check.in_graphs = True  # compile/graph.py runs it per node on the graph's constants
    LOWERINGS[_name].check = _check
