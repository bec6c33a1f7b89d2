"""The watchdog: every collective's outputs are waited on in issue order, in a thread.

If one fails (a peer died: gloo reports the closed connection) or does not finish
within the process-group timeout (a peer hangs or never joined), it prints an error
naming the collective and ends the process (exit code 1), as NCCL's watchdog does;
TORCHTPU_DIST_ABORT=0 only records the error (raised by the next collective or
Work.wait()). A launch that blocks (XLA:CPU runs a first call inline) is watched too,
through `dispatching`.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

from .. import config


class TpuDistError(RuntimeError):
    """A collective failed or timed out (the message names it)."""


class Watchdog:
    """Waits on every collective's outputs in issue order; fails loudly on error or timeout."""

    def __init__(self):
        self.queue: deque = deque()
        self.cv = threading.Condition()
        self.current = None  # (desc, t0, timeout, info) of the collective being waited on
        self.dispatching = None  # the same while the user's thread is inside the launch
        self.error: str | None = None
        self.abort = config.read("dist_abort")
        threading.Thread(target=self._wait_loop, name="torchtpu-dist-waiter", daemon=True).start()
        threading.Thread(target=self._monitor_loop, name="torchtpu-dist-monitor", daemon=True).start()

    def add(self, desc: str, arrays, timeout: float, verify=None, info=None) -> None:
        """`verify()` (optional) runs once the outputs are ready and raises on a mismatch;
        `info()` (optional) says what the peers issued, for the timeout message."""
        with self.cv:
            self.queue.append((desc, time.monotonic(), timeout, arrays, verify, info))
            self.cv.notify()

    def drain(self) -> None:
        """Block until every collective issued so far has finished (or failed)."""
        while True:
            with self.cv:
                if not self.queue and self.current is None:
                    break
            time.sleep(0.0005)
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise TpuDistError(self.error)

    def fail(self, msg: str) -> None:
        if self.error is not None:
            return
        self.error = msg
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
        if self.abort:
            # Like NCCL's watchdog: a failed or hung collective leaves the XLA runtime
            # unusable (and its exit barrier would wait for the dead peer), so end here.
            os._exit(1)

    def _wait_loop(self) -> None:
        while True:
            with self.cv:
                while not self.queue:
                    self.cv.wait()
                desc, t0, timeout, arrays, verify, info = self.queue.popleft()
                self.current = (desc, t0, timeout, info)
            try:
                for a in arrays:
                    a.block_until_ready()
            except Exception as e:  # noqa: BLE001 - reported, not swallowed
                self.fail(f"torchtpu.distributed: {desc} failed: {str(e).strip()}{peers_said(info)}")
            else:
                if verify is not None:
                    try:
                        verify()
                    except TpuDistError as e:
                        self.fail(str(e))
                    except Exception:  # noqa: BLE001 - store unreachable: the next collective says so
                        pass
            with self.cv:
                self.current = None

    def _monitor_loop(self) -> None:
        while True:
            time.sleep(0.2)
            for cur in (self.dispatching, self.current):
                if cur is None or self.error is not None:
                    continue
                desc, t0, timeout, info = cur
                if time.monotonic() - t0 > timeout:
                    self.fail(
                        f"torchtpu.distributed: {desc} timed out after {timeout:.1f} s (process-group "
                        f"timeout): a peer process probably died, hangs, or issued a different collective"
                        f"{peers_said(info)}"
                    )


def peers_said(info) -> str:
    """info() in a helper thread, bounded in time (the store may be gone with its host)."""
    if info is None:
        return ""
    box: list = []

    def run():
        try:
            box.append(info())
        except Exception:  # noqa: BLE001 - diagnostics only
            pass

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(3.0)
    return f"; {box[0]}" if box and box[0] else ""


_watchdog_obj = None
_watchdog_lock = threading.Lock()


def watchdog() -> Watchdog:
    global _watchdog_obj
    if _watchdog_obj is None:
        with _watchdog_lock:
            if _watchdog_obj is None:
                _watchdog_obj = Watchdog()
    return _watchdog_obj
