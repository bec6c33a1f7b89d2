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

import torch

from .events import TpuEvent as Event  # noqa: E402  (torch.tpu.Event, timing included)
from .replacing import Replacing, original  # noqa: E402


_CStream = original(torch.Stream)  # PyTorch's own type, captured before install() replaces the name


class AnyStream(_CStream, metaclass=Replacing):
    """torch.Stream: on "tpu" the methods below (PyTorch's C++ ones reach a device guard a
    Python backend cannot give a stream, so synchronize() returned at once, before a
    non-blocking copy had landed); every other device keeps PyTorch's."""

    _stands_for = _CStream  # streams PyTorch creates in C++ (torch.accelerator, the device guard)

    def synchronize(self) -> None:
        """Wait for all work dispatched so far (the one stream is the whole device)."""
        if self.device.type != "tpu":
            return super().synchronize()
        torch.tpu.synchronize()

    def query(self) -> bool:
        if self.device.type != "tpu":
            return super().query()
        from ..runtime import inflight

        return not inflight.pending()

    def record_event(self, event=None):
        if self.device.type != "tpu":
            return super().record_event(event) if event is not None else super().record_event()
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event) -> None:
        if self.device.type != "tpu":
            return super().wait_event(event)
        # one stream: already ordered

    def wait_stream(self, stream) -> None:
        if self.device.type != "tpu":
            return super().wait_stream(stream)


class Stream(AnyStream):
    """torch.tpu.Stream: torch.Stream on "tpu" (every stream is the device's one stream, id 0)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, device=f"tpu:{_index(device)}", priority=priority)

    def __init__(self, *args, **kwargs):
        pass


def install() -> None:
    """torch.Stream(device="tpu") gets the methods above (other devices keep PyTorch's)."""
    torch.Stream = AnyStream


# index -> that device's one stream. Dynamo asks for the current stream on every call of a
# compiled function with tpu inputs (torch.accelerator.current_stream): a new Stream object
# each time cost more than the rest of the call's bookkeeping. A stream is immutable and
# every tpu stream is the device's one stream, so one object per device serves every ask.
_streams: dict[int, torch.Stream] = {}


def current_stream(device=None) -> torch.Stream:
    i = _index(device)
    s = _streams.get(i)
    if s is None:
        s = _streams[i] = Stream(i)
    return s


def default_stream(device=None) -> torch.Stream:
    return current_stream(device)


def _index(device) -> int:
    """The device index `device` names (None, "tpu" or -1: the current device)."""
    from ..runtime import placement

    if device is None or device == -1:
        return placement.current()
    if isinstance(device, int):
        return placement.current() if device < 0 else placement.index_of(device, "Stream")
    return placement.index_of(torch.device(device), "Stream")


def set_stream(stream) -> None:
    pass


class StreamContext:
    """torch.tpu.stream(s)'s context manager (torch.cuda.StreamContext's counterpart): every
    tpu stream is the device's one stream, so entering one changes no ordering; `s` may be
    None, as on CUDA."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc) -> None:
        return None


def stream(s) -> StreamContext:
    return StreamContext(s)
