"""Storage buffers not computed yet, and ones whose computation failed.

A storage entry's `buf` (runtime/storage.py) is a jax.Array, None (never written), or
one of the two types here. defer_and_fuse (eager/deferred.py) gives the storages its
recorded ops write a `Pending`; running the region replaces it with the array, or with
a `Failed` when the region raised (and device-side checks mark what a tripped program
wrote `Failed`, runtime/checks.py). The runtime sees such buffers only through this
module: it defines the types and asks the materializer the eager layer installs to run
what is pending, so runtime/ never imports eager/.
"""
from __future__ import annotations

import copy
from typing import Callable


class Pending:
    """A buffer that a recorded op will produce: (node index, output key) in the region being
    recorded (every Pending an entry holds is the current region's: a flush gives each live
    one its array or a Failed). It holds no reference to the region: the region lists its
    Pendings, and a back reference made each recorded region a reference cycle that only
    Python's cyclic GC freed, pushing it into full collections of the whole heap."""

    __slots__ = ("node", "key")  # csrc/record.h writes these itself: keep __init__ a plain store

    def __init__(self, node: int, key):
        self.node = node
        self.key = key


class Failed:
    """A buffer whose computation failed; reading it re-raises."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        # a copy without its traceback: the storage table holds this entry, and the traceback's
        # frames hold the tensors of the failed call (a 256 GiB one that ran out of memory),
        # which would keep their storages, and so this entry, alive for good
        try:
            error = copy.copy(error)
        except Exception:
            error = RuntimeError(f"{type(error).__name__}: {error}")
        error.__traceback__ = None
        self.error = error

    def raise_(self):
        raise RuntimeError(
            f"torchtpu: this tensor's value was lost because computing it failed earlier: "
            f"{type(self.error).__name__}: {self.error}"
        ) from self.error


def _nothing_pending(reason: str) -> None:
    """Before the deferred executor is imported nothing can be pending (only it makes Pendings)."""


_materialize: list[Callable[[str], None]] = [_nothing_pending]


def install(materialize: Callable[[str], None]) -> None:
    """Set what runs every pending region (eager/deferred.py's flush); called at its import,
    before any Pending exists."""
    _materialize[0] = materialize


def materialize(reason: str) -> None:
    """Compute every pending buffer (a no-op when nothing is pending)."""
    _materialize[0](reason)


def concrete(entry, reason: str):
    """The entry's buffer as an array (or None, never written): a pending one is computed
    first (`reason` is counted as the materialization's cause), a failed one raises."""
    b = entry.buf
    tries = 0
    while type(b) is Pending:
        # (again only when another thread recorded a new write into this storage meanwhile)
        if tries == 8:
            raise RuntimeError(f"torchtpu: a deferred buffer was still pending after {tries} runs of its region "
                               f"({reason}): other threads keep writing this storage")
        _materialize[0](reason)
        b = entry.buf
        tries += 1
    if type(b) is Failed:
        b.raise_()
    return b
