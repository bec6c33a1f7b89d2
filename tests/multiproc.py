"""Launching real multi-process jobs from pytest, the way torchrun does.

Each rank runs a test file as a script (`python FILE SCENARIO ...`) with env://
variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT) on XLA:CPU, and reports one
`RESULT {json}` line on stdout. Jobs of one pytest session share a persistent
compilation cache, so the second job of a kind skips XLA compiles.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG_GUARD_S = 900.0
# a worker's process-group timeout for collectives that must succeed: a peer still compiling on
# a loaded machine is slow, not gone (tests of the timeout itself set their own, short ones)
PG_TIMEOUT_S = 600
_cache = {"dir": None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cache_dir() -> str:
    if _cache["dir"] is None:
        import atexit
        import shutil
        import tempfile

        _cache["dir"] = tempfile.mkdtemp(prefix="torchtpu-dist-cache-")
        atexit.register(shutil.rmtree, _cache["dir"], True)
    return _cache["dir"]


def launch(script: str, scenario: str, *args: str, world: int = 2, timeout: float = 150.0, env_extra=None):
    """Run `scenario` of `script` in `world` processes; returns [(returncode, stdout, stderr,
    end)] where `end` is the wall time at which that rank was seen to exit (ranks are
    waited for in order).

    `timeout` only guards against a hang, never judges speed: it is at least HANG_GUARD_S,
    since a loaded 2-core machine (CI, sweeps beside the suite) slows a job several-fold and
    must slow the test, not fail it."""
    timeout = max(timeout, HANG_GUARD_S)
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for rank in range(world):
        env = dict(os.environ)
        env.update(JAX_PLATFORMS="cpu", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TF_CPP_MIN_LOG_LEVEL="2", TORCHTPU_CACHE_DIR=_cache_dir(), **(env_extra or {}))
        env.pop("PYTEST_CURRENT_TEST", None)
        procs.append(subprocess.Popen([sys.executable, script, scenario, *args], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        out.append((p.returncode, so, se, time.time()))
    return out


def clean(stderr: str) -> str:
    """stderr without XLA's and absl's log lines."""
    return "\n".join(l for l in stderr.splitlines() if not l.startswith(("W1", "I1", "E1", "    @")))


def result(proc) -> dict:
    """A rank's RESULT line, or an AssertionError with its output."""
    rc, so, se = proc[:3]
    for line in so.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"worker failed (rc={rc}):\n{so[-3000:]}\n{clean(se)[-6000:]}")
