"""The user's line that issued an op: what errors and deferred nodes name.

Walks the Python stack past torch's and torchtpu's own frames (whether a code object is
internal is remembered per code object, so the walk costs a dict lookup per frame).
"""
from __future__ import annotations

import os
import sys

from ..runtime import cache as _caches

_SKIP_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (sys.modules["torch"], sys.modules["torchtpu"])
)
internal_code: dict = _caches.register("issuing code", {})  # code object -> torch's or torchtpu's (not the user's)?


def user_frame():
    """The user's (file, line, function) that issued the current op, if any."""
    f = sys._getframe(1)
    internal = internal_code
    while f is not None:
        code = f.f_code
        try:
            skip = internal.get(code)
        except TypeError:  # a code object hashes its constants: Dynamo's resume functions hold slices
            skip = is_internal(code)
        if skip is None:
            skip = internal[code] = is_internal(code)
        if not skip:
            return (code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return None


def is_internal(code) -> bool:
    fn = code.co_filename
    return fn.startswith(_SKIP_DIRS) or fn.startswith("<frozen")


def where(frame) -> str | None:
    """A user_frame() as text ("file:line in function")."""
    return f"{frame[0]}:{frame[1]} in {frame[2]}" if frame else None
