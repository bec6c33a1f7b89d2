"""torch.tpu's memory API, shaped as torch.cuda's, and the device's properties.

"Allocated" is what torch.cuda calls it: bytes of the device buffers live tensors
hold (the storage table's count). There is no caching allocator in front of PJRT:
a buffer goes back to PJRT when its last tensor dies, so "reserved" is what PJRT
reports in use where it keeps statistics (TPU, GPU) and equals "allocated" where
it does not (XLA:CPU); empty_cache() has nothing to release.
"""
from __future__ import annotations

import collections
import os

from .. import metrics
from ..runtime import storage

_reserved_peak = {"bytes": 0}


def _pjrt_stats() -> dict:
    from ..runtime import jaxenv

    try:
        return jaxenv.device().memory_stats() or {}
    except Exception:  # platforms without allocator statistics
        return {}


def memory_allocated() -> int:
    return storage.memory_allocated()


def max_memory_allocated() -> int:
    return storage.max_memory_allocated()


def memory_reserved() -> int:
    stats = _pjrt_stats()
    now = max(storage.memory_allocated(), int(stats.get("bytes_reserved", stats.get("bytes_in_use", 0))))
    if now > _reserved_peak["bytes"]:
        _reserved_peak["bytes"] = now
    return now


def max_memory_reserved() -> int:
    stats = _pjrt_stats()
    peak = max(storage.max_memory_allocated(), int(stats.get("peak_bytes_in_use", 0)))
    return max(peak, memory_reserved(), _reserved_peak["bytes"])


def reset_peak_memory_stats() -> None:
    storage.reset_peak_memory_stats()
    _reserved_peak["bytes"] = 0


def memory_stats() -> "collections.OrderedDict[str, int]":
    """torch.cuda.memory_stats()'s keys where they mean something here."""
    alloc = storage.memory_allocated()
    peak = storage.max_memory_allocated()
    stats = {
        "allocated_bytes.all.current": alloc,
        "allocated_bytes.all.peak": peak,
        "active_bytes.all.current": alloc,
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.current": memory_reserved(),
        "reserved_bytes.all.peak": max_memory_reserved(),
        "allocation.all.current": storage.live_buffers(),
        "active.all.current": storage.live_buffers(),
        "num_alloc_retries": 0,
        "num_ooms": metrics.snapshot().get("out_of_memory", 0),
        "live_buffers": storage.live_buffers(),
    }
    return collections.OrderedDict(sorted(stats.items()))


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(abbreviated: bool = False) -> str:
    s = memory_stats()
    line = "|" + "=" * 75 + "|"
    rows = [
        line,
        f"|{'PyTorch tpu memory summary (' + device_name() + ')':^75}|",
        line,
        f"| {'Metric':<30}| {'Cur Usage':>20} | {'Peak Usage':>20} |",
        "|" + "-" * 75 + "|",
        f"| {'Allocated memory':<30}| {_fmt(s['allocated_bytes.all.current']):>20} | "
        f"{_fmt(s['allocated_bytes.all.peak']):>20} |",
        f"| {'Active memory':<30}| {_fmt(s['active_bytes.all.current']):>20} | "
        f"{_fmt(s['active_bytes.all.peak']):>20} |",
        f"| {'Reserved memory (PJRT)':<30}| {_fmt(s['reserved_bytes.all.current']):>20} | "
        f"{_fmt(s['reserved_bytes.all.peak']):>20} |",
        f"| {'Live buffers':<30}| {s['allocation.all.current']:>20} | {'':>20} |",
        line,
    ]
    return "\n".join(rows) + "\n"


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the device: PJRT's limit where it has one, else host RAM."""
    stats = _pjrt_stats()
    if "bytes_limit" in stats:
        total = int(stats["bytes_limit"])
        return max(0, total - int(stats.get("bytes_in_use", 0))), total
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemAvailable:"):
                    free = int(ln.split()[1]) * 1024
    except OSError:
        pass
    return free, total


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def device_name() -> str:
    """The XLA device's kind ("TPU v5 lite", a GPU's name), or "XLA:CPU (<cpu model>)"."""
    from ..runtime import jaxenv

    d = jaxenv.device()
    if d.platform == "cpu":
        model = _cpu_model()
        return f"XLA:CPU ({model})" if model else "XLA:CPU"
    return str(d.device_kind)


def device_capability() -> tuple[int, int]:
    """(major, minor): a TPU's generation ("TPU v4" -> (4, 0)), a GPU's compute capability,
    (0, 0) for XLA:CPU."""
    import re

    from ..runtime import jaxenv

    d = jaxenv.device()
    cc = getattr(d, "compute_capability", None)
    if cc:
        major, _, minor = str(cc).partition(".")
        return int(major), int(minor or 0)
    m = re.search(r"v(\d+)", str(d.device_kind)) if d.platform == "tpu" else None
    return (int(m.group(1)), 0) if m else (0, 0)


class DeviceProperties:
    """What torch.cuda.get_device_properties() returns, for the XLA device behind "tpu"."""

    def __init__(self):
        from ..runtime import jaxenv

        d = jaxenv.device()
        self.name = device_name()
        self.platform = d.platform
        self.device_kind = str(d.device_kind)
        self.total_memory = mem_get_info()[1]
        self.major, self.minor = device_capability()
        cores = getattr(d, "num_cores", None) or (os.cpu_count() if d.platform == "cpu" else 1)
        self.multi_processor_count = int(cores)
        self.is_integrated = d.platform == "cpu"
        self.type = "tpu"

    def __repr__(self) -> str:
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count})")
