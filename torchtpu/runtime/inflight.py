"""Device work whose results nobody holds any more, until it has finished.

`torch.tpu.synchronize()` must wait for every program dispatched so far, as
`torch.cuda.synchronize()` waits for every kernel launched. PJRT has no
"wait for the device" call (on XLA:CPU independent programs may even run
concurrently), so the wait is on buffers: the live ones are in the storage
table, and a buffer dropped while its program is still running (`a @ a` whose
result nobody keeps) is parked here when its storage dies, and let go once
ready. Holding it costs no memory: PJRT keeps an in-flight buffer allocated
until its program finishes anyway. Buffers are only taken at the moment they
are dropped, so nothing here changes the reference counts the executors read
to decide donation.
"""
from __future__ import annotations

import collections
import threading

_parked: collections.deque = collections.deque()
_lock = threading.Lock()
# Past this many parked buffers the oldest is waited for: a bound on host memory,
# like the bounded launch queue of a CUDA stream.
MAX_PARKED = 4096


def _ready(buf) -> bool:
    try:
        return buf.is_ready()
    except Exception:  # donated or deleted: consumed by a later program, nothing to wait for
        return True


def retire(buf) -> None:
    """`buf` (a device buffer, or a placeholder that is not one) is being dropped."""
    is_ready = getattr(buf, "is_ready", None)
    if is_ready is None or _ready(buf):
        return
    with _lock:
        _parked.append(buf)
        # let go of the ones that finished meanwhile (oldest first)
        while _parked and _ready(_parked[0]):
            _parked.popleft()
        oldest = _parked.popleft() if len(_parked) > MAX_PARKED else None
    if oldest is not None:
        _wait(oldest)


def _wait(buf) -> None:
    try:
        buf.block_until_ready()
    except Exception:  # donated or deleted meanwhile
        pass


def pending() -> list:
    """Device buffers not yet computed: parked ones and live ones in the storage table."""
    from .storage import _table

    with _lock:
        out = [b for b in _parked if not _ready(b)]
    for entry in list(_table.values()):
        b = entry.buf
        if hasattr(b, "is_ready") and not _ready(b):
            out.append(b)
    return out


def wait_all() -> None:
    """Block until every program dispatched so far has finished."""
    for b in pending():
        _wait(b)
    with _lock:
        while _parked and _ready(_parked[0]):
            _parked.popleft()


def parked() -> int:
    return len(_parked)
