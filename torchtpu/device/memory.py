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
from ..runtime import placement, storage

_reserved_peak: dict[int, int] = {}   # per device index


def _pjrt_stats(index: int = 0) -> dict:
    try:
        return placement.devices()[index].memory_stats() or {}
    except Exception:  # platforms without allocator statistics
        return {}


def memory_allocated(index: int = 0) -> int:
    return storage.memory_allocated(index)


def max_memory_allocated(index: int = 0) -> int:
    return storage.max_memory_allocated(index)


def memory_reserved(index: int = 0) -> int:
    stats = _pjrt_stats(index)
    now = max(storage.memory_allocated(index), int(stats.get("bytes_reserved", stats.get("bytes_in_use", 0))))
    if now > _reserved_peak.get(index, 0):
        _reserved_peak[index] = now
    return now


def max_memory_reserved(index: int = 0) -> int:
    stats = _pjrt_stats(index)
    peak = max(storage.max_memory_allocated(index), int(stats.get("peak_bytes_in_use", 0)))
    return max(peak, memory_reserved(index), _reserved_peak.get(index, 0))


def reset_peak_memory_stats(index: int = 0) -> None:
    storage.reset_peak_memory_stats(index)
    _reserved_peak[index] = 0


def memory_stats(index: int = 0) -> "collections.OrderedDict[str, int]":
    """torch.cuda.memory_stats()'s keys where they mean something here."""
    alloc = storage.memory_allocated(index)
    peak = storage.max_memory_allocated(index)
    buffers = storage.live_buffers(index)
    stats = {
        "allocated_bytes.all.current": alloc,
        "allocated_bytes.all.peak": peak,
        "active_bytes.all.current": alloc,
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.current": memory_reserved(index),
        "reserved_bytes.all.peak": max_memory_reserved(index),
        "allocation.all.current": buffers,
        "active.all.current": buffers,
        "num_alloc_retries": 0,
        "num_ooms": metrics.snapshot().get("out_of_memory", 0) - _ooms_before.get(index, 0),
        "live_buffers": buffers,
    }
    return collections.OrderedDict(sorted(stats.items()))


# reset_accumulated_memory_stats: the out-of-memory count at the last reset, per device
_ooms_before: dict[int, int] = {}


def reset_accumulated_memory_stats(index: int = 0) -> None:
    """The accumulated counters torch.cuda resets: here the out-of-memory count (no
    allocation is ever retried, and buffers are not counted per allocation)."""
    _ooms_before[index] = metrics.snapshot().get("out_of_memory", 0)


def memory_stats_as_nested_dict(index: int = 0) -> dict:
    """memory_stats() nested at its keys' dots, as torch.cuda's (which flattens this)."""
    nested: dict = {}
    for key, value in memory_stats(index).items():
        *path, last = key.split(".")
        d = nested
        for part in path:
            d = d.setdefault(part, {})
        d[last] = value
    return nested


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(abbreviated: bool = False, index: int = 0) -> str:
    s = memory_stats(index)
    line = "|" + "=" * 75 + "|"
    rows = [
        line,
        f"|{f'PyTorch tpu:{index} memory summary (' + device_name(index) + ')':^75}|",
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


def mem_get_info(index: int = 0) -> tuple[int, int]:
    """(free, total) bytes of the device: PJRT's limit where it has one, else host RAM."""
    stats = _pjrt_stats(index)
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


def device_name(index: int = 0) -> str:
    """The XLA device's kind ("TPU v5 lite", a GPU's name), or "XLA:CPU (<cpu model>)"."""
    d = placement.devices()[index]
    if d.platform == "cpu":
        model = _cpu_model()
        return f"XLA:CPU ({model})" if model else "XLA:CPU"
    return str(d.device_kind)


def device_capability(index: int = 0) -> tuple[int, int]:
    """(major, minor): a TPU's generation ("TPU v4" -> (4, 0)), a GPU's compute capability,
    (0, 0) for XLA:CPU."""
    import re

    d = placement.devices()[index]
    cc = getattr(d, "compute_capability", None)
    if cc:
        major, _, minor = str(cc).partition(".")
        return int(major), int(minor or 0)
    m = re.search(r"v(\d+)", str(d.device_kind)) if d.platform == "tpu" else None
    return (int(m.group(1)), 0) if m else (0, 0)


class DeviceProperties:
    """What torch.cuda.get_device_properties() returns, for the XLA device behind "tpu"."""

    def __init__(self, index: int = 0):
        d = placement.devices()[index]
        self.name = device_name(index)
        self.platform = d.platform
        self.device_kind = str(d.device_kind)
        self.total_memory = mem_get_info(index)[1]
        self.major, self.minor = device_capability(index)
        cores = getattr(d, "num_cores", None) or (os.cpu_count() if d.platform == "cpu" else 1)
        self.multi_processor_count = int(cores)
        self.is_integrated = d.platform == "cpu"
        self.type = "tpu"

    def __repr__(self) -> str:
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count})")
