"""Streams and events on torch.tpu, for code written against torch.cuda's API.

FSDP2 (fully_shard) asks the device module for `Stream(priority=)`, `Event()`,
`current_stream()` and `stream(s)`, and records/waits events between its
all-gather, reduce-scatter and compute streams. torchtpu has one stream per
device: every op is dispatched in program order and ordered by data dependence,
so a stream is torch's generic `torch.Stream` on "tpu" (the device guard's
stream id 0), waits are no-ops, and synchronizing a stream drains the device.
Events (timing included) are in events.py.
"""
from __future__ import annotations

import contextlib

import torch

from .events import TpuEvent as Event  # noqa: E402  (torch.tpu.Event, timing included)


class Stream(torch.Stream):
    """torch.Stream on "tpu" (every stream is the device's one stream, id 0)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device="tpu", priority=priority)

    def __init__(self, *args, **kwargs):
        pass

    def synchronize(self) -> None:
        """Wait for all work dispatched so far (the one stream is the whole device)."""
        torch.tpu.synchronize()

    def query(self) -> bool:
        from ..runtime import inflight

        return not inflight.pending()

    def record_event(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event) -> None:
        pass  # one stream: already ordered

    def wait_stream(self, stream) -> None:
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
