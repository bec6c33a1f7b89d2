"""Turning device-side checks on or off (ops/checks.py declares them, runtime/checks.py
raises them). Executables built with checks carry a flag output, built without none:
switching drops the eager caches so every op is rebuilt the new way (compiled graphs key
their programs by the switch)."""
from __future__ import annotations

from ..ops import checks as _declare
from ..runtime import checks as _pending


def set_checks(enabled: bool) -> None:
    enabled = bool(enabled)
    if enabled == _declare.enabled():
        return
    from . import deferred, executor

    deferred.flush("set_checks")
    if not enabled:
        _pending.clear()
    _declare.set_enabled(enabled)
    executor.clear_cache()
