"""Device work whose results nobody holds any more, until it has finished.

`torch.tpu.synchronize()` must wait for every program dispatched so far, as
`torch.cuda.synchronize()` waits for every kernel launched. PJRT has no
"wait for the device" call (on XLA:CPU independent programs may even run
concurrently), so the wait is on buffers: the live ones are in the storage
table, and a buffer dropped while its program may still be running (`a @ a`
whose result nobody keeps) is parked here when its storage dies, and let go once
ready. Buffers are only taken at the moment they are dropped, so nothing here
changes the reference counts the executors read to decide donation.

`retire` runs inside the storage's weakref callback, which the garbage collector
may call in the middle of clearing a frame: calling into JAX there (even
`is_ready()`) crashed CPython 3.11. So `retire` only appends to a deque (atomic,
no lock a collecting thread could already hold), and readiness is checked later,
from ordinary code: `tidy()` when a new storage is made, `pending()` and
`wait_all()`.

A buffer replaced in its storage by one that does not depend on it must be handed
over too (`replaced`): a program's output waits for all its inputs (so an in-place
op's new buffer covers the old one), but a host->device transfer (`copy_` from a
CPU tensor, a storage `copy_`) waits for nothing, and the program computing the old
buffer may still be running when the new one is ready.
"""
from __future__ import annotations

import collections

parked_buffers: collections.deque = collections.deque()
# Past this many parked buffers the oldest is waited for: a bound on host memory,
# like the bounded launch queue of a CUDA stream.
MAX_PARKED = 4096
# tidy() looks at no more than this many parked buffers per call (it runs per new storage;
# csrc/hit.cpp's tidy is handed both bounds)
TIDY_STEP = 8


def ready(buf) -> bool:
    """Whether `buf`'s computation has finished (a donated or deleted buffer: yes)."""
    # donated or deleted: consumed by a later program, nothing to wait for. Asked first:
    # is_ready() of a donated array raises (11 us a call, per in-place op that donated) and of
    # one deleted by .delete() crashes the process (jaxlib 0.10.2). (A HostCopy has no such state.)
    deleted = getattr(buf, "is_deleted", None)
    if deleted is not None and deleted():
        return True
    try:
        return buf.is_ready()
    except Exception:
        return True


def retire(buf) -> None:
    """`buf` (a device buffer, or a placeholder that is not one) is being dropped.
    Called from a weakref callback: no JAX calls, no locks."""
    if hasattr(buf, "is_ready"):
        parked_buffers.append(buf)


def replaced(buf) -> None:
    """`buf` was a storage's buffer and has been replaced by one that does not wait for it
    (a transfer from the host): keep it until it is computed. Ordinary code only."""
    if hasattr(buf, "is_ready") and not ready(buf):
        parked_buffers.append(buf)


def tidy() -> None:
    """Let go of parked buffers that have finished (oldest first, a few per call); past
    MAX_PARKED, wait for the oldest. Called from ordinary code, never from a finalizer."""
    for _ in range(TIDY_STEP):
        try:
            buf = parked_buffers.popleft()
        except IndexError:
            return
        if not ready(buf):
            parked_buffers.appendleft(buf)
            break
    while len(parked_buffers) > MAX_PARKED:
        try:
            _wait(parked_buffers.popleft())
        except IndexError:
            return


def _wait(buf) -> None:
    try:
        buf.block_until_ready()
    except Exception:  # donated or deleted meanwhile
        pass


def _drain_ready() -> list:
    """Drop the finished parked buffers; return the unfinished ones (they stay parked)."""
    out = []
    for _ in range(len(parked_buffers)):
        try:
            buf = parked_buffers.popleft()
        except IndexError:
            break
        if not ready(buf):
            out.append(buf)
            parked_buffers.append(buf)
    return out


# The buffers of live storages, as the storage table lists them: storage.py installs it
# (storage imports this module to park dropped buffers; importing it back would be a cycle).
_live_buffers = [lambda: ()]


def set_live_buffers(fn) -> None:
    _live_buffers[0] = fn


def pending() -> list:
    """Device buffers not yet computed: parked ones and live ones in the storage table."""
    out = _drain_ready()
    for b in _live_buffers[0]():
        if hasattr(b, "is_ready") and not ready(b):
            out.append(b)
    return out


def wait_all() -> None:
    """Block until every program dispatched so far has finished."""
    for b in pending():
        _wait(b)
    _drain_ready()


def parked() -> int:
    return len(parked_buffers)
