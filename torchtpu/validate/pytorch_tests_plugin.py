"""The pytest plugin `python -m torchtpu.validate pytorch_tests` loads into each test process.

It is loaded as a top-level module (`-p torchtpu_pt_plugin`, a link to this file in the run's
work directory), never through the torchtpu package: importing torchtpu would load the backend
into the CPU oracle's process. It imports nothing of torchtpu. The environment steers it:

- PTSWEEP_LOG: a JSONL file; one `{"start": id}` line before each test and one
  `{"id", "outcome", "message", "where", "seconds"}` line after it, flushed at once, so that the
  parent process knows which test was running when a process hangs or dies.
- PTSWEEP_CLASS_SUFFIX: keep only the test classes `instantiate_device_type_tests` made for
  this device (`CPU`; `PRIVATEUSE1,TPU`: the class is named after the backend's registered name
  for some classes, the key's for others); device-agnostic classes (TestNN, TestAutograd) are dropped.
- PTSWEEP_DONE: a file of test ids already recorded by an earlier process of the same run
  (one a line): deselected, so that a restart after a hang or crash goes on from there.
- PTSWEEP_SAMPLE: a fraction in (0, 1]: keep the tests whose device-free name hashes below
  it (the same tests on every device), for files too long to run whole.
- PTSWEEP_TIMEOUT: seconds a test may run (SIGALRM: a test stuck in Python code fails with
  PerTestTimeout; one stuck in C code is killed by the parent's watchdog instead).
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
import zlib

import pytest


class PerTestTimeout(Exception):
    pass


_LOG = None
_TIMEOUT = int(os.environ.get("PTSWEEP_TIMEOUT", "0") or 0)
_RESULTS: dict = {}


_DEV = re.compile(r"_(cpu|tpu)(?=_|$)")


def key_of(test_id: str) -> str:
    """`test_x.py::TestFooPRIVATEUSE1::test_y_tpu_float32` -> `TestFoo::test_y_DEV_float32`."""
    parts = test_id.split("::")
    cls = re.sub(r"(CPU|PRIVATEUSE1|TPU)$", "", parts[-2]) if len(parts) > 2 else ""
    return f"{cls}::{_DEV.sub('_DEV', parts[-1])}"


def sampled(test_id: str, fraction: float) -> bool:
    return fraction >= 1 or zlib.crc32(key_of(test_id).encode()) % 100000 < fraction * 100000


def _log(record: dict) -> None:
    global _LOG
    path = os.environ.get("PTSWEEP_LOG")
    if not path:
        return
    if _LOG is None:
        _LOG = open(path, "a", buffering=1)
    _LOG.write(json.dumps(record) + "\n")
    _LOG.flush()


def pytest_collection_modifyitems(session, config, items):
    suffix = tuple(os.environ.get("PTSWEEP_CLASS_SUFFIX", "").split(",")) if os.environ.get(
        "PTSWEEP_CLASS_SUFFIX") else None
    done = set()
    done_file = os.environ.get("PTSWEEP_DONE")
    if done_file and os.path.exists(done_file):
        with open(done_file) as f:
            done = {line.strip() for line in f if line.strip()}
    fraction = float(os.environ.get("PTSWEEP_SAMPLE", "1") or 1)
    keep, drop = [], []
    for item in items:
        cls = item.cls.__name__ if item.cls is not None else ""
        if (suffix and not cls.endswith(suffix)) or item.nodeid in done or not sampled(item.nodeid, fraction):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    _log({"collected": len(keep)})


def _alarm(signum, frame):
    raise PerTestTimeout(f"timed out after {_TIMEOUT}s (per-test limit)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _log({"start": item.nodeid})
    _RESULTS[item.nodeid] = {"id": item.nodeid, "outcome": "passed", "message": "", "where": "",
                             "seconds": 0.0}
    t0 = time.perf_counter()
    if _TIMEOUT > 0:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(_TIMEOUT)
    try:
        yield
    finally:
        if _TIMEOUT > 0:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    rec = _RESULTS.pop(item.nodeid)
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    _log(rec)


def _message(report) -> tuple[str, str]:
    longrepr = report.longrepr
    if longrepr is None:
        return "", ""
    if isinstance(longrepr, tuple):  # a skip: (path, lineno, reason)
        return str(longrepr[2]), f"{longrepr[0]}:{longrepr[1]}"
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message[:2000], f"{crash.path}:{crash.lineno}"
    return str(longrepr)[-2000:], ""


def pytest_runtest_logreport(report):
    rec = _RESULTS.get(report.nodeid)
    if rec is None:
        return
    if rec["outcome"] in ("failed", "error"):
        return  # the first failure of a test (setup, call, teardown) is its outcome
    if hasattr(report, "wasxfail"):
        if report.skipped:
            rec["outcome"], rec["message"] = "xfailed", str(report.wasxfail)
        else:
            rec["outcome"] = "xpassed"
        return
    if report.failed:
        rec["outcome"] = "failed" if report.when == "call" else "error"
        rec["message"], rec["where"] = _message(report)
    elif report.skipped:
        rec["outcome"] = "skipped"
        rec["message"], rec["where"] = _message(report)
