"""Worker processes for the sweep: one model at a time each, killed and replaced on a hard
timeout or a crash, so one bad model costs its own result only."""
from __future__ import annotations

import os
import time

from .hf_compare import Result, result_from as _result_from
from .hf_run import run_model


def _clear_caches() -> None:
    import jax

    from torchtpu.eager import executor  # (its clear drops the fused regions too)

    executor.clear_cache()
    jax.clear_caches()


def _rss_gb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except Exception:
        return 0.0


def _worker(conn, opts: dict) -> None:
    import logging

    logging.disable(logging.WARNING)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except Exception:
        pass
    while True:
        job = conn.recv()
        if job is None:
            break
        mt, variant, cls = job
        r = run_model(mt, variant, cls, **opts)
        conn.send(r.to_json())
        if _rss_gb() > opts.get("max_rss_gb", 6):
            _clear_caches()


def run_all(jobs: list[tuple[str, str, str]], opts: dict, n_workers: int, hard_timeout: int,
            on_result) -> list[Result]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    todo = list(jobs)
    results: list[Result] = []
    workers: list = []  # [proc, conn, job, started]

    def spawn():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, opts), daemon=True)
        p.start()
        child.close()
        return [p, parent, None, 0.0]

    for _ in range(max(1, n_workers)):
        workers.append(spawn())
    while todo or any(w[2] for w in workers):
        for i, w in enumerate(workers):
            p, conn, job, started = w
            if job is None and todo:
                w[2] = todo.pop(0)
                w[3] = time.perf_counter()
                conn.send(w[2])
                continue
            if job is None:
                continue
            r = None
            try:
                if conn.poll(0.05):
                    r = _result_from(conn.recv())
            except (EOFError, OSError):
                r = Result(job[0], job[1], job[2], state="tpu-error",
                           detail=f"worker died (exit code {p.exitcode})")
            if r is None and not p.is_alive():
                r = Result(job[0], job[1], job[2], state="tpu-error",
                           detail=f"worker died (exit code {p.exitcode})")
            if r is None and time.perf_counter() - started > hard_timeout:
                p.kill()
                r = Result(job[0], job[1], job[2], state="tpu-error",
                           detail=f"hard timeout after {hard_timeout}s (worker killed)")
            if r is None:
                continue
            if r.seconds == 0.0:
                r.seconds = time.perf_counter() - started
            results.append(r)
            on_result(r)
            if not p.is_alive() or "worker" in r.detail:
                p.join(1)
                workers[i] = spawn()
            else:
                w[2] = None
        time.sleep(0.01)
    for p, conn, _, _ in workers:
        try:
            conn.send(None)
        except Exception:
            pass
        p.join(5)
        if p.is_alive():
            p.kill()
    return results
