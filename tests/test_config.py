"""torchtpu/config.py: every TORCHTPU_* environment variable read in one place, each with the
parsing it had where it was read before, documented in the README table."""
from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

import torch
import torchtpu
from torchtpu import config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_defaults_are_an_empty_environment():
    assert config.current({}) == config.Config()
    assert [v[0] for v in config.variables()] == [f.metadata["env"] for f in dataclasses.fields(config.Config)]
    assert all(v[0].startswith("TORCHTPU_") for v in config.variables())


# (field, raw value, setting): the strings each variable took before config.py, down to
# which ones mean "off" (they differ by variable, and stay so)
PARSED = [
    ("eager_mode", " defer_and_fuse ", "defer_and_fuse"), ("eager_mode", "  ", "strict"),
    ("debug_nans", "1", True), ("debug_nans", "", False), ("debug_nans", "0", False),
    ("checks", " 0 ", False), ("checks", "false", False), ("checks", "", False), ("checks", "yes", True),
    ("fallback", "False", False), ("fallback", "", True), ("fallback", " 0", True),
    ("max_executables", "7", 7), ("max_executables_per_op", "3", 3), ("max_regions", "2", 2),
    ("fast_compile_after", "0", 0), ("defer_max_ops", "100", 100), ("defer_churn", "3", 3),
    ("defer_donate", "1", True), ("defer_donate", "", False), ("defer_donate", "0", False),
    ("cache_dir", "", None), ("cache_dir", "/x", "/x"),
    ("collectives", "skinny", "skinny"), ("collectives", "", ""),
    ("bucket_mb", "0.5", 0.5), ("compile_headroom_mb", "64", 64.0), ("first_bucket_mb", "1", 1.0),
    ("partitioner", "min_cut", "min_cut"), ("host_part", "0", False), ("host_part", "off", True),
    ("dump_stablehlo", "", None), ("dump_stablehlo", "/d", "/d"),
    ("coordinator_address", "", None), ("coordinator_address", "h:1", "h:1"),
    ("dist_check", "0", False), ("dist_check_grace", "0.25", 0.25), ("dist_abort", "0", False),
    ("jax_tracebacks", "1", True), ("jax_tracebacks", "", False), ("jax_tracebacks", "0", False),
]


_ENV = {f.name: f.metadata["env"] for f in dataclasses.fields(config.Config)}


@pytest.mark.parametrize("name,raw,want", PARSED, ids=[f"{n}={r!r}" for n, r, _ in PARSED])
def test_each_variable_parses_as_before(name, raw, want):
    env = {_ENV[name]: raw}
    assert config.read(name, env) == want
    assert getattr(config.current(env), name) == want


def test_malformed_numbers_raise():
    with pytest.raises(ValueError):
        config.read("max_executables", {"TORCHTPU_MAX_EXECUTABLES": "many"})
    with pytest.raises(ValueError):
        config.read("dist_check_grace", {"TORCHTPU_DIST_CHECK_GRACE": ""})


def test_use_time_variables_follow_the_environment(monkeypatch):
    """Read where used, so a variable set in a running process (as tests and launchers do)
    applies to the next compile; the setter still wins."""
    monkeypatch.setenv("TORCHTPU_COLLECTIVES", "skinny")
    assert torchtpu.get_collectives() == "skinny"
    monkeypatch.setenv("TORCHTPU_COLLECTIVES", "in_graph")
    assert torchtpu.get_collectives() == "in_graph"
    monkeypatch.setenv("TORCHTPU_COLLECTIVES", "sideways")
    with pytest.raises(ValueError, match="TORCHTPU_COLLECTIVES"):
        torchtpu.get_collectives()


def _env_reads(path: pathlib.Path) -> list[int]:
    """Lines of `path` that read the environment (os.environ / os.getenv) with a TORCHTPU_ name."""
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Call, ast.Subscript)):
            text = ast.unparse(node)
            if ("environ" in text or "getenv" in text) and "TORCHTPU_" in text \
                    and not text.startswith(("dict(", "subprocess")):  # building a child's environment
                lines.append(node.lineno)
    return sorted(set(lines))


def test_only_config_reads_torchtpu_variables():
    pkg = ROOT / "torchtpu"
    found = {str(p.relative_to(ROOT)): _env_reads(p) for p in pkg.rglob("*.py") if p != pkg / "config.py"}
    assert {k: v for k, v in found.items() if v} == {}
    assert _env_reads(pkg / "runtime" / "cache.py") == [] and found  # the scan sees files at all


def test_readme_table_is_the_config():
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `TORCHTPU_")
            and line.count("|") == 5]
    want = [f"| `{env}` | {default} | {read} | {meaning} |" for env, default, read, meaning in config.variables()]
    assert rows == want


def test_public():
    assert torchtpu.config is config and "config" in torchtpu.__all__
    assert isinstance(config.startup, config.Config)


def test_jax_records_no_stacks_unless_asked():
    """JAX's per-launch stack record is off after import (TORCHTPU_JAX_TRACEBACKS unset), and
    a traced op's errors still name the op: torchtpu's own, not JAX's source info."""
    from jax._src.lib import _jax

    if "TORCHTPU_JAX_TRACEBACKS" not in os.environ:
        assert _jax.tracebacks_enabled() is False
    x = torch.ones(2, 3, device="tpu")
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        torch.mm(x, x)


@pytest.mark.slow
def test_import_time_variables_reach_their_modules():
    """Set before import, each import-time variable is what its module runs with."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TORCHTPU_EAGER_MODE="debug", TORCHTPU_DEBUG_NANS="1",
               TORCHTPU_CHECKS="0", TORCHTPU_FALLBACK="0", TORCHTPU_MAX_EXECUTABLES="11",
               TORCHTPU_MAX_EXECUTABLES_PER_OP="5", TORCHTPU_MAX_REGIONS="3", TORCHTPU_DEFER_MAX_OPS="77",
               TORCHTPU_DEFER_CHURN="4", TORCHTPU_DEFER_CHUNK_OPS="99", TORCHTPU_DEFER_DONATE="1",
               TORCHTPU_FAST_COMPILE_AFTER="2", TORCHTPU_BUCKET_MB="1", TORCHTPU_FIRST_BUCKET_MB="0.5",
               TORCHTPU_JAX_TRACEBACKS="1")
    code = (
        "import torchtpu\n"
        "from torchtpu.eager import deferred, modes, op_program, region_plan\n"
        "from torchtpu.compile import collectives\n"
        "print(torchtpu.get_eager_mode(), modes.debug_nans(), torchtpu.checks_enabled(),\n"
        "      torchtpu.fallback_enabled(), sorted(torchtpu.executable_limit().items()),\n"
        "      deferred.MAX_OPS, deferred.CHURN, deferred.DONATE, op_program.FAST_AFTER,\n"
        "      collectives.BUCKET_BYTES, collectives.FIRST_BUCKET_BYTES, region_plan.MIN_OPS)\n"
        "from jax._src.lib import _jax\n"
        "print(_jax.tracebacks_enabled())\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "True"  # TORCHTPU_JAX_TRACEBACKS=1
    assert out.stdout.split("\n")[-3] == (
        f"debug True False False [('per_op', 5), ('regions', 3), ('total', 11), ('total_bytes', {2048 << 20})] "
        "77 4 True 2 1048576 524288 99")  # (total_bytes: TORCHTPU_MAX_EXECUTABLE_MB's default, 2048)
