"""A torch.library schema for a JAX function, read from its Python signature.

Tensor parameters (annotated `jax.Array`, or unannotated without a default) arrive as JAX
arrays; numbers, bools, strings, dtypes and tuples of numbers are static values that shape
the program (each distinct value compiles its own executable, as a kernel's block sizes
must). What cannot be expressed this way is refused at registration, naming the parameter.
"""
from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass

import torch

_P = inspect.Parameter


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # the schema type: "Tensor", "Tensor?", "Tensor[]", "int", "int[]", "float?", ...
    default: object = _P.empty
    kwarg_only: bool = False

    @property
    def tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    returns: str  # "Tensor", "Tensor[]" or "(Tensor, Tensor, ...)"

    @property
    def num_outputs(self) -> int | None:
        """Outputs the function returns: 1 for "Tensor", n for a tuple, None for a list."""
        if self.returns == "Tensor":
            return 1
        if self.returns == "Tensor[]":
            return None
        return self.returns.count("Tensor")

    def schema(self) -> str:
        """"(Tensor x, Tensor w, *, float eps=1e-06) -> Tensor"."""
        parts, star = [], False
        for p in self.params:
            if p.kwarg_only and not star:
                parts.append("*")
                star = True
            text = f"{p.type} {p.name}"
            if p.default is not _P.empty:
                text += "=" + _default_text(p.default)
            parts.append(text)
        return f"({', '.join(parts)}) -> {self.returns}"


_SCALAR_TYPES = {bool: "bool", int: "int", float: "float", str: "str", torch.dtype: "ScalarType"}


def _is_array_type(t) -> bool:
    if isinstance(t, str):
        return t.rsplit(".", 1)[-1] in ("Array", "ndarray", "ArrayLike", "Tensor")
    import jax

    if t in (jax.Array, torch.Tensor):
        return True
    name = getattr(t, "__name__", "")
    return name in ("Array", "ndarray", "ArrayLike") and "jax" in getattr(t, "__module__", "")


def _type_of(ann, what: str) -> str:
    """The schema type of an annotation (an object or, under `from __future__ import
    annotations`, its text)."""
    if isinstance(ann, str):
        text = ann.replace(" ", "")
        optional = text.endswith("|None") or text.startswith("Optional[")
        core = text.removesuffix("|None").removeprefix("Optional[")
        if text.startswith("Optional["):
            core = core[:-1]
        if _is_array_type(core):
            return "Tensor?" if optional else "Tensor"
        for py, name in (("bool", "bool"), ("int", "int"), ("float", "float"), ("str", "str")):
            if core == py:
                return name + ("?" if optional else "")
            if core in (f"tuple[{py},...]", f"list[{py}]", f"Sequence[{py}]"):
                return name + "[]" + ("?" if optional else "")
        if core in ("list[jax.Array]", "Sequence[jax.Array]", "tuple[jax.Array,...]", "list[Array]"):
            return "Tensor[]"
        raise TypeError(f"{what}: annotation {ann!r} has no torch schema type")
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = _type_of(rest[0], what)
            if inner.endswith("?") or inner == "Tensor[]":
                raise TypeError(f"{what}: annotation {ann!r} has no torch schema type")
            return inner + "?"
        raise TypeError(f"{what}: annotation {ann!r} has no torch schema type (one type, or it and None)")
    if _is_array_type(ann):
        return "Tensor"
    if ann in _SCALAR_TYPES:
        return _SCALAR_TYPES[ann]
    import collections.abc

    if origin in (tuple, list, collections.abc.Sequence):
        el = args[0] if args else None
        if origin is tuple and len(args) > 1 and args[-1] is not Ellipsis:
            if len(set(args)) != 1:
                raise TypeError(f"{what}: annotation {ann!r}: a tuple's elements must share one type")
            el = args[0]
        if el is not None and _is_array_type(el):
            return "Tensor[]"
        if el in (bool, int, float):
            return _SCALAR_TYPES[el] + "[]"
    raise TypeError(f"{what}: annotation {ann!r} has no torch schema type")


def _type_of_default(value, what: str) -> str:
    if value is None:
        return "Tensor?"
    for py in (bool, int, float, str):
        if isinstance(value, py):
            return _SCALAR_TYPES[py]
    if isinstance(value, (tuple, list)):
        for py in (bool, int, float):
            if value and all(type(v) is py for v in value):
                return _SCALAR_TYPES[py] + "[]"
        if not value:
            return "int[]"
    raise TypeError(
        f"{what}: default {value!r} is not a static value a schema can hold "
        "(a number, bool, str, tuple of numbers or None); pass arrays as arguments"
    )


def _default_text(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_default_text(v) for v in value) + "]"
    return repr(value)


def infer(name: str, fn, num_outputs: int | None) -> Signature:
    """The schema of `fn` as a torch op named `name`."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise TypeError(f"torchtpu.jax_op({name!r}): cannot read the signature of {fn!r}: {err}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # names of another module under `from __future__ import annotations`
        hints = {}
    params = []
    for p in sig.parameters.values():
        what = f"torchtpu.jax_op({name!r}): parameter {p.name!r}"
        if p.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            raise TypeError(f"{what}: *args/**kwargs have no schema; name every parameter")
        ann = hints.get(p.name, p.annotation)
        if ann is not _P.empty:
            typ = _type_of(ann, what)
        elif p.default is _P.empty:
            typ = "Tensor"
        else:
            typ = _type_of_default(p.default, what)
        kwarg_only = p.kind is _P.KEYWORD_ONLY
        if typ.startswith("Tensor") and kwarg_only:
            raise TypeError(f"{what}: an array parameter cannot be keyword-only")
        if p.default is not _P.empty and p.default is not None and typ.startswith("Tensor"):
            raise TypeError(f"{what}: an array parameter's default can only be None")
        default = p.default
        if default is not _P.empty and default is not None and typ.endswith("[]"):
            default = tuple(default)
        params.append(Param(p.name, typ, default, kwarg_only))
    if not any(p.tensor for p in params):
        raise TypeError(f"torchtpu.jax_op({name!r}): {fn!r} takes no array argument (the op's device "
                        "comes from its tensors)")
    returns = _returns(name, hints.get("return", sig.return_annotation), num_outputs)
    return Signature(tuple(params), returns)


def _returns(name: str, ann, num_outputs: int | None) -> str:
    if num_outputs is not None:
        if num_outputs < 1:
            raise ValueError(f"torchtpu.jax_op({name!r}): num_outputs must be at least 1")
        return "Tensor" if num_outputs == 1 else "(" + ", ".join(["Tensor"] * num_outputs) + ")"
    if ann is _P.empty or ann is None:
        return "Tensor"
    what = f"torchtpu.jax_op({name!r}): return annotation"
    if isinstance(ann, str):
        text = ann.replace(" ", "")
        if _is_array_type(text):
            return "Tensor"
        if text.startswith("tuple[") and text.endswith("]"):
            items = text[6:-1].split(",")
            if all(_is_array_type(i) for i in items):
                return "(" + ", ".join(["Tensor"] * len(items)) + ")"
            if len(items) == 2 and items[1] == "..." and _is_array_type(items[0]):
                return "Tensor[]"
        if text in ("list[jax.Array]", "list[Array]"):
            return "Tensor[]"
        raise TypeError(f"{what} {ann!r}: expected jax.Array or a tuple of them")
    if _is_array_type(ann):
        return "Tensor"
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis and _is_array_type(args[0]):
            return "Tensor[]"
        if all(_is_array_type(a) for a in args):
            return "(" + ", ".join(["Tensor"] * len(args)) + ")"
    if origin is list and args and _is_array_type(args[0]):
        return "Tensor[]"
    raise TypeError(f"{what} {ann!r}: expected jax.Array or a tuple of them")
