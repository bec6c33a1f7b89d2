"""PyTorch's own device-generic tests on tpu vs CPU, test by test.

    python -m torchtpu.validate pytorch_tests [--tests-dir DIR] [--files NAME ...] [--jobs N]
                                              [--timeout S] [--mode MODE] [--report-only]
                                              [--markdown docs/pytorch_tests.md] [--json docs/pytorch_tests.json]

The test files are PyTorch's (test_view_ops.py, test_nn.py, ...), kept outside this repository in
`../shared/pytorch_tests` (its README says where they came from). Each file runs twice under pytest
(`-p no:cacheprovider`, this package's pytest_tests_plugin loaded): once with
PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu (torchtpu not loaded: TORCH_DEVICE_BACKEND_AUTOLOAD=0) and once
with =privateuse1 (torchtpu loads itself through the torch.backends entry point). Only the
classes instantiate_device_type_tests made for that device are kept. Tests are matched by name with
the device stripped (`TestViewOps::test_x_cpu_float32` ~ `test_x_tpu_float32`).

A test is limited to --timeout seconds (SIGALRM inside the process); a process that stops writing
(a test stuck in C code) or dies is killed or noted, its current test recorded as `timeout` or
`crash`, and a fresh process goes on with the tests not yet recorded.

The report counts, per file, the tests that pass on CPU and ran on tpu (not skipped there:
onlyCPU, onlyCUDA, ...), how many of those pass on tpu, and lists every test that passes on CPU
and fails on tpu with its cause.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import config
from .progress import Progress
from .pytorch_tests_plugin import key_of

# The share of each file's device-generic tests a default sweep runs (OpInfo-parametrized files
# hold tens of thousands: a deterministic sample by test name, the same on CPU and tpu).
SAMPLE = {"test_view_ops": 0.3, "test_type_promotion": 0.15, "test_shape_ops": 1.0,
          "test_binary_ufuncs": 0.005, "test_unary_ufuncs": 0.0025, "test_reductions": 0.012,
          "test_tensor_creation_ops": 0.2, "test_nn": 0.2, "test_autograd": 0.75}

FILES = ("test_view_ops", "test_type_promotion", "test_shape_ops", "test_binary_ufuncs",
         "test_unary_ufuncs", "test_reductions", "test_tensor_creation_ops", "test_nn", "test_autograd")
DEVICES = {"cpu": ("cpu", "CPU"), "tpu": ("privateuse1", "PRIVATEUSE1,TPU")}
OK = ("passed", "xfailed")
REPO = Path(__file__).resolve().parents[2]


def default_tests_dir() -> Path:
    env = config.read("pytorch_tests")
    if env:
        return Path(env)
    for cand in (REPO.parent / "shared" / "pytorch_tests", REPO.parent.parent / "shared" / "pytorch_tests",
                 Path("/work/shared/pytorch_tests")):
        if cand.is_dir():
            return cand
    return REPO.parent / "shared" / "pytorch_tests"


# ---------------------------------------------------------------------------------------------
# running


def _read_log(path: Path) -> tuple[dict, str | None, int | None]:
    """Records by test id, the test started last without a record, and the collected count."""
    results, started, collected = {}, None, None
    if not path.exists():
        return results, started, collected
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            if "start" in rec:
                started = rec["start"]
            elif "collected" in rec:
                collected = rec["collected"] if collected is None else collected
            elif "id" in rec:
                results[rec["id"]] = rec
                if rec["id"] == started:
                    started = None
    return results, started, collected


def run_watched(cmd: list, cwd: Path, env: dict, log: Path, done_file: Path, out: Path, stall: int,
                max_restarts: int, tick=None) -> tuple[float, int, int]:
    """Run the pytest child `cmd` (this package's plugin loaded: it records each test in `log`
    and skips those listed in `done_file`) until it has run every test it kept: a child that
    stops writing for `stall` s is killed and its current test recorded as `timeout`, one that
    dies records `crash`, and a fresh child goes on with the rest (at most `max_restarts`
    times). Returns (seconds, restarts, tests recorded)."""
    restarts = 0
    t_start = time.time()
    while True:
        results, _, _ = _read_log(log)
        done_file.write_text("".join(i + "\n" for i in results))
        with open(out, "a") as sink:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            last_size, last_change = -1, time.time()
            killed = False
            while proc.poll() is None:
                time.sleep(2)
                size = log.stat().st_size if log.exists() else 0
                if size != last_size:
                    last_size, last_change = size, time.time()
                    if tick:
                        tick()
                elif time.time() - last_change > stall:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    killed = True
        results, started, collected = _read_log(log)
        if started is None:
            if proc.returncode in (0, 1, 5) or collected is None or len(results) >= collected:
                break  # the process ran every test it kept
            restarts += 1  # it died between two tests: a fresh process goes on with the rest
            if restarts > max_restarts:
                break
            continue
        outcome = "timeout" if killed else "crash"
        msg = (f"process killed: no progress for {stall}s" if killed
               else f"process died (exit {proc.returncode})")
        with open(log, "a") as f:
            f.write(json.dumps({"id": started, "outcome": outcome, "message": msg, "where": "",
                                "seconds": None}) + "\n")
        restarts += 1
        if restarts > max_restarts:
            break
    return round(time.time() - t_start, 1), restarts, len(_read_log(log)[0])


def _plugin_dir(work: Path) -> Path:
    """A directory holding the plugin as a top-level module (see pytorch_tests_plugin.py)."""
    d = work / "plugin"
    d.mkdir(parents=True, exist_ok=True)
    link = d / "torchtpu_pt_plugin.py"
    src = Path(__file__).with_name("pytorch_tests_plugin.py")
    if not (link.is_symlink() and link.resolve() == src.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(src)
    return d


def run_one(tests_dir: Path, name: str, device: str, work: Path, timeout: int, mode: str | None,
            stall: int, sample: float = 1.0, tick=None, max_restarts: int = 40) -> dict:
    """Runs one file on one device to the end, restarting after hangs and crashes."""
    only_for, suffix = DEVICES[device]
    log = work / f"{name}.{device}.jsonl"
    done_file = work / f"{name}.{device}.done"
    env = dict(os.environ)
    env.update({
        "PYTORCH_TESTING_DEVICE_ONLY_FOR": only_for,
        "PTSWEEP_LOG": str(log), "PTSWEEP_CLASS_SUFFIX": suffix,
        "PTSWEEP_DONE": str(done_file), "PTSWEEP_TIMEOUT": str(timeout),
        "PTSWEEP_SAMPLE": str(sample),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tests_dir), str(_plugin_dir(work))] +
                                      ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
        "PYTHONUNBUFFERED": "1",
    })
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the oracle runs without torchtpu
    else:
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        if mode:
            env["TORCHTPU_EAGER_MODE"] = mode
        # reruns (after a fix) skip most XLA compiles
        env.setdefault("TORCHTPU_CACHE_DIR", str(work / "xla_cache"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "torchtpu_pt_plugin", "-o", "addopts=", "--rootdir", str(tests_dir),
           f"{name}.py"]
    seconds, restarts, n = run_watched(cmd, tests_dir, env, log, done_file, work / f"{name}.{device}.out",
                                       stall, max_restarts, tick)
    return {"file": name, "device": device, "seconds": seconds, "restarts": restarts, "tests": n}


# ---------------------------------------------------------------------------------------------
# comparing

_DTYPES_XLA_LACKS = re.compile(
    r"complex32|ComplexHalf|chalf|quint|qint|QUInt|QInt|float8|Float8|bits(1x8|2x4|4x2|8|16)|"
    r"uint16|uint32|uint64|UInt16|UInt32|UInt64")


def cause_of(rec: dict, test_id: str) -> str:
    """A coarse cause for a test that passes on CPU and fails on tpu."""
    msg = rec.get("message") or ""
    outcome = rec.get("outcome")
    if outcome == "timeout" or "PerTestTimeout" in msg or "per-test limit" in msg:
        return "timeout"
    if outcome == "crash":
        return "crash (process died)"
    if re.search(r"tpu:[1-9]|device_count|same device|multi.?device|MULTIGPU", msg + test_id):
        return "multi-device (issue 34)"
    if re.search(r"not raised|did not raise|DID NOT RAISE|not triggered|Warning not", msg):
        return "missing error"
    if re.search(r'does not match|Regex didn.t match', msg):
        return "different error message"
    if "dlpack" in test_id.lower():
        return "DLPack capsule into torch.asarray (C++ importer: no tpu tensor from a capsule)"
    if re.search(r"Sparse|sparse_coo|to_sparse|SparseCsr|layout=torch.sparse", msg):
        return "sparse tensors (no SparsePrivateUse1 kernels)"
    if re.search(r"Quantized|quantize_per|qscheme", msg):
        return "quantized tensors (no QuantizedPrivateUse1 backend)"
    if _DTYPES_XLA_LACKS.search(msg) and not re.search(r"close|equal", msg):
        return "dtype XLA lacks"
    if re.search(r"NotImplementedError|not implemented|no lowering|Could not run|not supported", msg):
        return "not implemented on tpu"
    if re.search(r"not close|not equal|Tensor-likes|Scalars are not|mismatch|!=|Booleans mismatch", msg):
        return "wrong value"
    if re.search(r"stride|storage|data_ptr|_is_view|is_contiguous|_base", msg):
        return "wrong metadata (strides, storage, views)"
    if msg.startswith("AssertionError"):
        return "other assertion"
    m = re.match(r"([A-Za-z_][\w.]*(Error|Exception|Warning))\b", msg)
    return f"unexpected {m.group(1)}" if m else "other"


def compare(work: Path, names, sample=None) -> dict:
    files = {}
    for name in names:
        cpu, _, _ = _read_log(work / f"{name}.cpu.jsonl")
        tpu, _, _ = _read_log(work / f"{name}.tpu.jsonl")
        if not cpu and not tpu:
            continue
        cpu_k = {key_of(i): r for i, r in cpu.items()}
        tpu_k = {key_of(i): r for i, r in tpu.items()}
        cpu_ok = {k for k, r in cpu_k.items() if r["outcome"] in OK}
        ran = [k for k in sorted(cpu_ok) if k in tpu_k and tpu_k[k]["outcome"] != "skipped"]
        passed = [k for k in ran if tpu_k[k]["outcome"] in OK]
        failures = []
        for k in ran:
            r = tpu_k[k]
            if r["outcome"] in OK:
                continue
            msg = (r.get("message") or "").split("\n\nTo execute this test")[0]
            failures.append({"test": r["id"].split("::", 1)[-1], "outcome": r["outcome"],
                             "cause": cause_of(r, r["id"]), "message": msg[:600],
                             "where": r.get("where", "")})
        files[name] = {
            "sample": (sample or {}).get(name, 1.0),
            "cpu_tests": len(cpu_k), "cpu_passed": len(cpu_ok),
            "tpu_tests": len(tpu_k), "tpu_passed_all": sum(r["outcome"] in OK for r in tpu_k.values()),
            "tpu_skipped_of_cpu_passed": sum(1 for k in cpu_ok if k in tpu_k and tpu_k[k]["outcome"] == "skipped"),
            "missing_on_tpu": sum(1 for k in cpu_ok if k not in tpu_k),
            "compared": len(ran), "tpu_passed": len(passed),
            "percent": round(100.0 * len(passed) / len(ran), 2) if ran else None,
            "failures": failures,
        }
    return files


# ---------------------------------------------------------------------------------------------
# reporting


def _table(files: dict) -> list[str]:
    rows = ["| file | sample | CPU passed | ran on tpu | tpu passed | % | tpu-skipped | not run on tpu |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    tot = collections.Counter()
    for name, f in files.items():
        pct = "-" if f["percent"] is None else f"{f['percent']:.1f}"
        rows.append(f"| {name} | {f.get('sample', 1.0):g} | {f['cpu_passed']} | {f['compared']} | {f['tpu_passed']} | {pct} | "
                    f"{f['tpu_skipped_of_cpu_passed']} | {f['missing_on_tpu']} |")
        for k in ("cpu_passed", "compared", "tpu_passed", "tpu_skipped_of_cpu_passed", "missing_on_tpu"):
            tot[k] += f[k]
    if len(files) > 1:
        pct = f"{100.0 * tot['tpu_passed'] / tot['compared']:.1f}" if tot["compared"] else "-"
        rows.append(f"| **all** | | {tot['cpu_passed']} | {tot['compared']} | {tot['tpu_passed']} | {pct} | "
                    f"{tot['tpu_skipped_of_cpu_passed']} | {tot['missing_on_tpu']} |")
    return rows


def write_markdown(path: Path, files: dict, meta: dict) -> None:
    causes = collections.Counter(x["cause"] for f in files.values() for x in f["failures"])
    lines = ["# PyTorch's device-generic tests on tpu",
             "",
             "Written by `python -m torchtpu.validate pytorch_tests` (torchtpu/validate/pytorch_tests.py).",
             f"Test files: PyTorch's own, from `{meta['tests_dir']}` (its README.md says which commit and",
             "which import-level fixes). Each file ran with `PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu` (torchtpu not",
             "loaded) and `=privateuse1` (tpu, eager mode "
             f"`{meta['mode'] or 'default'}`), {meta['timeout']} s per test. Tests are matched by name",
             "with the device stripped. *ran on tpu*: tests that pass on CPU and were not skipped on tpu",
             "(onlyCPU, onlyCUDA and the like skip there); *%*: tpu passed / ran on tpu. *not run on tpu*:",
             "CPU-passing tests with no tpu counterpart (dtype lists that differ per device).",
             "",
             "*sample*: the share of the file's tests that ran, a deterministic choice by test name, the same",
             "on both devices (the OpInfo-parametrized files hold tens of thousands of tests; a tpu test",
             "costs seconds of XLA compiles on the 2-core machine).",
             "",
             f"Run: {meta['when']}; files: {', '.join(files)}.",
             ""]
    lines += _table(files)
    lines += ["", "## Causes of the tests that pass on CPU and fail on tpu", ""]
    if causes:
        lines += ["| cause | tests |", "| --- | ---: |"]
        lines += [f"| {c} | {n} |" for c, n in causes.most_common()]
    else:
        lines.append("None.")
    lines += ["", "What the causes mean:", "",
              "- *sparse tensors*: PyTorch's sparse layouts are SparseTensorImpl with kernels per backend",
              "  (SparseCPU, SparseCUDA: `_sparse_coo_tensor_with_dims_and_tensors`, coalesce, sparse add",
              "  into dense ...); there are none for SparsePrivateUse1, so a sparse tpu tensor cannot be",
              "  made. These tests pass on CUDA, which has the kernels.",
              "- *quantized tensors*: a quantized tensor (QTensorImpl) is made only by the QuantizedCPU /",
              "  QuantizedCUDA kernels in C++ (`at::new_qtensor`); there is no QuantizedPrivateUse1 backend",
              "  and no Python API that makes a quantized tensor on another device. These tests pass on CUDA.",
              "- *DLPack capsule into torch.asarray*: `to_dlpack(t)` of a tpu tensor is its JAX buffer's",
              "  capsule (on XLA:CPU host memory, device kDLCPU), and `torch.asarray(capsule)` is PyTorch's",
              "  C++ importer, which makes a tensor of the capsule's device: a CPU tensor over the buffer, not",
              "  a tpu tensor (`torch.from_dlpack(capsule, device=\"tpu\")` gives one). On CUDA the capsule",
              "  names the GPU and the test passes.",
              "- *dtype XLA lacks*: the bits and uint16-64 types where a test computes in them (complex32",
              "  and the sub-byte types are carried in another type's buffer: eager/carried.py).",
              "- *missing error*: CPU raises and tpu returned a value: a bug (argument checks belong in",
              "  torchtpu/eager/argcheck.py or the lowering).",
              "- *multi-device (issue 34)*: the test needs a second tpu device.",
              ""]
    for name, f in files.items():
        if not f["failures"]:
            continue
        lines += ["", f"## {name}", ""]
        by_cause = collections.defaultdict(list)
        for x in f["failures"]:
            by_cause[x["cause"]].append(x)
        for cause, xs in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
            lines += [f"### {cause} ({len(xs)})", ""]
            for x in xs:
                msg = " ".join((x["message"] or "").split())[:240].replace("|", "\\|")
                lines.append(f"- `{x['test']}`: {msg}")
            lines.append("")
    path.write_text("\n".join(lines).rstrip() + "\n")


def print_summary(files: dict) -> None:
    print("\n".join(_table(files)))
    causes = collections.Counter(x["cause"] for f in files.values() for x in f["failures"])
    if causes:
        print("\ncauses (CPU-passing tests failing on tpu):")
        for c, n in causes.most_common():
            print(f"  {n:5d}  {c}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m torchtpu.validate pytorch_tests")
    p.add_argument("--tests-dir", type=Path, default=None,
                   help="PyTorch's test files (default: ../shared/pytorch_tests, or $TORCHTPU_PYTORCH_TESTS)")
    p.add_argument("--files", nargs="*", default=None, help=f"file names (default: {' '.join(FILES)})")
    p.add_argument("--devices", nargs="*", default=["cpu", "tpu"], choices=sorted(DEVICES))
    p.add_argument("--jobs", type=int, default=2, help="test processes at once")
    p.add_argument("--sample", nargs="*", default=[], metavar="FILE=FRACTION",
                   help="share of a file's tests to run (default: SAMPLE in this module; `all=1` runs "
                        "every test of every file)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per test")
    p.add_argument("--mode", default=None, help="TORCHTPU_EAGER_MODE for the tpu runs (default: the default)")
    p.add_argument("--work-dir", type=Path, default=REPO / "build" / "pytorch_tests",
                   help="per-test JSONL logs and pytest output (kept: --report-only rereads them)")
    p.add_argument("--keep", action="store_true",
                   help="keep the logs of files already run in --work-dir and run only what is missing")
    p.add_argument("--report-only", action="store_true", help="write the report from --work-dir, run nothing")
    p.add_argument("--markdown", type=Path, default=REPO / "docs" / "pytorch_tests.md")
    p.add_argument("--json", type=Path, default=REPO / "docs" / "pytorch_tests.json")
    a = p.parse_args(argv)
    tests_dir = (a.tests_dir or default_tests_dir()).resolve()
    names = [n[:-3] if n.endswith(".py") else n for n in (a.files or FILES)]
    missing = [n for n in names if not (tests_dir / f"{n}.py").exists()]
    if missing:
        print(f"not in {tests_dir}: {', '.join(missing)}", file=sys.stderr)
        return 2
    work = a.work_dir
    work.mkdir(parents=True, exist_ok=True)
    sample = dict(SAMPLE)
    for item in a.sample:
        k, _, v = item.partition("=")
        if k == "all":
            sample = {n: float(v) for n in FILES}
        else:
            sample[k[:-3] if k.endswith(".py") else k] = float(v)
    if not a.report_only:
        jobs = []
        for n in names:
            for d in a.devices:
                log = work / f"{n}.{d}.jsonl"
                if a.keep and log.exists():
                    continue
                for suffix in (".jsonl", ".done", ".out"):
                    (work / f"{n}.{d}{suffix}").unlink(missing_ok=True)
                jobs.append((n, d))
        # the longest files first, tpu before cpu: the slowest jobs start early
        jobs.sort(key=lambda j: (-(tests_dir / f"{j[0]}.py").stat().st_size, j[1] != "tpu"))
        prog = Progress(len(jobs), label="pytorch_tests ")
        lock = threading.Lock()
        stall = max(3 * a.timeout, a.timeout + 240)

        def one(job):
            n, d = job
            r = run_one(tests_dir, n, d, work, a.timeout, a.mode, stall, sample.get(n, 1.0))
            res, _, _ = _read_log(work / f"{n}.{d}.jsonl")
            c = collections.Counter(x["outcome"] for x in res.values())
            with lock:
                prog.step(f"{n} [{d}]", f"{r['tests']} tests in {r['seconds']:.0f}s: "
                          + ", ".join(f"{v} {k}" for k, v in c.most_common())
                          + (f"; {r['restarts']} restarts" if r["restarts"] else ""))
            return r

        with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
            list(ex.map(one, jobs))
    files = compare(work, names, sample)
    meta = {"tests_dir": str(tests_dir), "mode": a.mode, "timeout": a.timeout,
            "sample": {n: sample.get(n, 1.0) for n in names},
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        write_markdown(a.markdown, files, meta)
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "files": files}, indent=1) + "\n")
    print_summary(files)
    return 0
