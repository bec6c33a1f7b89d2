"""TorchTitan's own training entry point on tpu, and the same run on CPU as the oracle.

    python -m torchtpu.validate titan assets DIR
        a local tokenizer (byte-level BPE, 256 bytes + BOS/EOS) and a small text dataset
        in TorchTitan's c4_test layout (no network)
    torchrun --nproc-per-node N -m torchtpu.validate.titan [--cpu] [TorchTitan's arguments]
        runs `torchtitan.train.main()`, TorchTitan's entry point, with those arguments;
        `--cpu` runs it on the host with gloo (the oracle)

TorchTitan picks its device from `torch._utils._get_available_device_type()`: no CUDA,
MPS or XPU, then PyTorch's PrivateUse1 backend if `torch.<name>.is_available()`. torchtpu
names PrivateUse1 "tpu" when `import torch` autoloads it, so TorchTitan runs on tpu with
the "tpu" c10d backend (`Backend.default_device_backend_map["tpu"]`) and nothing set.

`--module torchtpu.validate.titan --config llama3_debug_2l` names the configurations below
(TorchTitan 0.3.0's config registry takes any importable module): TorchTitan's
`llama3_debugmodel` cut to 2 layers, seq_len 128, batch 2, assets from
`TORCHTPU_TITAN_ASSETS`, and a metrics processor that also writes each step's loss and
grad norm as JSON lines to `--metrics.loss_file` (TorchTitan's console log rounds them).

What this module does besides, and why (the first three are TorchTitan 0.3.0 against the
packages installed here, on any device; a user on tpu meets them as on CUDA):

- TorchTitan 0.3.0 imports `triton` when its model package loads
  (`models/common/token_dispatcher.py` -> `distributed/minimal_async_ep/kernels.py`, CUDA
  kernels for expert parallelism), and PyTorch's CPU wheel, which a TPU host runs, does
  not bring triton. Where triton is missing, `_tolerate_missing_triton` loads that one
  module against a stand-in whose decorators leave the kernels unusable (they are CUDA
  only) and removes the stand-in again, so `torch.utils._triton` still finds no triton.
  A user installs triton (`pip install triton` works without a GPU) or does the same.
- tyro 0.9.1 (resolved next to typeguard 2.13.3) cannot parse TorchTitan 0.3.0's own
  configs: `_match_annotated_subcommands`.
- torch 2.13.0 lacks `torch.distributed.set_timeout`, which TorchTitan 0.3.0 calls after
  step 1: `_set_timeout_alias`.
- The CPU oracle: TorchTitan has no CPU training path (its device falls back to "cuda"),
  so `--cpu` points its device globals at the host, and runs flex attention through
  PyTorch's eager dense reference (flex_attention refuses CPU inputs that need gradients,
  as Inductor's CPU kernel has no backward), its FSDP2 reduces gradients with SUM (gloo has
  no PREMUL_SUM; TorchTitan's divide factor is 1.0) and its post-step-1 barrier takes no
  device id (the id would name torch.accelerator's tpu).
"""
from __future__ import annotations

import json
import os
import sys
import types

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
SEQ_LEN = 128
LOCAL_BATCH = 2
N_LAYERS = 2


# ---------------------------------------------------------------------------------------
# assets: tokenizer and dataset, generated locally


def make_assets(root: str, docs: int = 64, seed: int = 0) -> str:
    """Write `root/tokenizer` (tokenizer.json + tokenizer_config.json) and `root/c4_test`
    (one JSON-lines file of {"text": ...} documents); returns root. Deterministic."""
    import random

    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tok_dir = os.path.join(root, "tokenizer")
    data_dir = os.path.join(root, "c4_test")
    os.makedirs(tok_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    # byte-level BPE with no merges: every byte its own token, ids 0-255, then BOS/EOS
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS])
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}, f)
    rng = random.Random(seed)
    words = ("the of and to in is was for on that with as by at from his her it an were are which "
             "this be or has had not but first one their its new after who they have two also been "
             "tensor device compile shard gradient model layer token train step loss river city "
             "music game season film school year time world state team war").split()
    with open(os.path.join(data_dir, "train.jsonl"), "w") as f:
        for _ in range(docs):
            n = rng.randint(80, 240)
            text = " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
            f.write(json.dumps({"text": text}) + "\n")
    return root


# ---------------------------------------------------------------------------------------
# configurations for TorchTitan's config registry (`--module torchtpu.validate.titan`)


def _assets() -> str:
    from .. import config

    root = config.read("titan_assets")
    if not root:
        raise RuntimeError("set TORCHTPU_TITAN_ASSETS to a directory made by "
                           "`python -m torchtpu.validate titan assets DIR`")
    return root


def _loss_recorder():
    from dataclasses import dataclass

    from torchtitan.components.metrics import MetricsProcessor

    class LossRecorder(MetricsProcessor):
        """TorchTitan's metrics processor, and each logged step's loss and grad norm
        as a JSON line in `loss_file` (rank 0), at full float precision."""

        @dataclass(kw_only=True, slots=True)
        class Config(MetricsProcessor.Config):
            loss_file: str = ""
            """JSON-lines file for {step, loss, max_loss, grad_norm, device, backend} (rank 0
            writes it): TorchTitan's device type and the process group's backend"""

        def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
            super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
            path = self.config.loss_file
            if path and int(os.environ.get("RANK", "0")) == 0:
                import torch.distributed as dist
                from torchtitan.tools import utils

                with open(path, "a") as f:
                    f.write(json.dumps({"step": step, "loss": float(global_avg_loss),
                                        "max_loss": float(global_max_loss),
                                        "grad_norm": float(grad_norm),
                                        "device": utils.device_type,
                                        "backend": dist.get_backend() if dist.is_initialized() else None,
                                        }) + "\n")

    return LossRecorder


def llama3_debug_2l():
    """TorchTitan's llama3_debugmodel (flex attention, complex RoPE, AdamW lr 8e-4 with
    warmup 2, selective activation checkpointing) with 2 layers, seq_len 128, batch 2 and
    local assets. Everything else, bf16 mixed precision included, is TorchTitan's default."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    root = _assets()
    config = llama3_debugmodel()
    config.model_spec.model.layers = config.model_spec.model.layers[:N_LAYERS]
    config.hf_assets_path = os.path.join(root, "tokenizer")
    config.dataloader.dataset_path = os.path.join(root, "c4_test")
    config.training.seq_len = SEQ_LEN
    config.training.local_batch_size = LOCAL_BATCH
    config.training.steps = 10
    recorder = _loss_recorder()
    config.metrics = recorder.Config(log_freq=1)
    return config


def llama3_debug_2l_full_ac():
    """llama3_debug_2l with full activation checkpointing (every block recomputed)."""
    from torchtitan.distributed.activation_checkpoint import FullAC

    config = llama3_debug_2l()
    config.activation_checkpoint = FullAC.Config()
    return config


# ---------------------------------------------------------------------------------------
# running TorchTitan's entry point


def _tolerate_missing_triton() -> None:
    """Import TorchTitan's triton kernel module against a stand-in `triton` when triton is
    not installed, then drop the stand-in (see the module docstring)."""
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        return
    name = "torchtitan.distributed.minimal_async_ep.kernels"
    if name in sys.modules:
        return

    class _Inert:
        """Absorbs `triton.jit(...)`, `tl.pointer_type(tl.int64)`, `tl.constexpr`: a
        decorated function is returned unchanged (calling it launches nothing useful)."""

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Inert):
                return args[0]
            return self

        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return self

        def __getitem__(self, item):
            return self

    inert = _Inert()
    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")

    def attribute(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return inert

    triton.__getattr__ = language.__getattr__ = attribute  # type: ignore[attr-defined]
    triton.language = language  # type: ignore[attr-defined]
    import torch  # noqa: F401  (loaded before the stand-in goes in, so torch never sees it)
    import torch.utils._triton as _t

    _t.has_triton_package()  # cached False while the stand-in is absent
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        importlib.import_module(name)
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


def _match_annotated_subcommands() -> None:
    """tyro 0.9.1 (what resolves next to typeguard 2.13.3, tokamax's pin) cannot match a
    dataclass default to its `Annotated[Config, tyro.conf.subcommand(...)]` member of a
    union when the dataclass has a `list[str]` field: its type trees keep the `Annotated`
    wrapper, and the fallback subtype check calls `issubclass(list[str], list[str])`, a
    TypeError. TorchTitan 0.3.0's `activation_checkpoint` default (`SelectiveAC.Config`,
    with `force_recompute_mm_shapes_by_fqns: list[str]`) is such a default, so every
    config of TorchTitan's own registry fails to parse. Where tyro's matcher finds nothing,
    a default whose type is exactly one member's (Annotated stripped) names that member."""
    try:
        import tyro._parsers as parsers
        import tyro._subcommand_matching as matching
    except ImportError:
        return
    if getattr(matching.match_subcommand, "_torchtpu", False):
        return
    from typing import Annotated, get_args, get_origin

    original = matching.match_subcommand

    def match_subcommand(default, configs, types):
        name = original(default, configs, types)
        if name is None:
            for candidate, typ in types.items():
                if get_origin(typ) is Annotated:
                    typ = get_args(typ)[0]
                if type(default) is typ:
                    return candidate
        return name

    match_subcommand._torchtpu = True  # type: ignore[attr-defined]
    matching.match_subcommand = match_subcommand
    parsers._subcommand_matching.match_subcommand = match_subcommand


def _set_timeout_alias() -> None:
    """TorchTitan 0.3.0 calls `torch.distributed.set_timeout(timeout, group)` after the
    first step (`distributed/utils.py: set_pg_timeouts`), an API of PyTorch releases after
    2.13; 2.13.0 has the same function as `distributed_c10d._set_pg_timeout`. Without the
    alias every TorchTitan 0.3.0 run on torch 2.13 ends after step 1, on any device."""
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout") and hasattr(dist.distributed_c10d, "_set_pg_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout


class _HostDevice(types.SimpleNamespace):
    """What TorchTitan asks of its device module (torch.cuda's API), answered for the host."""

    def __init__(self):
        import torch

        super().__init__()
        self.set_device = lambda *a, **k: None
        self.device_count = lambda: 1
        self.current_device = lambda: 0
        self.synchronize = lambda *a, **k: None
        self.empty_cache = lambda: None
        self.reset_peak_memory_stats = lambda *a, **k: None
        self.get_device_name = lambda *a, **k: "cpu"
        self.memory_stats = lambda *a, **k: {}
        self.is_available = lambda: True
        self.get_device_properties = lambda *a, **k: types.SimpleNamespace(
            name="cpu", total_memory=1 << 40)
        self.manual_seed = torch.manual_seed
        self.manual_seed_all = torch.manual_seed


def _run_on_host() -> None:
    """Point TorchTitan's device globals at the CPU (the oracle; TorchTitan has no CPU
    training path of its own)."""
    import torch  # noqa: F401
    import torchtitan.tools.utils as tu

    host = _HostDevice()
    tu.device_type, tu.device_module = "cpu", host
    tu.get_local_device = lambda: __import__("torch").device("cpu")
    import torchtitan.components.metrics as m
    import torchtitan.distributed.parallel_dims as pd
    import torchtitan.distributed.utils as du
    import torchtitan.models.common.token_dispatcher as td

    for mod in (du, pd, m, td):
        if hasattr(mod, "device_type"):
            mod.device_type = "cpu"
        if hasattr(mod, "device_module"):
            mod.device_module = host
    du.get_local_device = tu.get_local_device
    set_pg_timeouts = du.set_pg_timeouts

    def host_pg_timeouts(timeout, parallel_dims):
        # its barrier(device_ids=[...]) names torch.accelerator's device type (tpu, which
        # gloo does not serve); on the host the barrier needs no device
        import torch.distributed as dist

        barrier = dist.barrier
        dist.barrier = lambda *a, **k: barrier()
        try:
            set_pg_timeouts(timeout, parallel_dims)
        finally:
            dist.barrier = barrier

    du.set_pg_timeouts = host_pg_timeouts

    # TorchTitan sets FSDP2's gradient divide factor to 1.0 (it scales by the global token
    # count itself), so FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM(1.0), which gloo
    # refuses; on the host the oracle reduces with SUM, the same sum
    import torchtitan.distributed.fsdp as tf

    no_division = tf.disable_fsdp_gradient_division

    def host_no_division(model):
        no_division(model)
        for module in model.modules():
            if isinstance(module, tf.FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    tf.disable_fsdp_gradient_division = host_no_division
    # flex_attention refuses CPU tensors that need gradients (Inductor's CPU kernel has no
    # backward); its eager path, PyTorch's dense reference with autograd, has one. The
    # oracle runs that path: TorchTitan's compiled flex call becomes the eager one (as
    # TorchTitan does itself for determinism on ROCm) and the CPU refusal is lifted.
    import torch.nn.attention.flex_attention as fa
    from torchtitan.models.common.attention import FlexAttention

    check = fa._validate_device

    def validate_device(query, key, value):
        if query.device.type != "cpu":
            check(query, key, value)

    fa._validate_device = validate_device
    FlexAttention._compiled_flex_attn = fa.flex_attention
    m.DeviceMemoryMonitor.get_peak_stats = lambda self: types.SimpleNamespace(
        max_active_gib=0.0, max_active_pct=0.0, max_reserved_gib=0.0, max_reserved_pct=0.0,
        num_alloc_retries=0, num_ooms=0)


def train(argv: list[str]) -> None:
    """TorchTitan's entry point (`torchtitan.train.main`) with `argv`; `--cpu` first runs it
    on the host."""
    on_host = "--cpu" in argv
    argv = [a for a in argv if a != "--cpu"]
    _tolerate_missing_triton()
    _match_annotated_subcommands()
    _set_timeout_alias()
    if on_host:
        _run_on_host()
    import torchtitan.train

    sys.argv = ["torchtitan.train", *argv]
    torchtitan.train.main()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["assets"]:
        if len(argv) != 2:
            raise SystemExit("usage: python -m torchtpu.validate titan assets DIR")
        print(make_assets(argv[1]))
        return 0
    if argv[:1] == ["train"]:
        argv = argv[1:]
    train(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
