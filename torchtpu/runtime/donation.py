"""Handing buffers to XLA to overwrite (donation) while keeping the others.

jax.jit donates whole arguments, so a program that may overwrite some of its buffers
takes them as two arguments: the donated ones in a list of their own, and the kept
ones with None where a donated one was. The caller's list must drop its reference to a
donated buffer: a reference count is how the callers tell that nothing else holds it.
"""
from __future__ import annotations

import sys


def split(bufs: list, donate) -> list:
    """Take the buffers at the positions in `donate` out of `bufs` (left None there)."""
    donated = [bufs[i] for i in donate]
    for i in donate:
        bufs[i] = None
    return donated


def merge(donated, kept, donate) -> list:
    """Inside the program: every buffer back at its position."""
    bufs = list(kept)
    for i, b in zip(donate, donated):
        bufs[i] = b
    return bufs


# ---- who else holds a buffer ------------------------------------------------------------------
#
# A buffer may be donated only when nothing outside the program's own arguments can see it
# (no other storage, no deferred region, no user's jax.Array from to_jax). The only cheap
# way to know is its reference count, whose value for one and the same situation is a
# CPython detail (3.14 stops counting some references the evaluation stack holds). So the
# count is taken in one expression shape only, here, and calibrated at import against an
# element nothing else holds: the rule reads "the container and `holders` known others".
# Supported: CPython 3.11-3.13 (tests/test_donation.py pins the value there and checks the
# rule end to end on whichever Python runs it).


def _refs(container, i) -> int:
    return sys.getrefcount(container[i])


ALONE = _refs([object()], 0)  # a container's element nothing else holds, as counted here


def exclusively_held(container, i: int, holders: int = 0) -> bool:
    """Whether container[i] is held by `container` and `holders` other references the caller
    knows of (the storage entry whose buffer it is), and by nothing else. The caller must not
    hold it in a local variable of its own while asking."""
    return sys.getrefcount(container[i]) == ALONE + holders
