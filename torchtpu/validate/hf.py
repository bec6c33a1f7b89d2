"""Hugging Face Transformers on tpu vs CPU: every model type in the auto mappings.

    python -m torchtpu.validate hf [--json PATH] [--markdown PATH] [--models TYPE ...]
                                   [--mode strict|defer_and_fuse|compile] [--variants base head]
                                   [--attn eager|sdpa] [--no-backward] [--generate] [--jobs N]

For each model type: a tiny config derived from the config class's defaults (hf_configs.py: generic
rules plus per-type overrides), random weights from torch.manual_seed(0) on CPU, the same model
deep-copied to "tpu", dummy inputs for its modality, one forward on each, every output tensor
compared. The base model runs, plus the first head that exists (causal-LM, seq2seq, masked-LM,
classification, ...). Causal-LM heads also run one backward (loss from labels=input_ids; every
parameter's gradient compared) and, with --generate, greedy generate(max_new_tokens=8).

States: match, mismatch (max abs/rel error), tpu-error (failing op and exception), cpu-error (the
CPU reference itself failed: excluded from the denominator), skipped (reason).
Needs the `hf` extra (transformers). Never downloads: HF_HUB_OFFLINE=1.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import os
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import torchtpu  # noqa: E402

from . import hf_configs as C  # noqa: E402
from .progress import Progress  # noqa: E402
from .timeout import Timeout as _Timeout, time_limit as _time_limit  # noqa: E402

STATES = ("match", "mismatch", "tpu-error", "cpu-error", "skipped")
MODES = ("strict", "defer_and_fuse", "compile")
# float32 tolerances, one place. Both sides compute in float32 from identical weights; XLA:CPU and
# ATen differ in accumulation order (matmul blocking, reductions, fused softmax/layer-norm) and in
# transcendental implementations (exp/erf/tanh), ~1e-6 relative per op. Tiny 2-layer models with
# <=128-wide reductions stay well below 1e-5 (llama: 9e-8); 1e-4 leaves an order of margin for
# models with normalisations of near-constant activations, and any real bug (a wrong op, mask,
# view or dtype) shows up as errors of 1e-2 or more. The max abs/rel error is reported per model.
ATOL = 1e-4
RTOL = 1e-4
# Gradients: atol scales with each gradient tensor's largest magnitude (ATOL * max(1, max|g|)).
# A gradient element is a sum over the batch and sequence whose float32 rounding error follows
# the size of its largest terms, not of the sum: e.g. rwkv's embeddings (init std ~1e-4) go
# through a layer norm that scales their gradient by 1/std to ~400, and elements of ~0.5 that are
# differences of such terms carry float32 error ~3e-4 on CPU itself (vs a float64 reference:
# CPU 2.9e-4, tpu 2.7e-4). A wrong op still shows as an error of the gradient's own size.
GRAD_ATOL_SCALED = True
# The global RNG is reseeded before every forward, CPU and tpu alike: models that draw random
# numbers on the CPU inside forward (vilt's patch sampling: torch.multinomial on a CPU tensor)
# then draw the same ones on both sides.
SEED = 0


@dataclass
class Result:
    model_type: str
    variant: str = "base"            # base, causal-lm, masked-lm, ...
    cls: str = ""
    modality: str = ""
    state: str = "skipped"
    detail: str = ""
    failing_op: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    attn: str = ""
    cpu_fallbacks: int = 0
    fallback_ops: dict = field(default_factory=dict)
    compiles: int = 0                # XLA compilations during the tpu forward
    backward: str = ""               # "" when not run; else a state
    backward_detail: str = ""
    generate: str = ""
    generate_detail: str = ""
    seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.model_type}:{self.variant}"

    def to_json(self) -> dict:
        d = asdict(self)
        d["detail"] = d["detail"][:600]
        d["backward_detail"] = d["backward_detail"][:400]
        d["generate_detail"] = d["generate_detail"][:400]
        d["seconds"] = round(self.seconds, 2)
        d["max_abs"] = float(f"{self.max_abs:.3g}")
        d["max_rel"] = float(f"{self.max_rel:.3g}")
        return d


# ---------------------------------------------------------------------------------------------
# Model enumeration


def _auto():
    from transformers.models.auto import configuration_auto, modeling_auto

    return modeling_auto, configuration_auto


def model_types() -> list[str]:
    ma, ca = _auto()
    types = set(ma.MODEL_MAPPING_NAMES)
    for _, mapping in C.HEAD_PRIORITY:
        types |= set(getattr(ma, mapping, {}))
    return sorted(t for t in types if t in ca.CONFIG_MAPPING_NAMES)


def variants(model_type: str, which=("base", "head")) -> list[tuple[str, str]]:
    """[(variant, class name)]: the base model and the first head that exists."""
    ma, _ = _auto()
    out = []
    if "base" in which:
        name = ma.MODEL_MAPPING_NAMES.get(model_type)
        if isinstance(name, (tuple, list)):
            name = name[0]
        if name:
            out.append(("base", name))
    if "head" in which:
        for variant, mapping in C.HEAD_PRIORITY:
            name = getattr(ma, mapping, {}).get(model_type)
            if isinstance(name, (tuple, list)):
                name = name[0]
            if name:
                out.append((variant, name))
                break
        if not out and "base" not in which:  # no head: the base model stands for the type
            return variants(model_type, ("base",))
    return out


# ---------------------------------------------------------------------------------------------
# Tiny configs


def _is_config_dict(v) -> bool:
    return isinstance(v, dict) and "model_type" in v


def _shrink_dict(d: dict, top: bool = True) -> dict:
    t = C.TINY
    d = dict(d)
    orig_layers = None
    for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            orig_layers = d[k]
            break
    orig_heads = next((d[k] for k in C.HEAD_KEYS if isinstance(d.get(k), int)), None)
    new = {}
    for k in C.DROP_KEYS:  # derived from the layer count etc. in __init__: let it recompute them
        d.pop(k, None)
    for k, v in d.items():
        if _is_config_dict(v) or (k in C.SUBCONFIG_KEYS and isinstance(v, dict)):
            new[k] = _shrink_dict(v, top=False)
            continue
        if isinstance(v, dict) and k in ("rope_parameters", "rope_scaling"):
            sections = v.get("mrope_section")
            if not isinstance(sections, list) and str(d.get("model_type", "")).startswith(C.MROPE_TYPES):
                sections = C.MROPE_DEFAULT  # the model's code defaults to a full-size section list
            if isinstance(sections, list):
                frac = v.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0
                rot = int(C.TINY["head_dim"] * frac) // 2
                if rot < len(sections):  # too few frequencies for the sections: rotate all dims
                    v = {**v, "partial_rotary_factor": 1.0}
                    rot = C.TINY["head_dim"] // 2
                new[k] = dict(v, mrope_section=_rescale(sections, rot))
                continue
        if isinstance(v, dict) and v and all(str(x).lstrip("-").isdigit() for x in v):
            new[k] = v  # per-layer dicts: trimmed below, once the layer count is known
            continue
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            if k in C.LAYER_KEYS:
                new[k] = min(v, t["layers"])
            elif k in C.HIDDEN_KEYS:
                new[k] = min(v, t["hidden"])
            elif k in C.HEAD_KEYS:
                new[k] = min(v, t["heads"])
            elif k in C.KV_HEAD_KEYS:
                new[k] = min(v, t["heads"] if orig_heads is not None and v >= orig_heads else t["kv_heads"])
            elif k in C.HEAD_DIM_KEYS:
                new[k] = min(v, t["head_dim"])
            elif k in C.INTERMEDIATE_KEYS:
                new[k] = min(v, t["intermediate"])
            elif k in C.VOCAB_KEYS:
                new[k] = min(v, t["vocab"])
            elif k in C.POSITION_KEYS:
                new[k] = min(v, t["positions"])
            elif k in C.EXPERT_KEYS:
                new[k] = min(v, t["experts"])
            elif k in C.EXPERTS_PER_TOK_KEYS:
                new[k] = min(v, t["experts_per_tok"])
            elif k == "image_size" or k == "img_size" or k == "input_size":
                new[k] = min(v, t["image"])
            elif k == "patch_size":
                new[k] = min(v, t["patch"])
            elif k in C.ROTARY_DIM_KEYS:
                new[k] = min(v, t["head_dim"])
            elif k == "num_frames":
                new[k] = min(v, 4)
            # suffix rules for the long tail (MLA / linear-attention / indexer variants)
            elif k.endswith("_lora_rank"):
                new[k] = min(v, 16)
            elif k.endswith("head_dim"):
                new[k] = min(v, t["head_dim"])
            elif k.endswith("_num_heads") or (k.endswith("_heads") and k.startswith(("num_", "n_"))) \
                    or k.endswith("_n_heads"):
                new[k] = min(v, t["heads"])
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            n = len(v)
            if k in C.LIST_DEPTH_KEYS:
                new[k] = [1] * n
            elif k in C.LIST_HEADS_KEYS:
                new[k] = [min(x, 2 ** min(i, 3)) for i, x in enumerate(v)]
            elif k in C.LIST_HIDDEN_KEYS:
                new[k] = [min(x, 16 * 2 ** min(i, 2)) for i, x in enumerate(v)]
            elif k in ("image_size", "img_size") and n == 2:
                new[k] = [min(x, t["image"]) for x in v]
            elif k == "patch_size" and n == 2:
                new[k] = [min(x, t["patch"]) for x in v]
            elif k in ("conv_dim",):
                new[k] = [min(x, t["hidden"]) for x in v]
    d.update(new)
    # Per-layer lists sized by the original layer count follow the new count.
    layers = next((d[k] for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
                   if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)
    if orig_layers and layers and layers != orig_layers:
        for k, v in list(d.items()):
            if isinstance(v, list) and len(v) == orig_layers:
                d[k] = v[:layers]
            elif isinstance(v, dict) and v and all(str(x).lstrip("-").isdigit() for x in v):
                d[k] = {x: y for x, y in v.items() if 0 <= int(x) < layers}
    # Special token ids must lie inside the new vocabulary.
    vocab = d.get("vocab_size")
    if isinstance(vocab, int) and vocab <= t["vocab"]:
        remap: dict[int, int] = {}

        def fix(x):
            if isinstance(x, int) and not isinstance(x, bool) and x >= vocab:
                if x not in remap:
                    remap[x] = vocab - 1 - len(remap)
                return remap[x]
            return x

        for k, v in list(d.items()):
            if k.endswith("token_id") or k.endswith("token_index") or k.endswith("token_ids"):
                d[k] = [fix(x) for x in v] if isinstance(v, list) else fix(v)
    return d


def _rescale(sections: list, total: int) -> list:
    """Integer sections proportional to `sections`, summing to `total` (e.g. mrope_section)."""
    s = sum(sections) or 1
    out = [max(1, x * total // s) for x in sections]
    out[-1] += total - sum(out)
    return out


def _apply_overrides(cfg, overrides: dict) -> None:
    for key, value in overrides.items():
        obj = cfg
        *path, last = key.split(".")
        for p in path:
            obj = getattr(obj, p)
        setattr(obj, last, value)


def tiny_config(model_type: str):
    """A small config of `model_type`: generic rules, then hf_configs.OVERRIDES."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    d = default.to_dict()
    ov = C.OVERRIDES.get(model_type, {})
    shrunk = _shrink_dict(d)
    for k in ("transformers_version", "architectures", "_name_or_path", "model_type"):
        shrunk.pop(k, None)
    flat = {k: v for k, v in ov.items() if "." not in k}
    shrunk.update(flat)
    late = {}
    for k, v in ov.items():  # dotted keys into sub-config dicts: before __init__ validates them
        if "." not in k:
            continue
        *path, last = k.split(".")
        obj = shrunk
        for part in path:
            obj = obj.get(part) if isinstance(obj, dict) else None
        if isinstance(obj, dict):
            obj[last] = v
        else:
            late[k] = v
    cfg = type(default)(**shrunk)
    _apply_overrides(cfg, late)
    for sub in [cfg] + [getattr(cfg, k, None) for k in C.SUBCONFIG_KEYS]:
        if sub is not None and hasattr(sub, "use_cache"):
            sub.use_cache = False
    return cfg


# ---------------------------------------------------------------------------------------------
# Inputs


def _get(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    for sub in ("text_config", "vision_config", "audio_config", "encoder", "encoder_config"):
        s = getattr(cfg, sub, None)
        if s is not None and not isinstance(s, dict):
            for n in names:
                v = getattr(s, n, None)
                if v is not None:
                    return v
    return default


def modality(model) -> str:
    name = getattr(model, "main_input_name", "input_ids")
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "input_ids"
    cfg = model.config
    if name == "input_ids":
        if getattr(cfg, "vision_config", None) is not None or getattr(cfg, "audio_config", None) is not None:
            return "multimodal"
        return "text"
    if name in ("pixel_values", "pixel_values_videos", "images"):
        return "vision"
    if name in ("input_features", "input_values", "audio_values", "spectrogram"):
        return "audio"
    if name in ("past_values",):
        return "time-series"
    return "other"


def _class_modality(cls_name: str) -> str:
    """The modality from the class alone (before the model is built; refined by modality())."""
    try:
        import transformers

        cls = getattr(transformers, cls_name)
        name = getattr(cls, "main_input_name", "input_ids")
        cfg_cls = getattr(cls, "config_class", None)
    except Exception:  # e.g. a class that needs a missing optional library
        return "unknown"
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "input_ids"
    if name == "input_ids" and cfg_cls is not None and any(
            k in getattr(cfg_cls, "sub_configs", {}) for k in ("vision_config", "audio_config")):
        return "multimodal"
    return {"input_ids": "text", "pixel_values": "vision", "pixel_values_videos": "vision",
            "images": "vision", "input_features": "audio", "input_values": "audio",
            "audio_values": "audio", "past_values": "time-series"}.get(name, "other")


def make_inputs(model, variant: str) -> list[dict]:
    """Candidate dummy inputs for `model`, on CPU, from a fixed seed: the first that the CPU
    reference accepts is used (layouts differ between model families with the same main input)."""
    t = C.TINY
    cfg = model.config
    g = torch.Generator().manual_seed(1234)
    params = inspect.signature(model.forward).parameters
    name = getattr(model, "main_input_name", "input_ids")
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "input_ids"
    if name not in params:  # sub-models that keep the default main_input_name: their first input
        name = next((n for n in C.MAIN_INPUTS if n in params), name)
    b, s = t["batch"], t["seq"]
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    vocab = getattr(text_cfg, "vocab_size", None) or _get(cfg, "vocab_size", default=t["vocab"])

    def ids(n):
        lo = 3 if vocab > 8 else 0
        return torch.randint(lo, max(vocab - 4, lo + 1), (b, n), generator=g)

    def text():
        d = {"input_ids": ids(s)}
        if "attention_mask" in params:
            mask = torch.ones(b, s, dtype=torch.long)
            mask[1, -2:] = 0  # right padding in the second row
            d["attention_mask"] = mask
        return d

    def pixels(key="pixel_values", video=False):
        vc = getattr(cfg, "vision_config", None) or cfg
        if isinstance(vc, dict):
            vc = cfg
        ch = _get(vc, "num_channels", "in_channels", "in_chans", default=3)
        size = _get(vc, "image_size", "img_size", "input_size", default=t["image"])
        if isinstance(size, dict):
            size = size.get("height", t["image"])
        h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        if video:
            return {key: torch.randn(b, _get(vc, "num_frames", default=4), ch, h, w, generator=g)}
        return {key: torch.randn(b, ch, h, w, generator=g)}

    def patches(key):
        """Flattened patches + grid_thw (Qwen2-VL-style vision towers): 2 images of 4x4 patches."""
        vc = getattr(cfg, "vision_config", None) or cfg
        ch = _get(vc, "in_channels", "in_chans", "num_channels", default=3)
        tps = _get(vc, "temporal_patch_size", default=1)
        ps = _get(vc, "patch_size", default=t["patch"])
        tps = tps[0] if isinstance(tps, (list, tuple)) else tps
        ps = ps[0] if isinstance(ps, (list, tuple)) else ps
        m = _get(vc, "spatial_merge_size", default=2)
        grid = torch.tensor([[1, 2 * m, 2 * m]] * b)
        n = int(grid.prod(-1).sum())
        return {key: torch.randn(n, ch * tps * ps * ps, generator=g), grid_key: grid}

    grid_key = next((k for k in ("grid_thw", "image_grid_thw") if k in params), None)
    cands: list[dict] = []
    if grid_key and name in ("hidden_states", "pixel_values"):
        cands.append(patches(name))
    if name == "input_ids":
        cands.append(text())
        if "pixel_values" in params:  # vision-language models whose forward needs an image
            cands.append({**text(), **pixels()})
    elif name == "hidden_states" and grid_key:
        pass
    elif name in ("pixel_values", "images", "pixel_values_videos"):
        if "spatial_shapes" in params:  # NaFlex (SigLIP2): patchified pixels + mask + patch grid
            vc = getattr(cfg, "vision_config", None) or cfg
            ps = _get(vc, "patch_size", default=t["patch"])
            ch = _get(vc, "num_channels", default=3)
            n = 16
            cands.append({name: torch.randn(b, n, ch * ps * ps, generator=g),
                          "pixel_attention_mask": torch.ones(b, n, dtype=torch.long),
                          "spatial_shapes": torch.tensor([[4, 4]] * b)})
        if _get(cfg, "num_frames") is not None or name == "pixel_values_videos":
            cands.append(pixels(name, video=True))
        cands.append(pixels(name))
        if "input_ids" in params:
            cands += [{**pixels(name), **text()}]
    elif name == "input_features":
        bins = _get(cfg, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16)
        src = _get(cfg, "max_source_positions", default=None)
        frames = 2 * src if isinstance(src, int) and src <= 64 else t["audio_frames"]
        x = torch.randn(b, bins, frames, generator=g)
        cands.append({name: x})
        cands.append({name: x.transpose(1, 2).contiguous()})
        for mk in ("attention_mask", "input_features_mask"):
            if mk in params:
                ones = torch.ones(b, frames, dtype=torch.long)
                cands += [{name: x.transpose(1, 2).contiguous(), mk: ones}, {name: x, mk: ones},
                          {name: x, mk: ones.bool()}]
    elif name == "input_values":
        if hasattr(cfg, "num_mel_bins") and hasattr(cfg, "max_length"):  # spectrogram transformers
            cands.append({name: torch.randn(b, cfg.max_length, cfg.num_mel_bins, generator=g)})
        x = torch.randn(b, t["audio_samples"], generator=g)
        cands += [{name: x}, {name: x[:, None]}]
    elif name == "inputs_embeds":
        hidden = _get(cfg, "hidden_size", "d_model", default=t["hidden"])
        cands.append({name: torch.randn(b, s, hidden, generator=g)})
    elif name == "past_values":
        cands += _time_series(cfg, params, b, g)
    else:
        raise _NoRecipe(f"no dummy-input recipe for main input {name!r}")
    if "noise" in params and name == "pixel_values":  # random patch masking (ViT-MAE): the same noise both sides
        vc = getattr(cfg, "vision_config", None) or cfg
        size = _get(vc, "image_size", default=t["image"])
        ps = _get(vc, "patch_size", default=t["patch"])
        h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        ps = ps[0] if isinstance(ps, (list, tuple)) else ps
        noise = torch.rand(b, (h // ps) * (w // ps), generator=g)
        cands = [dict(c, noise=noise) for c in cands] + cands
    if "qformer_input_ids" in params:  # InstructBLIP: the Q-Former's own text prompt
        q = ids(s)
        for c in cands:
            c.setdefault("qformer_input_ids", q)
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        dec = ids(t["decoder_seq"])
        for c in cands:
            c["decoder_input_ids"] = dec
    return cands


def _time_series(cfg, params, b: int, g) -> list[dict]:
    """Forecasting models: a context window of values (plus time features, observed mask and the
    future window for the encoder-decoder forecasters)."""
    ctx = getattr(cfg, "context_length", None) or 32
    pred = getattr(cfg, "prediction_length", None) or 4
    ch = getattr(cfg, "num_input_channels", None) or getattr(cfg, "input_size", None) or 1
    out = []
    if "past_time_features" in params:  # informer / autoformer / time-series-transformer
        n = ctx + max(getattr(cfg, "lags_sequence", None) or [0])
        nt = getattr(cfg, "num_time_features", 0) or 0
        shape = (b, n) if ch == 1 else (b, n, ch)
        d = {"past_values": torch.randn(*shape, generator=g),
             "past_time_features": torch.randn(b, n, nt, generator=g),
             "past_observed_mask": torch.ones(*shape)}
        fshape = (b, pred) if ch == 1 else (b, pred, ch)
        if "future_values" in params:
            d["future_values"] = torch.randn(*fshape, generator=g)
        if "future_time_features" in params:
            d["future_time_features"] = torch.randn(b, pred, nt, generator=g)
        for k, cnt in (("static_categorical_features", "num_static_categorical_features"),
                       ("static_real_features", "num_static_real_features")):
            c = getattr(cfg, cnt, 0) or 0
            if c and k in params:
                d[k] = torch.zeros(b, c, dtype=torch.long) if "categorical" in k else torch.randn(b, c, generator=g)
        out.append(d)
    out.append({"past_values": torch.randn(b, ctx, ch, generator=g)})  # patchtst / patchtsmixer
    out.append({"past_values": torch.randn(b, ctx, generator=g)})      # timesfm
    if "past_values_padding" in params:
        out.append({"past_values": torch.randn(b, ctx, generator=g), "past_values_padding": torch.zeros(b, ctx),
                    "freq": torch.zeros(b, 1, dtype=torch.long)})
    return out


class _NoRecipe(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Comparison


def leaves(x, prefix="out"):
    """(name, tensor) for every tensor in a model output (ModelOutput, tuples, dicts)."""
    if isinstance(x, torch.Tensor):
        yield prefix, x
    elif isinstance(x, dict):  # ModelOutput is an OrderedDict
        for k, v in x.items():
            yield from leaves(v, f"{prefix}.{k}")
    elif isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            yield from leaves(v, f"{prefix}[{i}]")
    # Cache objects and other values are not compared (use_cache=False in tiny configs).


def compare(actual, expected, grads: bool = False) -> tuple[str, str, float, float]:
    """(state, detail, max_abs, max_rel) over every tensor in the outputs (grads: gradients,
    whose atol scales with their magnitude, see GRAD_ATOL_SCALED)."""
    a = dict(leaves(actual))
    e = dict(leaves(expected))
    if set(a) != set(e):
        return "mismatch", f"output structure differs: {sorted(set(a) ^ set(e))[:4]}", 0.0, 0.0
    max_abs = max_rel = 0.0
    bad = []
    for k, ev in e.items():
        av = a[k]
        if av.device.type != "tpu":
            bad.append(f"{k}: on {av.device}, expected tpu")
            continue
        if av.shape != ev.shape or av.dtype != ev.dtype:
            bad.append(f"{k}: {tuple(av.shape)} {av.dtype} vs {tuple(ev.shape)} {ev.dtype}")
            continue
        ac = av.detach().cpu()
        ec = ev.detach()
        if ec.is_floating_point() or ec.is_complex():
            fin = torch.isfinite(ec) & torch.isfinite(ac)
            if fin.any():
                diff = (ac[fin].double() - ec[fin].double()).abs()
                max_abs = max(max_abs, diff.max().item())
                max_rel = max(max_rel, (diff / ec[fin].double().abs().clamp_min(1e-12)).max().item())
            atol = ATOL
            if grads and GRAD_ATOL_SCALED and ec.numel() and fin.any():
                atol = ATOL * max(1.0, ec[fin].abs().max().item())
            try:
                torch.testing.assert_close(ac, ec, atol=atol, rtol=RTOL, equal_nan=True)
            except AssertionError as err:
                bad.append(f"{k}: {_short(err, 4)}")
        elif not torch.equal(ac, ec):
            bad.append(f"{k}: {int((ac != ec).sum())} of {ec.numel()} values differ")
    if bad:
        return "mismatch", "; ".join(bad)[:600], max_abs, max_rel
    return "match", "", max_abs, max_rel


def _short(e: BaseException, n: int = 3) -> str:
    s = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    if len(s) > n and any("Traceback (most recent" in x for x in s):  # an embedded traceback: its end
        return (s[0][:100] + " | ... | " + " | ".join(s[-2:]))[:400]
    return " | ".join(s[:n])[:400]


def _failing_op(e: BaseException) -> str:
    """The ATen overload / lowering named by a tpu-side exception, as well as we can tell."""
    import re

    msg = str(e)
    m = re.search(r"aten[.:]+([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)", msg)
    if m:
        return "aten." + m.group(1)
    tb = traceback.extract_tb(e.__traceback__)
    for fr in reversed(tb):
        if "/torchtpu/" in fr.filename:
            return f"{os.path.basename(fr.filename)}:{fr.name}"
    return ""


# ---------------------------------------------------------------------------------------------
# Running one model


def compile_available() -> bool:
    try:
        import torch._dynamo

        return "tpu" in torch._dynamo.list_backends(exclude_tags=())
    except Exception:
        return False


@contextlib.contextmanager
def _mode(mode: str | None):
    if mode is None:  # the current eager mode
        yield
    elif mode == "compile":
        with torchtpu.eager_mode("strict"):
            yield
    else:
        with torchtpu.eager_mode(mode):
            yield


def _metrics():
    m = torchtpu.metrics()
    return m.get("cpu_fallbacks", 0), dict(m.get("fallback_ops", {}))


def _compiles() -> int:
    return int(torchtpu.metrics().get("compiles", 0))


def _merge(into: dict, fb: dict, prefix=""):
    for k, v in fb.items():
        into[prefix + k] = into.get(prefix + k, 0) + v


def build(model_type: str, cls_name: str, attn: str | None = None):
    import transformers

    cfg = tiny_config(model_type)
    cls = getattr(transformers, cls_name)
    want = getattr(cls, "config_class", None)
    if isinstance(want, type) and not isinstance(cfg, want):
        # a head registered for a composite config that takes its text sub-config (qwen3_5 causal-LM)
        sub = getattr(cfg, "text_config", None)
        if isinstance(sub, want):
            cfg = sub
    torch.manual_seed(0)
    kw = {"attn_implementation": attn} if attn else {}
    model = cls._from_config(cfg, dtype=torch.float32, **kw)
    return model.eval()


def reference(model_type: str, variant: str, cls_name: str, attn: str | None = None,
              pristine: list | None = None):
    """(model, inputs, outputs) on CPU: the tiny model and the first dummy inputs it accepts.
    `pristine` gets a copy of the model taken before any forward: modules that cache tensors in
    plain attributes on their first call (mimi's codebook `_embed`) would otherwise carry a CPU
    tensor that Module.to() does not move."""
    model = build(model_type, cls_name, attn)
    if pristine is not None:
        pristine.append(copy.deepcopy(model))
    first = None
    for inputs in make_inputs(model, variant):
        try:
            with torch.no_grad():
                torch.manual_seed(SEED)
                return model, inputs, model(**inputs)
        except _Timeout:
            raise
        except Exception as e:
            first = first or e
    raise first


def run_model(model_type: str, variant: str, cls_name: str, mode: str | None = "defer_and_fuse",
              attn: str | None = None, backward: bool = True, generate: bool = False,
              timeout: int = 240) -> Result:
    res = Result(model_type, variant, cls_name)
    t0 = time.perf_counter()
    try:
        with _time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run(res, mode, attn, backward, generate)
    except _Timeout as e:
        if res.state in ("skipped", "match") and not res.detail:
            res.state, res.detail = ("tpu-error", f"{e} (phase: {res.failing_op or 'tpu'})")
    res.seconds = time.perf_counter() - t0
    return res


def _run(res: Result, mode: str, attn, backward: bool, generate: bool) -> None:
    if res.model_type in C.SKIP:
        res.detail = C.SKIP[res.model_type]
        return
    if mode == "compile" and not compile_available():
        res.detail = "compile mode not available: no torch.compile backend 'tpu' registered"
        return
    # CPU reference: config, model, inputs, forward.
    res.failing_op = "cpu"
    res.modality = _class_modality(res.cls)
    try:
        fresh: list = []
        model, inputs, expected = reference(res.model_type, res.variant, res.cls, attn, pristine=fresh)
        res.modality = modality(model)
        res.attn = str(getattr(model.config, "_attn_implementation", "") or "")
    except _NoRecipe as e:
        res.state, res.detail, res.failing_op = "skipped", str(e), ""
        return
    except _Timeout:
        raise
    except Exception as e:
        res.state, res.detail, res.failing_op = "cpu-error", f"{type(e).__name__}: {_short(e)}", ""
        return
    # The same weights and inputs on tpu.
    res.failing_op = "tpu"
    tinputs = {k: v.to("tpu") for k, v in inputs.items()}
    torchtpu.reset_metrics()
    try:
        with _mode(mode):
            tmodel = fresh.pop().to("tpu")
            fwd = torch.compile(tmodel, backend="tpu") if mode == "compile" else tmodel
            with torch.no_grad():
                torch.manual_seed(SEED)
                actual = fwd(**tinputs)
            state, detail, res.max_abs, res.max_rel = compare(actual, expected)
    except _Timeout:
        raise
    except Exception as e:
        res.state = "tpu-error"
        res.failing_op = _failing_op(e)
        res.detail = f"{type(e).__name__}: {_short(e)}"
        res.cpu_fallbacks, res.fallback_ops = _metrics()
        return
    res.cpu_fallbacks, res.fallback_ops = _metrics()
    res.compiles = _compiles()
    res.state, res.detail, res.failing_op = state, detail, ""
    if res.variant == "causal-lm" and backward:
        res.backward, res.backward_detail = _backward(model, tmodel, inputs, tinputs, mode, res, fwd)
    if res.variant == "causal-lm" and generate:
        res.generate, res.generate_detail = _generate(model, tmodel, inputs, tinputs, mode, res)


def _backward(model, tmodel, inputs, tinputs, mode, res, call=None) -> tuple[str, str]:
    try:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(SEED)
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
    except Exception as e:
        return "cpu-error", f"{type(e).__name__}: {_short(e)}"
    torchtpu.reset_metrics()
    try:
        with _mode(mode):
            tmodel.zero_grad(set_to_none=True)
            torch.manual_seed(SEED)
            tloss = (tmodel if call is None else call)(**tinputs, labels=tinputs["input_ids"]).loss
            tloss.backward()
            grads_t = {n: p.grad for n, p in tmodel.named_parameters() if p.grad is not None}
            grads_c = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            both = sorted(set(grads_t) & set(grads_c))
            state, detail, _, _ = compare({"loss": tloss, **{n: grads_t[n] for n in both}},
                                          {"loss": loss, **{n: grads_c[n] for n in both}}, grads=True)
            missing = sorted(set(grads_t) ^ set(grads_c))
            if missing and state == "match":
                state, detail = "mismatch", f"gradient presence differs: {missing[:3]}"
    except _Timeout:
        raise
    except Exception as e:
        return "tpu-error", f"{_failing_op(e)} {type(e).__name__}: {_short(e)}".strip()
    _, fb = _metrics()
    _merge(res.fallback_ops, fb, "backward:")
    return state, detail


def _generate(model, tmodel, inputs, tinputs, mode, res) -> tuple[str, str]:
    ids = inputs["input_ids"]
    kw = dict(max_new_tokens=8, do_sample=False, num_beams=1, min_new_tokens=8)
    pad = model.generation_config.pad_token_id
    if pad is None:
        eos = model.generation_config.eos_token_id
        kw["pad_token_id"] = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    mask = torch.ones_like(ids)  # every row full: greedy decoding without padding ambiguity
    try:
        with torch.no_grad():
            expected = model.generate(input_ids=ids, attention_mask=mask, **kw)
    except Exception as e:
        return "cpu-error", f"{type(e).__name__}: {_short(e)}"
    torchtpu.reset_metrics()
    try:
        with _mode(mode), torch.no_grad():
            actual = tmodel.generate(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
        actual = actual.cpu()
    except _Timeout:
        raise
    except Exception as e:
        return "tpu-error", f"{_failing_op(e)} {type(e).__name__}: {_short(e)}".strip()
    _, fb = _metrics()
    _merge(res.fallback_ops, fb, "generate:")
    if actual.shape == expected.shape and torch.equal(actual, expected):
        return "match", ""
    return "mismatch", f"tokens differ: tpu {actual[:, ids.shape[1]:].tolist()} cpu {expected[:, ids.shape[1]:].tolist()}"


# ---------------------------------------------------------------------------------------------
# Worker processes: one model at a time, killed and replaced on a hard timeout or a crash.


def _clear_caches() -> None:
    import jax

    from torchtpu.eager import deferred, executor

    executor.clear_cache()
    deferred._fused_cache.clear()
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


def _result_from(d: dict) -> Result:
    return Result(**{k: v for k, v in d.items() if k in Result.__dataclass_fields__})


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


# ---------------------------------------------------------------------------------------------
# Summary and reports


def summarize(results: list[Result], mode: str) -> dict:
    counts = {s: 0 for s in STATES}
    by_modality: dict[str, dict] = {}
    for r in results:
        if r.modality in ("", "unknown") and r.cls:
            r.modality = _class_modality(r.cls)
        counts[r.state] += 1
        by_modality.setdefault(r.modality or "unknown", {s: 0 for s in STATES})[r.state] += 1
    ran_cpu = counts["match"] + counts["mismatch"] + counts["tpu-error"]
    ran_tpu = counts["match"] + counts["mismatch"]
    ok = [r for r in results if r.state in ("match", "mismatch")]
    no_fb = sum(1 for r in ok if r.cpu_fallbacks == 0)
    bwd = {s: 0 for s in STATES}
    gen = {s: 0 for s in STATES}
    for r in results:
        if r.backward:
            bwd[r.backward] += 1
        if r.generate:
            gen[r.generate] += 1
    bwd_den = bwd["match"] + bwd["mismatch"] + bwd["tpu-error"]
    gen_den = gen["match"] + gen["mismatch"] + gen["tpu-error"]
    fb_ops: dict[str, int] = {}
    for r in results:
        for k in r.fallback_ops:
            fb_ops[k] = fb_ops.get(k, 0) + 1

    def pct(a, b):
        return round(100 * a / b, 2) if b else None

    return {
        "mode": mode,
        "models": len(results),
        "model_types": len({r.model_type for r in results}),
        "states": counts,
        "by_modality": by_modality,
        "ran_on_cpu": ran_cpu,
        "tpu_no_error_pct": pct(ran_tpu, ran_cpu),
        "match_pct": pct(counts["match"], ran_cpu),
        "zero_fallback_pct": pct(no_fb, ran_tpu),
        "backward": bwd,
        "backward_match_pct": pct(bwd["match"], bwd_den),
        "generate": gen,
        "generate_match_pct": pct(gen["match"], gen_den),
        "fallback_ops_models": dict(sorted(fb_ops.items(), key=lambda kv: -kv[1])),
        "atol": ATOL, "rtol": RTOL,
        "transformers": _tf_version(),
        "torch": torch.__version__,
    }


def _tf_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except Exception:
        return "?"


def print_summary(s: dict, out=sys.stdout) -> None:
    print(file=out)
    print(f"{'state':<12}{'forward':>9}{'backward':>10}{'generate':>10}", file=out)
    print("-" * 41, file=out)
    for st in STATES:
        print(f"{st:<12}{s['states'][st]:>9}{s['backward'][st]:>10}{s['generate'][st]:>10}", file=out)
    print("-" * 41, file=out)
    print(f"mode {s['mode']}: {s['models']} models ({s['model_types']} types); ran on CPU: "
          f"{s['ran_on_cpu']}; tpu without error: {s['tpu_no_error_pct']}%; match: {s['match_pct']}%; "
          f"zero CPU fallbacks: {s['zero_fallback_pct']}%; backward match: {s['backward_match_pct']}%; "
          f"generate match: {s['generate_match_pct']}%", file=out)
    if s["fallback_ops_models"]:
        top = ", ".join(f"{k} ({v})" for k, v in list(s["fallback_ops_models"].items())[:10])
        print(f"fallback ops (models): {top}", file=out)


def write_chart(path: str, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mods = sorted(summary["by_modality"], key=lambda m: -sum(summary["by_modality"][m].values()))
    colors = {"match": "#2e7d32", "mismatch": "#f9a825", "tpu-error": "#c62828",
              "cpu-error": "#9e9e9e", "skipped": "#cfd8dc"}
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(mods) + 1.5))
    left = [0] * len(mods)
    for st in STATES:
        vals = [summary["by_modality"][m][st] for m in mods]
        ax.barh(mods, vals, left=left, color=colors[st], label=st)
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("models")
    ax.set_title(f"Transformers {summary['transformers']} on tpu vs CPU ({summary['mode']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_markdown(path: str, summaries: dict, results_by_mode: dict, argv_by_mode: dict,
                   chart: str | None) -> None:
    lines = ["# Hugging Face Transformers on tpu", ""]
    for mode, s in summaries.items():
        lines += [f"## Mode `{mode}`", "",
                  f"Generated by `python -m torchtpu.validate hf {' '.join(argv_by_mode[mode])}` "
                  f"(transformers {s['transformers']}, torch {s['torch']}, XLA:{torchtpu.platform()}; "
                  f"float32, atol={s['atol']}, rtol={s['rtol']}).", "",
                  "| state | forward | backward (causal-LM) | generate |", "|---|---:|---:|---:|"]
        for st in STATES:
            lines.append(f"| {st} | {s['states'][st]} | {s['backward'][st]} | {s['generate'][st]} |")
        if s.get("planned", s["models"]) > s["models"]:
            lines += ["", f"**Partial sweep**: {s['models']} of {s['planned']} models ran before the "
                      "run was stopped (models run in a seeded random order, so this is a uniform "
                      "sample; `--resume` continues it from the JSON checkpoint)."]
        lines += ["", f"- models: {s['models']} ({s['model_types']} model types)",
                  f"- ran on CPU (the denominator): {s['ran_on_cpu']}",
                  f"- ran on tpu without error: {s['tpu_no_error_pct']} %",
                  f"- match CPU numerics: {s['match_pct']} %",
                  f"- zero CPU fallbacks (of those that ran): {s['zero_fallback_pct']} %",
                  f"- backward match (causal-LM heads): {s['backward_match_pct']} %",
                  f"- greedy generate match: {s['generate_match_pct']} %", ""]
        if chart and mode == next(iter(summaries)):
            lines += [f"![states by modality]({os.path.basename(chart)})", ""]
        lines += ["| modality | " + " | ".join(STATES) + " |", "|---" * (len(STATES) + 1) + "|"]
        for m, c in sorted(s["by_modality"].items()):
            lines.append(f"| {m} | " + " | ".join(str(c[st]) for st in STATES) + " |")
        if s["fallback_ops_models"]:
            lines += ["", "Ops that fell back to CPU (number of models):", ""]
            lines += [f"- `{k}`: {v}" for k, v in s["fallback_ops_models"].items()]
        bad = [r for r in results_by_mode[mode] if r.state in ("mismatch", "tpu-error")
               or r.backward in ("mismatch", "tpu-error") or r.generate in ("mismatch", "tpu-error")]
        if bad:
            lines += ["", "### Backend failures", "", "| model | state | bwd | gen | op | detail |",
                      "|---|---|---|---|---|---|"]
            for r in sorted(bad, key=lambda r: r.key):
                d = (r.detail or r.backward_detail or r.generate_detail).replace("|", "/")[:200]
                lines.append(f"| {r.key} | {r.state} | {r.backward} | {r.generate} | {r.failing_op} | {d} |")
        other = [r for r in results_by_mode[mode] if r.state in ("cpu-error", "skipped")]
        if other:
            lines += ["", "### Not run (cpu-error: the tiny config or dummy inputs do not work on CPU "
                      "either; excluded from the denominator)", "", "| model | state | detail |", "|---|---|---|"]
            for r in sorted(other, key=lambda r: r.key):
                lines.append(f"| {r.key} | {r.state} | {r.detail.replace('|', '/')[:160]} |")
        lines.append("")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m torchtpu.validate hf")
    p.add_argument("--json", help="write per-model states here (e.g. docs/hf.json)")
    p.add_argument("--markdown", help="write a markdown report here (e.g. docs/hf.md), with a PNG chart")
    p.add_argument("--models", nargs="*", help="model types (default: every type in the auto mappings)")
    p.add_argument("--subset", action="store_true", help="the representative subset make test runs")
    p.add_argument("--mode", default="defer_and_fuse", choices=MODES)
    p.add_argument("--variants", nargs="*", default=["base", "head"], choices=["base", "head"])
    p.add_argument("--attn", choices=["eager", "sdpa"], help="force attn_implementation (default: config's)")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--generate", action="store_true", help="greedy generate(max_new_tokens=8) on causal LMs")
    p.add_argument("--timeout", type=int, default=180, help="seconds per model (soft, in the worker)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (0: in this process)")
    p.add_argument("--limit", type=int, help="first N model types only (with --shuffle: N at random)")
    p.add_argument("--shuffle", type=int, metavar="SEED",
                   help="run the models in a seeded random order (an interrupted sweep is a sample)")
    p.add_argument("--resume", action="store_true",
                   help="keep the results checkpointed in JSON.partial by an interrupted run, run the rest")
    p.add_argument("--report-only", action="store_true",
                   help="with --resume: write JSON/markdown from the checkpoint, run nothing")
    p.add_argument("--merge", action="store_true",
                   help="keep other modes' (and other models') results already in --json")
    args = p.parse_args(argv)
    if args.mode == "compile" and not compile_available():
        print("mode compile: not available (no torch.compile backend 'tpu' registered yet)", file=sys.stderr)
    types = args.models or (list(C.SUBSET) if args.subset else model_types())
    if args.limit:  # with --shuffle: a seeded random sample of the types, else the first N
        if args.shuffle is not None:
            import random

            types = sorted(random.Random(args.shuffle).sample(types, min(args.limit, len(types))))
        else:
            types = types[: args.limit]
    jobs = [(t, v, c) for t in types for v, c in variants(t, args.variants)]
    if args.shuffle is not None:
        import random

        random.Random(args.shuffle).shuffle(jobs)
    done: list[Result] = []
    if args.resume and args.json:
        # finished models: this mode's results in the JSON, then the checkpoint of a stopped run
        found: dict = {}
        if os.path.exists(args.json):
            with open(args.json) as f:
                found.update(json.load(f).get("modes", {}).get(args.mode, {}).get("models", {}))
        if os.path.exists(_partial(args)):
            with open(_partial(args)) as f:
                for line in f:
                    if line.strip():
                        d = json.loads(line)
                        found[f"{d['model_type']}:{d['variant']}"] = d
        wanted = {j[:2] for j in jobs}
        done = [r for r in map(_result_from, found.values()) if (r.model_type, r.variant) in wanted]
        keys = {(r.model_type, r.variant) for r in done}
        all_jobs = jobs
        jobs = [j for j in jobs if j[:2] not in keys]
    planned = len(jobs) + len(done)
    if args.report_only:
        jobs = []
    opts = dict(mode=args.mode, attn=args.attn, backward=not args.no_backward, generate=args.generate,
                timeout=args.timeout)
    prog = Progress(len(jobs), f"hf {args.mode} ")

    partial = open(_partial(args), "a" if done else "w") if args.json else None

    def step(r: Result):
        if partial:  # a checkpoint, so an interrupted sweep still leaves its results
            partial.write(json.dumps(r.to_json()) + "\n")
            partial.flush()
        extra = "".join(f", {n} {v}" for n, v in (("bwd", r.backward), ("gen", r.generate)) if v)
        prog.step(r.key, f"{r.state}{extra}" + (f" ({r.cpu_fallbacks} fallbacks)" if r.cpu_fallbacks else ""))

    if not jobs:
        results = []
    elif args.jobs <= 0:
        results = []
        for job in jobs:
            r = run_model(*job, **opts)
            results.append(r)
            step(r)
    else:
        results = run_all(jobs, opts, args.jobs, args.timeout + 120, step)
    if partial:
        partial.close()
        if len(done) + len(results) >= planned:
            os.unlink(partial.name)
    if done:
        results = done + results
        jobs = all_jobs
    order = {j[:2]: i for i, j in enumerate(jobs)}
    results.sort(key=lambda r: order.get((r.model_type, r.variant), 0))
    summary = summarize(results, args.mode)
    print_summary(summary)
    if args.json:
        data = {"modes": {}}
        if args.merge and os.path.exists(args.json):
            with open(args.json) as f:
                data = json.load(f)
        prev = data["modes"].get(args.mode, {}).get("models", {}) if args.merge else {}
        prev.update({r.key: r.to_json() for r in results})
        all_results = [_result_from(d) for d in prev.values()]
        summ = summarize(all_results, args.mode)
        summ["planned"] = max(planned, len(all_results))
        data["modes"][args.mode] = {"summary": summ, "argv": argv, "models": dict(sorted(prev.items()))}
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    if args.markdown:
        report_from_json(args.json, args.markdown) if args.json else _md_direct(args, summary, results, argv)
    return 0


def _partial(args) -> str:
    """The per-mode checkpoint: one JSON line per finished model."""
    return f"{args.json}.{args.mode}.partial"


def _md_direct(args, summary, results, argv):
    chart = os.path.splitext(args.markdown)[0] + "_states.png"
    write_chart(chart, summary)
    write_markdown(args.markdown, {args.mode: summary}, {args.mode: results}, {args.mode: argv}, chart)


def report_from_json(json_path: str, md_path: str) -> None:
    with open(json_path) as f:
        data = json.load(f)
    modes = [m for m in MODES if m in data["modes"]]
    summaries = {m: data["modes"][m]["summary"] for m in modes}
    results = {m: [_result_from(d) for d in data["modes"][m]["models"].values()] for m in modes}
    argvs = {m: data["modes"][m]["argv"] for m in modes}
    chart = os.path.splitext(md_path)[0] + "_states.png"
    first = "defer_and_fuse" if "defer_and_fuse" in summaries else modes[0]
    summaries = {first: summaries[first], **{m: s for m, s in summaries.items() if m != first}}
    write_chart(chart, summaries[first])
    write_markdown(md_path, summaries, results, argvs, chart)
