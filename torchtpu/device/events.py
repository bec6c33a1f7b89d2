"""torch.Event / torch.tpu.Event on "tpu": record, wait, query, synchronize, elapsed_time.

PyTorch's torch.Event is a C++ type whose record/synchronize/elapsed_time go to the
device guard's C++ implementation, which a Python backend cannot provide (they raise
"Backend doesn't support synchronizing events"). `install()` puts a subclass in its
place: for device "tpu" the methods below run, for every other device the C++ ones.
`isinstance(e, torch.Event)` still holds for events PyTorch's C++ creates.

There is one stream (every op is ordered by dispatch and data dependence), so an
event marks "all work dispatched so far". A timing event's time is when that work
has *finished on the device*, not when the host issued it: at record the buffers
not yet computed (inflight.pending(), dropped results included) are handed to a
waiter thread, which stamps the moment the last of them is ready. elapsed_time is
the difference of two such stamps, in milliseconds, like CUDA's. An event without
timing records nothing (FSDP2 records one per layer; it must stay free and must not
cut a defer_and_fuse region); its synchronize() waits for the whole device.
"""
from __future__ import annotations

import queue
import threading
import time

import torch

from .replacing import Replacing, original  # noqa: E402

_CEvent = original(torch.Event)  # PyTorch's own type, captured before install() replaces the name


class _Waiter:
    """One daemon thread stamping the completion of recorded timing events, in order."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()
        self.thread = None
        self.lock = threading.Lock()

    def submit(self, ev, bufs) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="torchtpu-events", daemon=True)
                self.thread.start()
        self.q.put((ev, bufs))

    def _run(self):
        from ..runtime.inflight import _wait

        while True:
            ev, bufs = self.q.get()
            for b in bufs:
                _wait(b)
            del bufs
            ev._done_at = time.perf_counter()
            ev._done.set()


_waiter = _Waiter()


class Event(_CEvent, metaclass=Replacing):
    """torch.Event(device=None, *, enable_timing=False, blocking=False, interprocess=False)."""

    _stands_for = _CEvent  # events PyTorch creates in C++ (Stream.record_event) are torch.Events too

    def __new__(cls, device=None, *, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False):
        self = super().__new__(cls, device=device, enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)
        self._tpu = self.device.type == "tpu"
        self._timing = enable_timing
        self._recorded = False
        self._done = None
        self._done_at = None
        return self

    def __init__(self, *args, **kwargs):  # __new__ did the work
        pass

    def record(self, stream=None) -> None:
        if not self._tpu:
            return super().record(stream) if stream is not None else super().record()
        self._recorded = True
        if not self._timing:
            return
        from ..eager import deferred
        from ..runtime import inflight

        deferred.flush("event_record")  # the recorded work must be on the device to be timed
        self._done = threading.Event()
        bufs = inflight.pending()
        if not bufs:
            self._done_at = time.perf_counter()
            self._done.set()
        else:
            self._done_at = None
            _waiter.submit(self, bufs)

    def wait(self, stream=None) -> None:
        if not self._tpu:
            return super().wait(stream) if stream is not None else super().wait()
        # one stream: later work is already ordered after everything recorded

    def query(self) -> bool:
        if not self._tpu:
            return super().query()
        if not self._recorded:
            return True
        if self._done is not None:
            return self._done.is_set()
        from ..runtime import inflight

        return not inflight.pending()

    def synchronize(self) -> None:
        if not self._tpu:
            return super().synchronize()
        if not self._recorded:
            return
        if self._done is not None:
            self._done.wait()
        else:
            torch.tpu.synchronize()

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between the device finishing the work before this event and the
        work before `end_event` (both must be recorded, with enable_timing=True)."""
        if not self._tpu:
            return super().elapsed_time(end_event)
        if not isinstance(end_event, Event) or not getattr(end_event, "_tpu", False):
            raise TypeError("elapsed_time: expected a torch.Event on tpu as end_event")
        if not (self._timing and end_event._timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if not (self._recorded and end_event._recorded):
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        self._done.wait()
        end_event._done.wait()
        return (end_event._done_at - self._done_at) * 1000.0

    def __repr__(self) -> str:
        if not self._tpu:
            return super().__repr__()
        return f"torch.tpu.Event(enable_timing={self._timing}, recorded={self._recorded})"


class TpuEvent(Event):
    """torch.tpu.Event(enable_timing=False, blocking=False, interprocess=False), as torch.cuda.Event."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, "tpu", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)


def install() -> None:
    """torch.Event(device="tpu") gets the methods above (other devices keep PyTorch's)."""
    torch.Event = Event
