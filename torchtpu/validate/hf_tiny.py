"""Which Hugging Face model classes the sweep runs, and the tiny config each is built from
(generic shrinking rules over the config class's defaults, then hf_configs.OVERRIDES)."""
from __future__ import annotations

import os

# Before transformers is imported anywhere in the sweep: never download, keep logs quiet.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from . import hf_configs as C  # noqa: E402


def _auto():
    from transformers.models.auto import configuration_auto, modeling_auto

    return modeling_auto, configuration_auto


def model_types() -> list[str]:
    """Every model type an auto mapping of modeling_auto names (base model or any head)."""
    ma, ca = _auto()
    types = set(ma.MODEL_MAPPING_NAMES)
    for _, mapping in C.HEADS:
        types |= set(getattr(ma, mapping, {}))
    return sorted(t for t in types if t in ca.CONFIG_MAPPING_NAMES)


def _class(mapping: dict, model_type: str) -> str | None:
    name = mapping.get(model_type)
    if isinstance(name, (tuple, list)):
        name = name[0] if name else None
    return name or None


def model_class(model_type: str, cls_name: str):
    """The class an auto mapping names. A few that a modeling module defines but leaves out of its
    __all__ (upstream: AutoModel cannot find them either) are taken from that module itself."""
    import importlib

    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    cls = getattr(transformers, cls_name, None)
    if cls is None:
        mod = model_type_to_module_name(model_type)
        cls = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), cls_name)
    return cls


def variants(model_type: str, which=("base", "head")) -> list[tuple[str, str]]:
    """[(variant, class name)]: "base" the base model, "head" the first head of HEAD_PRIORITY that
    exists, "heads" every distinct head class of the type (C.HEADS order)."""
    ma, _ = _auto()
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(variant, name):
        if name and name not in seen:
            seen.add(name)
            out.append((variant, name))

    if "base" in which:
        add("base", _class(ma.MODEL_MAPPING_NAMES, model_type))
    if "head" in which or "heads" in which:
        for variant, mapping in C.HEAD_PRIORITY:
            name = _class(getattr(ma, mapping, {}), model_type)
            if name:
                add(variant, name)
                break
    if "heads" in which:
        for variant, mapping in C.HEADS:
            add(variant, _class(getattr(ma, mapping, {}), model_type))
    if not out and "base" not in which:  # no head: the base model stands for the type
        out = variants(model_type, ("base",))
    if not out and "heads" not in which:  # neither: its first class of any mapping (a backbone, ...)
        out = variants(model_type, ("heads",))[:1]
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
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v) \
                and d.get("model_type") not in C.KEEP_LISTS:
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
    # Left None by the default config and filled by a checkpoint (a MoE router's k): the tiny value.
    if any(isinstance(d.get(k), int) for k in C.EXPERT_KEYS):
        for k in C.EXPERTS_PER_TOK_KEYS:
            if k in d and d[k] is None:
                d[k] = t["experts_per_tok"]
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


def tiny_config(model_type: str, variant: str | None = None):
    """A small config of `model_type`: generic rules, then hf_configs.OVERRIDES, then the head's
    hf_configs.HEAD_OVERRIDES (`variant`: the head kind, "seq-cls", "depth", ...)."""
    from transformers import AutoConfig

    # a config class whose own defaults fail its validator takes these at construction
    default = AutoConfig.for_model(model_type, **C.INIT_KWARGS.get(model_type, {}))
    d = default.to_dict()
    ov = {**C.OVERRIDES.get(model_type, {}), **C.HEAD_OVERRIDES.get(f"{model_type}:{variant}", {})}
    shrunk = dict(d) if model_type in C.KEEP_DEFAULT else _shrink_dict(d)
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
    for k in C.DROP_KEYS:  # dropped for __init__ to derive, but this class does not: the default, trimmed
        if getattr(cfg, k, 0) is None and isinstance(d.get(k), list):
            n = getattr(cfg, "num_hidden_layers", None)
            setattr(cfg, k, d[k][:n] if isinstance(n, int) and len(d[k]) > n else d[k])
    if getattr(cfg, "is_encoder_decoder", False) and getattr(cfg, "decoder_start_token_id", None) is None:
        # T5-style configs leave it to the checkpoint; their ModelTesters start the decoder at pad (0)
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
    return cfg
