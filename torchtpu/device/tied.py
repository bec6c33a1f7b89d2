"""`module.to("tpu")` keeps tied parameters tied.

Moving CPU -> CUDA swaps each parameter's data in place (`param.data = new`), so
two modules sharing one Parameter (an LM head tied to the embedding) still share
it. PyTorch allows that only between "dense" backends and PrivateUse1 is not one,
so `Module._apply` makes a new Parameter per module and the tie breaks: the head
and the embedding then train apart. PyTorch/XLA users call `model.tie_weights()`
after moving; here the tie is restored where it broke.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

_state = {"depth": 0}


def _shared(root: nn.Module) -> list[list[tuple[nn.Module, str, str]]]:
    """Groups of (module, attribute, kind) slots that hold the same tensor object."""
    groups: dict[int, list] = {}
    for mod in root.modules():
        for kind, table in (("p", mod._parameters), ("b", mod._buffers)):
            for name, t in table.items():
                if t is not None:
                    groups.setdefault(id(t), []).append((mod, name, kind))
    return [g for g in groups.values() if len(g) > 1]


def _retie(groups) -> None:
    for group in groups:
        mod, name, kind = group[0]
        first = (mod._parameters if kind == "p" else mod._buffers)[name]
        for mod, name, kind in group[1:]:
            table = mod._parameters if kind == "p" else mod._buffers
            if table[name] is not first:
                table[name] = first


def install() -> None:
    """Wrap nn.Module._apply once; only the outermost call looks for ties."""
    if getattr(nn.Module._apply, "_torchtpu_ties", False):
        return
    original = nn.Module._apply

    @functools.wraps(original)
    def _apply(self, fn, recurse=True):
        if _state["depth"]:
            return original(self, fn, recurse)
        groups = _shared(self)
        _state["depth"] += 1
        try:
            out = original(self, fn, recurse)
        finally:
            _state["depth"] -= 1
        if groups:
            _retie(groups)
        return out

    _apply._torchtpu_ties = True
    nn.Module._apply = _apply
