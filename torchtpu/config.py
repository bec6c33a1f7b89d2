"""Every TORCHTPU_* environment variable, read in one place.

    import torchtpu
    torchtpu.config.startup.max_executables     # as the environment said at import
    torchtpu.config.read("collectives")         # as the environment says now
    torchtpu.config.current()                   # a whole Config, read now

`Config` names each variable, its default and what it means (README "Configuration" is
made from the same fields). Most variables are read once, when torchtpu is imported:
those are `startup`, and the setters (set_eager_mode, set_checks, set_fallback,
set_executable_limit, ...) change them at run time. A few are read each time they are
used (the field's `read` is "use"): compile options, the collectives placement and the
process-group options, because tests and launchers set them in the environment of a
running process before compiling or creating a group. Each variable keeps the parsing it
had when it was read where it is used, down to which strings mean "off".

stdlib only: the lowest layer (beside metrics), importable by every other.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Optional

Parse = Callable[[Optional[str]], Any]  # the raw value (None when unset) -> the setting


def _on_unless(*off: str, strip: bool = False) -> Parse:
    """On by default; these strings turn it off."""
    return lambda raw: True if raw is None else (raw.strip() if strip else raw) not in off


def _off_unless(*off: str) -> Parse:
    """Off by default; any string but these turns it on."""
    return lambda raw: False if raw is None else raw not in off


def _int(default: str) -> Parse:
    return lambda raw: int(default if raw is None else raw)


def _float(default: str) -> Parse:
    return lambda raw: float(default if raw is None else raw)


def _text(default: str) -> Parse:
    return lambda raw: default if raw is None else raw


def _path(raw: Optional[str]) -> Optional[str]:
    return raw or None  # an empty value means unset


def _eager_mode(raw: Optional[str]) -> str:
    return (raw if raw is not None else "strict").strip() or "strict"


def _var(env: str, default: str, parse: Parse, meaning: str, read: str = "import") -> Any:
    """A dataclass field for the variable `env`: its default is `parse` of nothing set."""
    assert read in ("import", "use")
    return field(default=parse(None), metadata={"env": env, "default": default, "parse": parse,
                                                "meaning": meaning, "read": read})


@dataclass(frozen=True)
class Config:
    """The settings the TORCHTPU_* environment variables give (defaults when unset)."""

    # eager execution
    eager_mode: str = _var("TORCHTPU_EAGER_MODE", "strict", _eager_mode,
                           "eager mode: `strict`, `debug` or `defer_and_fuse` (`set_eager_mode`)")
    debug_nans: bool = _var("TORCHTPU_DEBUG_NANS", "0", _off_unless("0", ""),
                            "in debug mode, name the first op producing NaN/Inf (`set_debug_nans`)")
    checks: bool = _var("TORCHTPU_CHECKS", "1", _on_unless("0", "false", "False", "", strip=True),
                        "device-side checks; `0`, `false` or empty turn them off (`set_checks`)")
    fallback: bool = _var("TORCHTPU_FALLBACK", "1", _on_unless("0", "false", "False"),
                          "CPU fallback for ops with no lowering; `0`/`false` forbid it (`set_fallback`)")
    fast_compile_after: int = _var("TORCHTPU_FAST_COMPILE_AFTER", "4", _int("4"),
                                   "shapes of one op compiled with XLA's optimizations; later shapes compile at -O0")
    varying_after: int = _var("TORCHTPU_VARYING_AFTER", "1", _int("1"),
                              "distinct sizes of one op signature compiled exactly before a varying dim runs "
                              "in buckets (views written in place, index lengths: eager/extents.py); `0`: never")
    jax_tracebacks: bool = _var("TORCHTPU_JAX_TRACEBACKS", "0", _off_unless("0", ""),
                                "`1`: JAX records the Python stack at every program launch and traced op "
                                "(its own debugging aid, never shown by torchtpu; costs ~0.5 us an op, "
                                "several in deep stacks)")
    # executable caches
    max_executables: int = _var("TORCHTPU_MAX_EXECUTABLES", "4096", _int("4096"),
                                "eager-op executables kept, all ops together (`set_executable_limit`)")
    max_executables_per_op: int = _var("TORCHTPU_MAX_EXECUTABLES_PER_OP", "1024", _int("1024"),
                                       "executables kept per op and per compiled graph")
    max_regions: int = _var("TORCHTPU_MAX_REGIONS", "512", _int("512"), "fused defer_and_fuse regions kept")
    max_executable_mb: float = _var("TORCHTPU_MAX_EXECUTABLE_MB", "2048", _float("2048"),
                                    "host memory (MB) the kept executables may hold together, each measured "
                                    "when compiled (`set_executable_limit(total_bytes=)`)")
    compile_headroom_mb: float = _var("TORCHTPU_COMPILE_HEADROOM_MB", "192", _float("192"),
                                      "host memory (MB) a compile must find free, else cached executables go first")
    cache_dir: Optional[str] = _var("TORCHTPU_CACHE_DIR", "unset", _path,
                                    "persistent XLA compilation cache directory (`compile_cache_dir`)")
    # defer_and_fuse
    defer_max_ops: int = _var("TORCHTPU_DEFER_MAX_OPS", "4096", _int("4096"),
                              "ops recorded before a defer_and_fuse region is flushed")
    defer_churn: int = _var("TORCHTPU_DEFER_CHURN", "12", _int("12"),
                            "fresh shapes of one op in a region before it is replayed op by op (compile-storm guard)")
    defer_chunk_ops: int = _var("TORCHTPU_DEFER_CHUNK_OPS", "256", _int("256"),
                                "defer_and_fuse regions of this many ops or more holding a loop run as its "
                                "repeating chunks, each compiled once (`0`: always whole)")
    defer_donate: bool = _var("TORCHTPU_DEFER_DONATE", "0", _off_unless("0", ""),
                              "`1`: regions donate the input buffers they overwrite to XLA")
    # torch.compile
    collectives: str = _var("TORCHTPU_COLLECTIVES", "in_graph", _text("in_graph"),
                            "collectives `in_graph` or `skinny` (`set_collectives` overrides)", read="use")
    bucket_mb: float = _var("TORCHTPU_BUCKET_MB", "25", _float("25"),
                            "bucket size (MB) when compiled graphs fuse their all_reduces (DDP's python reducer)")
    first_bucket_mb: float = _var("TORCHTPU_FIRST_BUCKET_MB", "25", _float("25"),
                                  "size (MB) of the first such bucket")
    partitioner: Optional[str] = _var("TORCHTPU_PARTITIONER", "unset", lambda raw: raw,
                                      "`min_cut`: aot_autograd's min-cut partitioner (recompute, less memory)",
                                      read="use")
    host_part: bool = _var("TORCHTPU_HOST_PART", "1", _on_unless("0"),
                           "run a graph's CPU-only part (optimizer step counts) on the host", read="use")
    dump_stablehlo: Optional[str] = _var("TORCHTPU_DUMP_STABLEHLO", "unset", _path,
                                         "directory to write every compiled graph's StableHLO to", read="use")
    # torch.distributed
    coordinator_address: Optional[str] = _var("TORCHTPU_COORDINATOR_ADDRESS", "unset", _path,
                                              "host:port of JAX's distributed coordinator (default: rank 0, "
                                              "a free port)", read="use")
    dist_check: bool = _var("TORCHTPU_DIST_CHECK", "1", _on_unless("0"),
                            "check that ranks issue the same collectives; `0` skips it", read="use")
    dist_check_grace: float = _var("TORCHTPU_DIST_CHECK_GRACE", "5", _float("5"),
                                   "seconds to wait for peers' signatures (at most the group timeout)",
                                   read="use")
    chip_per_process: bool = _var("TORCHTPU_CHIP_PER_PROCESS", "1", _on_unless("0"),
                                  "under torchrun with several processes per TPU or GPU host, each process "
                                  "opens only its LOCAL_RANK's chip (runtime/chips.py); `0`: every chip",
                                  read="use")
    host_chips: Optional[str] = _var("TORCHTPU_HOST_CHIPS", "unset", _path,
                                     "the host's chips (`tpu:4`, `gpu:8`) where its device files do not show "
                                     "them", read="use")
    dist_abort: bool = _var("TORCHTPU_DIST_ABORT", "1", _on_unless("0"),
                            "a failed or timed-out collective ends the process; `0` only records it",
                            read="use")
    # tools
    pytorch_tests: Optional[str] = _var("TORCHTPU_PYTORCH_TESTS", "unset", _path,
                                        "directory of PyTorch's test files that `python -m torchtpu.validate "
                                        "pytorch_tests` runs (default: ../shared/pytorch_tests)", read="use")
    transformers_tests: Optional[str] = _var("TORCHTPU_TRANSFORMERS_TESTS", "unset", _path,
                                             "tree of Transformers' own tests that `python -m torchtpu.validate "
                                             "transformers_tests` runs (default: ../shared/transformers_tests/"
                                             "tf_tests)", read="use")
    titan_assets: Optional[str] = _var("TORCHTPU_TITAN_ASSETS", "unset", _path,
                                       "directory of `python -m torchtpu.validate titan assets DIR` (tokenizer "
                                       "and dataset TorchTitan's configs read)", read="use")


_FIELDS = {f.name: f for f in fields(Config)}


def read(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The setting `name` (a Config field) as the environment gives it now."""
    meta = _FIELDS[name].metadata
    return meta["parse"]((os.environ if environ is None else environ).get(meta["env"]))


def current(environ: Optional[Mapping[str, str]] = None) -> Config:
    """Every setting as the environment (`os.environ` unless given) gives it now."""
    env = os.environ if environ is None else environ
    return Config(**{name: read(name, env) for name in _FIELDS})


def variables() -> list[tuple[str, str, str, str]]:
    """(variable, default, read at "import" or each "use", meaning) of every variable, in order."""
    return [(f.metadata["env"], f.metadata["default"], f.metadata["read"], f.metadata["meaning"])
            for f in fields(Config)]


def _at_startup() -> Config:
    values = {}
    for name, f in _FIELDS.items():
        try:
            values[name] = read(name)
        except ValueError:
            if f.metadata["read"] == "import":
                raise  # as before: a malformed import-time variable fails the import
            values[name] = f.default  # a use-time one fails where it is used, as before
    return Config(**values)


# The environment when torchtpu was imported: where the import-time variables come from.
startup: Config = _at_startup()

__all__ = ["Config", "current", "read", "startup", "variables"]
