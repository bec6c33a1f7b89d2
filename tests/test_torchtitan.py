"""TorchTitan 0.3.0's own training entry point on tpu, compared with the same run on CPU.

Each run is `torchrun --nproc-per-node N -m torchtpu.validate.titan ...`, which calls
`torchtitan.train.main()` with TorchTitan's command line (`--module torchtpu.validate.titan
--config llama3_debug_2l`: llama3_debugmodel cut to 2 layers, seq_len 128, batch 2, 10 AdamW
steps) from one seed checkpoint made on CPU; TorchTitan picks the "tpu" device and c10d
backend by itself. The oracle is the same command with `--cpu` (host, gloo). Losses are
TorchTitan's global average loss per step, at full precision.

Launches are few and shared: every run is made once per module (`_run` caches it) and the
CPU oracle of a configuration serves each tpu run of it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import assert_values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FP32 = ("--training.mixed_precision_param", "float32")
# TorchTitan 0.3.0's default SPMD backend ("spmd_types") hands FSDP2 plain parameters with
# dp_mesh_dims, which torch 2.13's fully_shard refuses on every device ("When dp_mesh_dims
# is provided, all parameters must be DTensors"); 2-process runs take "partial_dtensor",
# TorchTitan's FSDP2 + DTensor path
PARTIAL = ("--parallelism.spmd_backend", "partial_dtensor")
FSDP2 = ("--parallelism.data_parallel_shard_degree", "2", *PARTIAL)
TP2 = ("--parallelism.tensor_parallel_degree", "2", *PARTIAL)
RTOL = 1e-5        # float32 runs: per-step loss, relative to CPU's
BF16_RTOL = 1e-2   # TorchTitan's default bf16 mixed precision: about bf16's rounding (2^-7)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Titan:
    """One directory per module: assets, the seed checkpoint and every run's dump folder."""

    def __init__(self, root: str):
        self.root = root
        self.runs: dict[tuple, list[dict]] = {}
        sys.path.insert(0, ROOT)
        from torchtpu.validate.titan import make_assets

        make_assets(os.path.join(root, "assets"))
        self.launch("seed", 1, "--config", "llama3_debug_2l", "--checkpoint.enable",
                    "--checkpoint.create_seed_checkpoint", cpu=True, seed=False)
        self.seed = os.path.join(root, "seed", "checkpoint", "step-0")
        assert os.path.isdir(self.seed)

    def env(self, mode: str | None) -> dict:
        env = dict(os.environ)
        env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
                   TORCHTPU_TITAN_ASSETS=os.path.join(self.root, "assets"),
                   HF_HOME=os.path.join(self.root, "hf"), HF_DATASETS_OFFLINE="1",
                   HF_HUB_OFFLINE="1", TORCHTPU_CACHE_DIR=os.path.join(self.root, "xla-cache"))
        env.pop("PYTEST_CURRENT_TEST", None)
        env.pop("TORCHTPU_EAGER_MODE", None)
        if mode:
            env["TORCHTPU_EAGER_MODE"] = mode
        return env

    def launch(self, name: str, nproc: int, *args: str, cpu: bool = False,
               mode: str | None = None, seed: bool = True) -> list[dict]:
        """torchrun TorchTitan in `nproc` processes; its per-step losses."""
        dump = os.path.join(self.root, name)
        losses = dump + ".jsonl"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               "-m", "torchtpu.validate.titan", *(["--cpu"] if cpu else []),
               "--module", "torchtpu.validate.titan", "--dump_folder", dump, *args]
        if seed:
            cmd += ["--checkpoint.enable", "--checkpoint.initial_load_path", self.seed,
                    "--metrics.loss_file", losses]
        proc = subprocess.run(cmd, cwd=self.root, env=self.env(mode), capture_output=True, text=True)
        with open(dump + ".log", "w") as f:
            f.write(proc.stdout + proc.stderr)
        assert proc.returncode == 0, f"{name} failed (rc={proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
        if not seed:
            return []
        with open(losses) as f:
            steps = [json.loads(line) for line in f]
        # TorchTitan chose the device and c10d backend itself
        want = "cpu" if cpu else "tpu"
        assert {(r["device"], r["backend"]) for r in steps} == {(want, "gloo" if cpu else "tpu")}, name
        return steps

    def run(self, name: str, nproc: int, *args: str, cpu: bool = False, mode: str | None = None):
        key = (nproc, args, cpu, mode)
        if key not in self.runs:
            self.runs[key] = self.launch(name, nproc, *args, cpu=cpu, mode=mode)
        return self.runs[key]


@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    pytest.importorskip("torchtitan")
    return Titan(str(tmp_path_factory.mktemp("titan")))


def _losses(run: list[dict]) -> dict:
    """A run's loss per step, for conftest.assert_values (steps 1 to 10, each once)."""
    assert [r["step"] for r in run] == list(range(1, 11)), [r["step"] for r in run]
    return {r["step"]: r["loss"] for r in run}


BASE = ("--config", "llama3_debug_2l", *FP32)
# the strict run also saves at step 5, for the resume test
STRICT = (*BASE, "--checkpoint.interval", "5")


def _cpu(titan):
    return titan.run("cpu", 1, *STRICT, cpu=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
def test_one_process(titan, mode):
    """1 process (TorchTitan still wraps the model in FSDP2 on a 1-device mesh), float32."""
    if mode == "compile":
        got = titan.run("compile", 1, *BASE, "--compile.enable", mode="strict")
    elif mode == "strict":
        got = titan.run("strict", 1, *STRICT, mode="strict")
    else:
        got = titan.run(mode, 1, *BASE, mode=mode)
    assert_values(_losses(got), _losses(_cpu(titan)), rtol=RTOL, atol=0, msg=mode)


@pytest.mark.slow
def test_full_activation_checkpointing(titan):
    """Every block recomputed in backward: the same losses as CPU without recompute."""
    got = titan.run("full_ac", 1, "--config", "llama3_debug_2l_full_ac", *FP32, mode="strict")
    assert_values(_losses(got), _losses(_cpu(titan)), rtol=RTOL, atol=0, msg="full AC")


@pytest.mark.slow
def test_resume_bit_identical(titan):
    """DCP save at step 5, resume in a fresh process: steps 6-10 bit-identical."""
    whole = titan.run("strict", 1, *STRICT, mode="strict")
    src = os.path.join(titan.root, "strict", "checkpoint", "step-5")
    dst = os.path.join(titan.root, "resume", "checkpoint", "step-5")
    assert os.path.isdir(src)
    shutil.rmtree(os.path.join(titan.root, "resume"), ignore_errors=True)
    shutil.copytree(src, dst)
    # the folder holds step-5, so TorchTitan resumes from it (model, optimizer, scheduler,
    # dataloader, step) and ignores the seed
    resumed = titan.launch("resume", 1, *STRICT, mode="strict")
    assert [r["step"] for r in resumed] == list(range(6, 11))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole[5:]]
    assert [r["grad_norm"] for r in resumed] == [r["grad_norm"] for r in whole[5:]]


@pytest.mark.slow
def test_fsdp2(titan):
    """2 processes, FSDP2 over both (TorchTitan's gradient divide factor: PREMUL_SUM)."""
    want = titan.run("fsdp_cpu", 2, *BASE, *FSDP2, cpu=True)
    got = titan.run("fsdp", 2, *BASE, *FSDP2, mode="strict")
    assert_values(_losses(got), _losses(want), rtol=RTOL, atol=0, msg="FSDP2")


@pytest.mark.slow
def test_tensor_parallel(titan):
    """2 processes, tensor parallel (DTensor, sequence parallel) over both."""
    want = titan.run("tp_cpu", 2, *BASE, *TP2, cpu=True)
    got = titan.run("tp", 2, *BASE, *TP2, mode="strict")
    assert_values(_losses(got), _losses(want), rtol=RTOL, atol=0, msg="TP")


@pytest.mark.slow
def test_bf16_mixed_precision(titan):
    """TorchTitan's default: FSDP2's bf16 parameters and compute, float32 reductions."""
    want = titan.run("bf16_cpu", 1, "--config", "llama3_debug_2l", cpu=True)
    got = titan.run("bf16", 1, "--config", "llama3_debug_2l", mode="strict")
    assert_values(_losses(got), _losses(want), rtol=BF16_RTOL, atol=0, msg="bf16")


# ---- fast: the launcher's own pieces -------------------------------------------------------


def test_launcher_parses_torchtitan_configs(tmp_path, monkeypatch):
    """TorchTitan's ConfigManager parses the configs with the installed tyro (SelectiveAC's
    default included), and the triton stand-in is gone once TorchTitan's model loads."""
    pytest.importorskip("torchtitan")
    import importlib.util

    import torch.utils._triton

    from torchtpu.validate import titan as T

    T.make_assets(str(tmp_path))
    monkeypatch.setenv("TORCHTPU_TITAN_ASSETS", str(tmp_path))
    T._tolerate_missing_triton()
    T._match_annotated_subcommands()
    if importlib.util.find_spec("triton") is None:
        assert "triton" not in sys.modules and not torch.utils._triton.has_triton_package()
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    base = ConfigManager().parse_args(["--module", "torchtpu.validate.titan", "--config",
                                       "llama3_debug_2l", "--metrics.loss_file", "x.jsonl"])
    assert isinstance(base.activation_checkpoint, SelectiveAC.Config)
    assert base.metrics.loss_file == "x.jsonl" and len(base.model_spec.model.layers) == 2
    full = ConfigManager().parse_args(["--module", "torchtpu.validate.titan", "--config",
                                       "llama3_debug_2l_full_ac"])
    assert isinstance(full.activation_checkpoint, FullAC.Config)


def test_assets_tokenizer(tmp_path):
    """The generated tokenizer loads through TorchTitan's HuggingFaceTokenizer with BOS/EOS."""
    pytest.importorskip("torchtitan")
    from torchtpu.validate import titan as T

    T.make_assets(str(tmp_path))
    T._tolerate_missing_triton()
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tok = HuggingFaceTokenizer(tokenizer_path=str(tmp_path / "tokenizer"))
    ids = tok.encode("the model", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == len("the model") + 2
    assert tok.decode(ids[1:-1]) == "the model" and tok.get_vocab_size() <= 2048
