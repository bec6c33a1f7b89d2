"""Handing buffers to XLA to overwrite (donation) while keeping the others.

jax.jit donates whole arguments, so a program that may overwrite some of its buffers
takes them as two arguments: the donated ones in a list of their own, and the kept
ones with None where a donated one was. The caller's list must drop its reference to a
donated buffer: a reference count is how the callers tell that nothing else holds it.
"""
from __future__ import annotations


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
