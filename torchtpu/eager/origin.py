"""The user's line that issued an op: what errors and deferred nodes name.

Walks the Python stack past torch's and torchtpu's own frames (whether a code object is
internal is remembered per code object, so the walk costs a dict lookup per frame).
csrc/record.h walks the same way for the ops it records, over the same table.
"""
from __future__ import annotations

import os
import sys

from ..runtime import cache as _caches

_SKIP_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (sys.modules["torch"], sys.modules["torchtpu"])
)
# id(code object) -> (the code object, torch's or torchtpu's rather than the user's?). By
# identity: a code object's hash is computed afresh from its name, bytecode and constants at
# each lookup (and fails for constants such as Dynamo's slices); the value holds the code
# object, so its id is not reused while the entry lives.
internal_code: dict = _caches.register("issuing code", {})


def user_frame():
    """The user's (file, line, function) that issued the current op, if any."""
    f = sys._getframe(1)
    internal = internal_code
    while f is not None:
        code = f.f_code
        known = internal.get(id(code))
        if known is None or known[0] is not code:
            known = internal[id(code)] = (code, is_internal(code))
        if not known[1]:
            return (code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return None


def is_internal(code) -> bool:
    fn = code.co_filename
    return fn.startswith(_SKIP_DIRS) or fn.startswith("<frozen")


def where(frame) -> str | None:
    """A user_frame() as text ("file:line in function")."""
    return f"{frame[0]}:{frame[1]} in {frame[2]}" if frame else None
