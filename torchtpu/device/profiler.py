"""Device time per executed program in torch.profiler traces.

PyTorch's profiler collects device activity through a C++ Kineto plugin, which a
Python backend cannot register; it offers the tpu activity
(`ProfilerActivity.PrivateUse1`, shown as TPU) but records nothing for it. This is
the bridge: while torch's profiler is on, runtime/program_timing.py stamps when each
program the executors run (a strict op's executable, a defer_and_fuse region, a
compiled graph) could start and when its outputs were ready on the device. When the
profile is read, each program becomes
- a FunctionEvent on the tpu device (`device_type=PrivateUse1`), named after the op
  ("aten::mm") or the region's / graph's ops, and a kernel of the innermost CPU op
  that dispatched it, so `prof.key_averages()` shows "Self tpu" time per op, and
- a "kernel" event on a "tpu:0" process in `export_chrome_trace`'s file, on Kineto's
  clock (ts = epoch ns - baseTimeNanoseconds, in us).
A program's first run also compiles it (inside jax's call), and its interval then
includes the compile: the trace marks it ("includes compile"); profile after a
warm-up step, as with CUDA's lazy module loading.
"""
from __future__ import annotations

import bisect
import json

import torch
from torch.autograd import profiler as _tprof

from ..runtime import program_timing


def _take(prof) -> list:
    """The device records of a finished profile (waits for its programs to finish)."""
    got = getattr(prof, "_torchtpu_records", None)
    if got is None:
        got = prof._torchtpu_records = program_timing.take()
    return got


def _device_events(prof, records, trace_start_ns: int) -> list:
    from torch.autograd.profiler_util import FunctionEvent

    out = []
    for i, r in enumerate(records):
        out.append(FunctionEvent(
            id=-(i + 1), name=r.name, thread=0, start_us=(r.start - trace_start_ns) / 1000,
            end_us=(r.end - trace_start_ns) / 1000, fwd_thread=0, input_shapes=[], stack=[], scope=0,
            use_device=prof.use_device, cpu_memory_usage=0, device_memory_usage=0, is_async=False,
            sequence_nr=-1, device_type=torch.autograd.DeviceType.PrivateUse1, device_index=0,
            trace_name=r.name,
        ))
    return out


def _attach(cpu_events, records, trace_start_ns: int) -> None:
    """Each program's device time as a kernel of the innermost CPU op that dispatched it
    (the latest-starting CPU event that still encloses its dispatch time)."""
    cpu = sorted((e for e in cpu_events if e.device_type == torch.autograd.DeviceType.CPU and not e.is_async),
                 key=lambda e: e.time_range.start)
    starts = [e.time_range.start for e in cpu]
    for r in records:
        t = (r.t0 - trace_start_ns) / 1000
        for j in range(bisect.bisect_right(starts, t) - 1, max(-1, bisect.bisect_right(starts, t) - 4097), -1):
            if cpu[j].time_range.end >= t:
                cpu[j].append_kernel(r.name, 0, (r.end - r.start) / 1000)
                break


def install() -> None:
    cls = _tprof.profile
    if getattr(cls._parse_kineto_results, "_torchtpu", False):
        return
    parse, export = cls._parse_kineto_results, cls.export_chrome_trace

    def _parse_kineto_results(self, result, *args, **kwargs):
        events = parse(self, result, *args, **kwargs)
        records = _take(self)
        if records:
            start = result.trace_start_ns()
            _attach(events, records, start)
            events = list(events) + _device_events(self, records, start)
        return events

    def export_chrome_trace(self, path, *args, **kwargs):
        out = export(self, path, *args, **kwargs)
        records = _take(self)
        if records and str(path).endswith(".json"):
            with open(path) as f:
                trace = json.load(f)
            base = int(trace.get("baseTimeNanoseconds", 0))
            pid = "tpu:0"
            trace.setdefault("traceEvents", []).extend(
                [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "tpu:0 (XLA)"}},
                 {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "stream 0"}}]
                + [{"ph": "X", "cat": "kernel", "name": r.name, "pid": pid, "tid": 0,
                    "ts": (r.start - base) / 1000, "dur": (r.end - r.start) / 1000,
                    "args": {"device": 0, "stream": 0, "dispatch ts": (r.t0 - base) / 1000,
                             "includes compile": r.compiled}}
                   for r in records])
            with open(path, "w") as f:
                json.dump(trace, f)
        return out

    _parse_kineto_results._torchtpu = True
    cls._parse_kineto_results, cls.export_chrome_trace = _parse_kineto_results, export_chrome_trace
