"""Streams and events on torch.tpu, for code written against torch.cuda's API.

FSDP2 (fully_shard) asks the device module for `Stream(priority=)`, `Event()`,
`current_stream()` and `stream(s)`, and records/waits events between its
all-gather, reduce-scatter and compute streams. torchtpu has one stream per
device: every op is dispatched in program order and ordered by data dependence,
so a stream is torch's generic `torch.Stream` on "tpu" (the device guard's
stream id 0), waits are no-ops, and synchronizing an event drains the device.
"""
from __future__ import annotations

import contextlib

import torch

class Event(torch.Event):
    """torch.Event on "tpu"; synchronize() blocks until the queued work has finished."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device="tpu", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def __init__(self, *args, **kwargs):  # the torch.Event constructor did the work
        pass

    def synchronize(self) -> None:
        torch.tpu.synchronize()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


class Stream(torch.Stream):
    """torch.Stream on "tpu" (every stream is the device's one stream, id 0)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device="tpu", priority=priority)

    def __init__(self, *args, **kwargs):
        pass


def current_stream(device=None) -> torch.Stream:
    return Stream()


def default_stream(device=None) -> torch.Stream:
    return Stream()


def set_stream(stream) -> None:
    pass


@contextlib.contextmanager
def stream(s):
    yield s
