"""One model check: the CPU reference (tiny config, random weights, dummy inputs), the same model
on tpu in one mode, forward compared, then backward and greedy generate where the head has them."""
from __future__ import annotations

import contextlib
import copy
import inspect
import time
import warnings

import torch

import torchtpu

from . import hf_configs as C
from .hf_compare import SEED, Result, _failing_op, _short, compare, rounding
from .hf_inputs import _class_modality, _NoRecipe, labels_for, make_inputs, modality
from .hf_tiny import model_class, tiny_config
from .timeout import Timeout as _Timeout, time_limit as _time_limit


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


def build(model_type: str, cls_name: str, attn: str | None = None, variant: str = "base"):
    cfg = tiny_config(model_type, variant)
    if variant == "seq-cls":  # the head pools at the last non-pad token: it needs a pad id for batch > 1
        for c in (cfg, getattr(cfg, "text_config", None)):
            if c is not None and getattr(c, "pad_token_id", 0) is None:
                c.pad_token_id = 0  # dummy ids start at 3 (hf_inputs.make_inputs): never a pad
    cls = model_class(model_type, cls_name)
    want = getattr(cls, "config_class", None)
    if isinstance(want, type) and not isinstance(cfg, want):
        # a head registered for a composite config that takes its text sub-config (qwen3_5 causal-LM)
        # (qwen3_5 causal-LM; musicgen's takes its decoder config)
        sub = next((getattr(cfg, k) for k in ("text_config", "decoder", "encoder", *C.SUBCONFIG_KEYS)
                    if isinstance(getattr(cfg, k, None), want)), None)
        if sub is not None:
            cfg = sub
        else:
            cfg = _wrap(want, cfg)
    torch.manual_seed(0)
    kw = {"attn_implementation": attn} if attn else {}
    model = cls._from_config(cfg, dtype=torch.float32, **kw)
    return model.eval()


def _wrap(want: type, cfg):
    """`cfg` as the sub-config of a head config class that wraps a model of any type (a decision
    head's JevConfig: its text_config is the config of the model it reads, an AutoConfig sub-config,
    as DecisionMixin.checkpoint_config builds it from a checkpoint's own config.json). The head's own
    fields that the wrapped model's text config also has (its hidden_size) take that model's values.
    Any other pair of classes (a composite config with several sub-configs): `cfg` unchanged."""
    import dataclasses

    from transformers import AutoConfig

    subs = getattr(want, "sub_configs", None) or {}
    # one sub-config, of any type: composite configs (text + vision towers) never qualify
    if len(subs) != 1 or next(iter(subs.values())) is not AutoConfig or not dataclasses.is_dataclass(want):
        return cfg
    key = next(iter(subs))
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    own = {f.name for f in dataclasses.fields(want)} - {f.name for f in dataclasses.fields(want.__mro__[1])} \
        if dataclasses.is_dataclass(want.__mro__[1]) else set()
    shared = {k: getattr(text, k) for k in own if k != key and getattr(text, k, None) is not None}
    return want(**{key: cfg}, **shared)


def reference(model_type: str, variant: str, cls_name: str, attn: str | None = None,
              pristine: list | None = None):
    """(model, inputs, outputs) on CPU: the tiny model and the first dummy inputs it accepts.
    `pristine` gets a copy of the model taken before any forward: modules that cache tensors in
    plain attributes on their first call (mimi's codebook `_embed`) would otherwise carry a CPU
    tensor that Module.to() does not move."""
    model = build(model_type, cls_name, attn, variant)
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
    skip = C.SKIP.get(res.key, C.SKIP.get(res.model_type))  # one head, or the whole type
    if skip:
        res.detail = skip
        return
    if mode == "compile" and not compile_available():
        res.detail = "compile mode not available: no torch.compile backend 'tpu' registered"
        return
    # CPU reference: config, model, inputs, forward.
    res.failing_op = "cpu"
    res.modality = _class_modality(res.cls, res.model_type)
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
    labels = labels_for(model, res.variant, inputs, expected) if backward else None
    gen = generate and res.variant in C.GENERATE_VARIANTS
    if gen and "shared_kv_states" in inspect.signature(model.forward).parameters:
        # a speculative drafter proposes tokens inside its target's assisted generation only
        res.generate, res.generate_detail, gen = "skipped", _DRAFTER_GENERATE, False
    if gen and res.model_type in C.NO_GENERATE:
        res.generate, res.generate_detail, gen = "skipped", C.NO_GENERATE[res.model_type], False
    if mode == CPU_ONLY:  # coverage pass: what the CPU reference runs, nothing on tpu
        res.state, res.failing_op = "cpu-ok", ""
        if labels is not None:
            res.backward, res.backward_detail = _cpu_state(lambda: _cpu_loss(model, inputs, labels))
        if gen:
            res.generate, res.generate_detail = _cpu_state(lambda: model.generate(**_gen_inputs(model, inputs)))
        return
    # The same weights and inputs on tpu.
    res.failing_op = "tpu"
    # nested inputs too (a drafter's shared_kv_states: {layer type: (keys, values)})
    tinputs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda v: v.to("tpu"), inputs)
    torchtpu.reset_metrics()
    try:
        with _mode(mode):
            tmodel = fresh.pop().to("tpu")
            fwd = torch.compile(tmodel, backend="tpu") if mode == "compile" else tmodel
            with torch.no_grad():
                torch.manual_seed(SEED)
                actual = fwd(**tinputs)
            state, detail, res.max_abs, res.max_rel = compare(actual, expected)
            if state == "mismatch":
                res.float64["forward"] = _float64(res, lambda m: rounding(actual, expected, _forward(m, inputs)))
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
    if labels is not None:
        res.backward, res.backward_detail = _backward(model, tmodel, inputs, tinputs, labels, mode, res, fwd)
    if gen:
        res.generate, res.generate_detail = _generate(model, tmodel, inputs, mode, res)


CPU_ONLY = "cpu"  # the --mode of the coverage pass
_DRAFTER_GENERATE = ("upstream: a drafter generates only inside its target model's assisted generation (alone, "
                     "generate() raises ValueError: `get_seq_length` can only be called on Attention layers)")


def _cpu_state(fn) -> tuple[str, str]:
    try:
        fn()
        return "cpu-ok", ""
    except _Timeout:
        raise
    except Exception as e:
        return "cpu-error", f"{type(e).__name__}: {_short(e)}"


@contextlib.contextmanager
def _loss_mode(model):
    """Train mode while the loss and its backward run, for the types whose loss refuses eval mode
    (C.TRAIN_FOR_LOSS: their tiny configs turn dropout off, so both sides still agree)."""
    if getattr(model.config, "model_type", "") not in C.TRAIN_FOR_LOSS:
        yield
        return
    model.train()
    try:
        yield
    finally:
        model.eval()


def _cpu_loss(model, inputs, labels):
    """The CPU loss of `model` on `inputs` + `labels`, backward run (gradients in .grad)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    with _loss_mode(model):  # Reformer's reversible backward asserts train mode too
        loss = model(**inputs, **labels).loss
        if loss is None:
            raise ValueError("the head returned no loss for labels " + ", ".join(labels))
        loss.backward()
    return loss


def _backward(model, tmodel, inputs, tinputs, labels, mode, res, call=None) -> tuple[str, str]:
    try:
        loss = _cpu_loss(model, inputs, labels)
    except _Timeout:
        raise
    except Exception as e:
        return "cpu-error", f"{type(e).__name__}: {_short(e)}"
    tlabels = {k: v.to("tpu") for k, v in labels.items()}
    torchtpu.reset_metrics()
    try:
        with _mode(mode):
            tmodel.zero_grad(set_to_none=True)
            torch.manual_seed(SEED)
            with _loss_mode(tmodel):
                tloss = (tmodel if call is None else call)(**tinputs, **tlabels).loss
                tloss.backward()
            grads_t = {n: p.grad for n, p in tmodel.named_parameters() if p.grad is not None}
            grads_c = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            both = sorted(set(grads_t) & set(grads_c))
            got = {"loss": tloss, **{n: grads_t[n] for n in both}}
            want = {"loss": loss, **{n: grads_c[n] for n in both}}
            state, detail, _, _ = compare(got, want, grads=True)
            if state == "mismatch":
                def exact(m):
                    loss64 = _cpu_loss(m, _double(inputs), _double(labels))
                    g64 = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
                    return rounding(got, want, {"loss": loss64, **{n: g64[n] for n in both if n in g64}}, grads=True)
                res.float64["backward"] = _float64(res, exact)
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


def _double(tree):
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda v: v.double() if v.is_floating_point() else v, tree)


def _forward(model, inputs):
    with torch.no_grad():
        torch.manual_seed(SEED)
        return model(**_double(inputs))


def _float64(res: Result, judge):
    """judge(model) on the same model built afresh (same seed, same weights) in float64 on CPU:
    the better answer a float32 mismatch is weighed against (hf_compare.rounding); a reason string
    when that run fails (models that cast to float32 inside, ops without float64)."""
    try:
        return judge(build(res.model_type, res.cls, res.attn or None, res.variant).double())
    except _Timeout:
        raise
    except Exception as e:
        return f"the float64 run failed: {type(e).__name__}: {_short(e)}"


def _gen_inputs(model, inputs) -> dict:
    """generate()'s arguments: the encoder / prompt inputs (no decoder ids: generate starts the
    decoder itself), every row unpadded so greedy decoding has no padding ambiguity, and 8 new
    tokens exactly."""
    kw = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    if "attention_mask" in kw:
        kw["attention_mask"] = torch.ones_like(kw["attention_mask"])
    # num_return_sequences stated: MusicGen's own generate expands by it, None unless set
    kw.update(max_new_tokens=8, do_sample=False, num_beams=1, min_new_tokens=8, num_return_sequences=1)
    gc = model.generation_config
    if model.config.is_encoder_decoder and gc.decoder_start_token_id is None and gc.bos_token_id is None:
        kw["decoder_start_token_id"] = gc.pad_token_id or 0  # T5-style: the decoder starts at pad
    if hasattr(model, "build_delay_pattern_mask") and gc.decoder_start_token_id is None:
        # MusicGen's decoder pads its codebooks' delay pattern with the decoder start token,
        # which its checkpoints' generation_config sets (to pad) and a tiny config lacks
        kw["decoder_start_token_id"] = gc.pad_token_id if gc.pad_token_id is not None else gc.bos_token_id or 0
    if model.generation_config.pad_token_id is None:
        eos = model.generation_config.eos_token_id
        kw["pad_token_id"] = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    per_tok = getattr(model.config, "audio_length_per_tok", None)
    feats = kw.get("input_features")
    if isinstance(per_tok, int) and isinstance(feats, torch.Tensor) and "input_ids" in kw:
        # Voxtral Realtime streams one token per audio token (per_tok feature frames) and stops at
        # the audio's end (its _prepare_generated_length caps max_length there): the forward's
        # audio covers the prompt only, so generate gets audio for the 8 new tokens too
        need = (kw["input_ids"].shape[1] + kw["max_new_tokens"]) * per_tok - feats.shape[-1]
        if need > 0:
            g = torch.Generator().manual_seed(SEED)
            kw["input_features"] = torch.cat([feats, torch.randn(*feats.shape[:-1], need, generator=g)], -1)
    model_type = getattr(model.config, "model_type", "")
    if model_type in C.GENERATE_CACHED:
        kw["use_cache"] = True
        kw.setdefault("attention_mask", torch.ones_like(kw["input_ids"]))
    frames = C.GENERATE_FROM_AUDIO.get(model_type)
    if frames:
        batch = kw.pop("input_ids").shape[0]
        kw.pop("attention_mask", None)
        g = torch.Generator().manual_seed(SEED)
        kw["input_values"] = torch.randn(batch, 1, model.config.codec_config.frame_size * frames, generator=g)
    if hasattr(model, "get_mel_conditioner_outputs"):
        # Pop2Piano generates from mel features (batch, frames, d_model), not token ids, and
        # reads its composer table from the checkpoint's generation_config (a tiny one has none)
        ids = kw.pop("input_ids")
        g = torch.Generator().manual_seed(SEED)
        kw["input_features"] = torch.randn(ids.shape[0], ids.shape[1], model.config.d_model, generator=g)
        gen_config = copy.deepcopy(model.generation_config)
        gen_config.composer_to_feature_token = {f"composer{i + 1}": i for i in range(model.config.composer_vocab_size)}
        kw["generation_config"] = gen_config
    return kw


def _generate(model, tmodel, inputs, mode, res) -> tuple[str, str]:
    kw = _gen_inputs(model, inputs)
    try:
        with torch.no_grad():
            torch.manual_seed(SEED)  # generate loops that draw (a speech model's diffusion noise): the same draws
            expected = model.generate(**kw)
    except _Timeout:
        raise
    except Exception as e:
        return "cpu-error", f"{type(e).__name__}: {_short(e)}"
    tkw = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    torchtpu.reset_metrics()
    try:
        with _mode(mode), torch.no_grad():
            torch.manual_seed(SEED)
            actual = tmodel.generate(**tkw)
    except _Timeout:
        raise
    except Exception as e:
        return "tpu-error", f"{_failing_op(e)} {type(e).__name__}: {_short(e)}".strip()
    _, fb = _metrics()
    _merge(res.fallback_ops, fb, "generate:")
    if not isinstance(expected, torch.Tensor):  # text-to-speech: waveforms, compared as outputs are
        state, detail, _, _ = compare(actual, expected)
        return state, detail
    actual = actual.cpu()
    if actual.shape == expected.shape and torch.equal(actual, expected):
        return "match", ""
    n = inputs["input_ids"].shape[1] if "input_ids" in inputs and not model.config.is_encoder_decoder else 0
    return "mismatch", f"tokens differ: tpu {actual[:, n:].tolist()} cpu {expected[:, n:].tolist()}"
