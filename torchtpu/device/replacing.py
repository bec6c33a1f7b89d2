"""A Python subclass installed in place of one of PyTorch's C++ types (torch.Event,
torch.Stream) so that tpu objects get our methods.

PyTorch also creates the original type in C++ (Stream.record_event, torch.accelerator, the
device guard), and those objects must still pass `isinstance(x, torch.Event)` once the name
points at our subclass. The root replacement class names the type it stands for in
`_stands_for`; isinstance/issubclass against that class (not its own subclasses) check the
original type instead."""
from __future__ import annotations


class Replacing(type):
    def __instancecheck__(cls, obj):
        return type.__instancecheck__(cls.__dict__.get("_stands_for", cls), obj)

    def __subclasscheck__(cls, sub):
        return type.__subclasscheck__(cls.__dict__.get("_stands_for", cls), sub)


def original(t: type) -> type:
    """PyTorch's own type behind torch.<name> `t`, which may already be a stand-in (autoload
    puts one in place of torch.Event/torch.Stream until torchtpu loads: device/lazy.py)."""
    return t.__dict__.get("_stands_for", t)
