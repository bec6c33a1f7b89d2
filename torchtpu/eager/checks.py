"""Turning device-side checks on or off (ops/checks.py declares them, runtime/checks.py
raises them). Executables built with checks carry a flag output, built without none: the
switch is part of every executable's key (eager ops, and through them fused regions;
compiled graphs), so switching back and forth compiles each program once per setting."""
from __future__ import annotations

from ..ops import checks as _declare
from ..runtime import checks as _pending


def set_checks(enabled: bool) -> None:
    enabled = bool(enabled)
    if enabled == _declare.enabled():
        return
    from . import deferred

    deferred.flush("set_checks")
    if not enabled:
        _pending.clear()
    _declare.set_enabled(enabled)
