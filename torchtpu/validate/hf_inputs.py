"""Dummy inputs for a tiny Hugging Face model: candidate input dicts per modality (the first the
CPU reference accepts is used), and the modality a model is reported under."""
from __future__ import annotations

import inspect

import torch

from . import hf_configs as C
from .hf_tiny import model_class


def _get(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    for sub in ("text_config", "vision_config", "audio_config", "encoder", "encoder_config", "asr_config",
                "model_config"):
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
    if name in ("input_features", "input_values", "audio_values", "spectrogram", "audio_mel"):
        return "audio"
    if name in ("past_values",):
        return "time-series"
    return "other"


def _class_modality(cls_name: str, model_type: str | None = None) -> str:
    """The modality from the class alone (before the model is built; refined by modality())."""
    try:
        import transformers

        cls = model_class(model_type, cls_name) if model_type else getattr(transformers, cls_name)
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
            "audio_values": "audio", "audio_mel": "audio", "past_values": "time-series"}.get(name, "other")


def _text_config(cfg):
    """The config of the text the inputs' ids are drawn for. Text-to-audio models with a text
    encoder and a (codebook) decoder (MusicGen) name both, which get_text_config() refuses as
    ambiguous: input_ids feed the encoder end."""
    if not hasattr(cfg, "get_text_config"):
        return cfg
    try:
        return cfg.get_text_config()
    except ValueError:
        return cfg.get_text_config(encoder=True)


def _image(cfg):
    """(vision config, channels, height, width) of the images a model takes."""
    vc = getattr(cfg, "vision_config", None) or cfg
    if isinstance(vc, dict):
        vc = cfg
    ch = _get(vc, "num_channels", "in_channels", "in_chans", default=3)
    size = _get(vc, "image_size", "img_size", "input_size", default=C.TINY["image"])
    if isinstance(size, dict):
        size = size.get("height", C.TINY["image"])
    h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    return vc, ch, h, w


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
    arg, name = C.MAIN_INPUT_AS.get(getattr(cfg, "model_type", ""), (name, name))
    b, s = C.BATCH.get(getattr(cfg, "model_type", ""), t["batch"]), t["seq"]
    text_cfg = _text_config(cfg)
    vocab = getattr(text_cfg, "vocab_size", None) or _get(cfg, "vocab_size", default=t["vocab"])

    def ids(n):
        lo = 3 if vocab > 8 else 0
        return torch.randint(lo, max(vocab - 4, lo + 1), (b, n), generator=g)

    def text():
        d = {"input_ids": ids(s)}
        if "attention_mask" in params:
            mask = torch.ones(b, s, dtype=torch.long)
            if b > 1:
                mask[1, -2:] = 0  # right padding in the second row
            d["attention_mask"] = mask
        return d

    def pixels(key="pixel_values", video=False):
        vc, ch, h, w = _image(cfg)
        if "prompt_pixel_values" in params:  # SegGPT stacks prompt over input: each is half the height
            h //= 2
        if video:
            return {key: torch.randn(b, _get(vc, "num_frames", default=4), ch, h, w, generator=g)}
        return {key: torch.randn(b, ch, h, w, generator=g)}

    def patches(key, square=False):
        """Flattened patches + grid_thw (Qwen2-VL-style vision towers): 2 images of 4x4 patches;
        `square`: each patch as a (channels, ps, ps) image (towers that embed with a Conv2d)."""
        vc = getattr(cfg, "vision_config", None) or cfg
        ch = _get(vc, "in_channels", "in_chans", "num_channels", default=3)
        tps = _get(vc, "temporal_patch_size", "patch_temporal", default=1)
        ps = _get(vc, "patch_size", default=t["patch"])
        tps = tps[0] if isinstance(tps, (list, tuple)) else tps
        ps = ps[0] if isinstance(ps, (list, tuple)) else ps
        m = _get(vc, "spatial_merge_size", default=2)
        grid = torch.tensor([[1, 2 * m, 2 * m]] * b)
        n = int(grid.prod(-1).sum())
        shape = (n, ch, ps, ps) if square else (n, ch * tps * ps * ps)
        d = {key: torch.randn(*shape, generator=g), grid_key: grid}
        if "merge_sizes" in params:  # per-image merge factor (VideoLLaMA3): the config's, every image
            d["merge_sizes"] = torch.tensor([m] * b)
        return d

    grid_key = next((k for k in ("grid_thw", "image_grid_thw") if k in params), None)
    cands: list[dict] = []
    if grid_key and name in ("hidden_states", "pixel_values"):
        cands.append(patches(name))
        cands.append(patches(name, square=True))
        # one (ps * m, ps * m, channels) block of pixels per language-model token, the grid counted
        # in those tokens (Inkling2): 2x2 tokens per image
        vc = getattr(cfg, "vision_config", None) or cfg
        ps, m = _get(vc, "patch_size", default=t["patch"]), _get(vc, "spatial_merge_size", default=2)
        if isinstance(ps, int) and isinstance(m, int):
            cands.append({name: torch.randn(4 * b, ps * m, ps * m, _get(vc, "num_channels", default=3), generator=g),
                          grid_key: torch.tensor([[1, 2, 2]] * b)})
    if name == "input_ids":
        cands.append(text())
        if "pixel_values" in params:  # vision-language models whose forward needs an image
            # or several images / a video per prompt (X-CLIP, TVP, IDEFICS: batch, n, channels, h, w);
            # video models first (TVP's broadcasting would take one image as a video of it)
            image, video = {**text(), **pixels()}, {**text(), **pixels(video=True)}
            cands += [video, image] if _get(cfg, "num_frames") is not None else [image, video]
        bins = next((getattr(sc, k) for sc in [cfg] + [getattr(cfg, n, None) for n in sorted(C.SUBCONFIG_KEYS)]
                     for k in ("num_mel_bins", "feature_size") if isinstance(getattr(sc, k, None), int)), None)
        if "input_features" in params and bins:
            # text-audio models whose forward needs both (CLAP, CLVP): a spectrogram in either layout
            x = torch.randn(b, 1, t["audio_frames"], bins, generator=g)
            cands += [{**text(), "input_features": x}, {**text(), "input_features": x[:, 0].transpose(1, 2)}]
    elif name == "hidden_states" and grid_key:
        pass
    elif name in ("pixel_values", "images", "pixel_values_videos"):
        if "pixel_position_ids" in params:
            # Gemma 4 vision: patchified pixels + each patch's (x, y); a grid of 2x2 pooling windows
            vc = getattr(cfg, "vision_config", None) or cfg
            ps = _get(vc, "patch_size", default=t["patch"])
            side = 2 * (_get(vc, "pooling_kernel_size", default=1) or 1)
            yx = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1)
            cands.append({name: torch.randn(b, side * side, 3 * ps * ps, generator=g),
                          "pixel_position_ids": yx.flip(-1).reshape(1, -1, 2).expand(b, -1, -1).contiguous()})
        if "target_sizes" in params:
            # NaViT packing (MiniCPM-V): every image's patches side by side in one row of patches,
            # (1, channels, ps, patches * ps), with each image's (h, w) in patches: 4x4 per row
            vc = getattr(cfg, "vision_config", None) or cfg
            ps = _get(vc, "patch_size", default=t["patch"])
            ps = ps[0] if isinstance(ps, (list, tuple)) else ps
            ch = _get(vc, "num_channels", default=3)
            cands.append({name: torch.randn(1, ch, ps, 16 * b * ps, generator=g),
                          "target_sizes": torch.tensor([[4, 4]] * b)})
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
        if getattr(cfg, "model_type", "") in C.IMAGE_PAIRS:
            cands.insert(0, {name: torch.stack([cands[-1][name]] * 2, 1)})
        if "input_ids" in params:
            cands += [{**pixels(name), **text()}]
            # several images or frames per prompt (InstructBLIP-Video, IDEFICS): (batch, n, channels, h, w)
            cands += [{**pixels(name, video=True), **text()}]
        if "aspect_ratio_ids" in params:
            # tiled images (Mllama): (batch, images, tiles, channels, h, w), one image per row cut into
            # max_num_tiles tiles, its aspect-ratio id the 1-based index of a tile grid of that many tiles
            vc = getattr(cfg, "vision_config", None) or cfg
            tiles = _get(vc, "max_num_tiles", default=4)
            ratios = _get(vc, "supported_aspect_ratios", default=[]) or []
            rid = next((i + 1 for i, r in enumerate(ratios) if r[0] * r[1] == tiles), 1)
            cands.append({name: torch.stack([pixels(name)[name] for _ in range(tiles)], 1)[:, None],
                          "aspect_ratio_ids": torch.full((b, 1), rid),
                          "aspect_ratio_mask": torch.ones(b, 1, tiles, dtype=torch.long)})
    elif name == "input_features":
        bins = _get(cfg, "num_mel_bins", "feature_size", "input_feat_per_channel", default=16)
        bins *= getattr(cfg, "num_stacked_frames", None) or 1  # low-frame-rate encoders stack mel frames
        bins *= C.MEL_ROW_FACTOR.get(getattr(cfg, "model_type", ""), 1)
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
        proj = getattr(cfg, "feature_projection_input_dim", None)
        if isinstance(proj, int) and proj != bins:
            # conformer speech encoders that project feature rows of their own width (SeamlessM4T's
            # speech encoder: (batch, frames, 160), its ModelTester's input_features)
            cands.append({name: torch.randn(b, frames, proj, generator=g)})
    elif name == "input_values":
        if hasattr(cfg, "num_mel_bins") and hasattr(cfg, "max_length"):  # spectrogram transformers
            cands.append({name: torch.randn(b, cfg.max_length, cfg.num_mel_bins, generator=g)})
        # x-vector heads run a TDNN whose dilated kernels need ~20 frames: 4x the samples
        n = t["audio_samples"] * (4 if variant == "audio-xvector" else 1)
        spt = getattr(cfg, "samples_per_token", None)
        if isinstance(spt, int) and spt > 0:  # encoders that take whole tokens' worth of samples (Muse Spark)
            n = -(-n // spt) * spt
        x = torch.randn(b, n, generator=g)
        cands += [{name: x}, {name: x[:, None]}]
        # strided codec encoders (downsampling 10x+ before a wide kernel) need more samples
        x4 = torch.randn(b, 4 * n, generator=g)
        cands += [{name: x4[:, None]}, {name: x4}]
    elif name in ("inputs_embeds", "query_embeds"):
        hidden = _get(cfg, "hidden_size", "d_model", default=t["hidden"])
        c = {name: torch.randn(b, s, hidden, generator=g)}
        enc = getattr(cfg, "encoder_hidden_size", None)
        if name == "query_embeds" and isinstance(enc, int) and "encoder_hidden_states" in params:
            # a Q-Former's cross-attention reads image features: 4 of them per row
            c["encoder_hidden_states"] = torch.randn(b, 4, enc, generator=g)
        cands.append(c)
    elif name == "past_values":
        cands += _time_series(cfg, params, b, g)
    elif name == "inputs":  # Perceiver: its preprocessor's input, token ids for the text heads
        cands.append({name: ids(s), **({"attention_mask": text()["attention_mask"]} if "attention_mask" in params else {})})
        cands.append({name: pixels()["pixel_values"]})  # ... and an image for the image heads' preprocessors
    elif name == "latents":  # codec decoders: (batch, latent channels, frames)
        ch = _get(cfg, "latent_dim", "hidden_size", default=t["hidden"])
        cands.append({name: torch.randn(b, ch, 8, generator=g)})
    elif name == "flattened_patches":  # Pix2Struct: (row, column, patch pixels) per patch, 4x4 patches
        vc = getattr(cfg, "vision_config", None) or cfg
        d = _get(vc, "patch_embed_hidden_size", default=3 * t["patch"] ** 2)
        rc = torch.stack(torch.meshgrid(torch.arange(1, 5), torch.arange(1, 5), indexing="ij"), -1).reshape(16, 2)
        x = torch.cat([rc[None].expand(b, -1, -1).float(), torch.randn(b, 16, d, generator=g)], -1)
        cands.append({name: x, **({"attention_mask": torch.ones(b, 16, dtype=torch.long)} if "attention_mask" in params else {})})
    elif name == "states":  # Decision Transformer: a trajectory of states, actions, rewards, returns, steps
        sd, ad = _get(cfg, "state_dim", default=4), _get(cfg, "act_dim", default=2)
        start = torch.randint(0, max(1, _get(cfg, "max_ep_len", default=s) - s), (b, 1), generator=g)
        c = {name: torch.randn(b, s, sd, generator=g), "actions": torch.randn(b, s, ad, generator=g),
             "rewards": torch.randn(b, s, 1, generator=g), "returns_to_go": torch.randn(b, s, 1, generator=g),
             "timesteps": start + torch.arange(s)}  # consecutive steps of one episode, inside max_ep_len
        if "attention_mask" in params:
            c["attention_mask"] = torch.ones(b, s, dtype=torch.long)
        cands.append(c)
    elif name == "state":  # PI0: robot state, the action chunk's noise and its denoising time, beside an
        # image prompt (one camera, its image tokens first) for the VLM prefix; noise and time given,
        # else the forward draws them on the model's device
        vlm = getattr(cfg, "vlm_config", None) or cfg
        vc = vlm.vision_config
        n_img = (vc.image_size // vc.patch_size) ** 2
        prompt = torch.cat([torch.full((b, n_img), vlm.image_token_id), ids(s)], 1)
        cands.append({name: torch.randn(b, cfg.max_state_dim, generator=g),
                      "noise": torch.randn(b, cfg.chunk_size, cfg.max_action_dim, generator=g),
                      "timestep": torch.rand(b, generator=g), "input_ids": prompt,
                      "attention_mask": torch.ones_like(prompt),
                      "pixel_values": torch.randn(b, 1, vc.num_channels, vc.image_size, vc.image_size, generator=g),
                      "pixel_attention_mask": torch.ones(b, 1, dtype=torch.bool)})
    elif name == "noise_embeds":  # block-diffusion drafters (DFlash): a block of embeddings to denoise beside
        # the target model's hidden states from its target_layer_ids, concatenated, for s accepted tokens
        hidden = _get(cfg, "hidden_size", default=t["hidden"])
        n_layers = len(getattr(cfg, "target_layer_ids", None) or [0])
        cands.append({name: torch.randn(b, _get(cfg, "block_size", default=s), hidden, generator=g),
                      "context_hidden_states": torch.randn(b, s, hidden * n_layers, generator=g)})
    elif name == "audio_mel":  # Gemma 3n's audio encoder: (batch, frames, mel bins), its mask True at padding
        x = torch.randn(b, t["audio_frames"], _get(cfg, "input_feat_size", default=16), generator=g)
        cands.append({name: x, **({"audio_mel_mask": torch.zeros(b, x.shape[1], dtype=torch.bool)}
                                  if "audio_mel_mask" in params else {})})
    else:
        raise _NoRecipe(f"no dummy-input recipe for main input {name!r}")
    if arg != name:  # a forward that takes another input's tensor under a generic name
        cands = [{(arg if k == name else k): v for k, v in c.items()} for c in cands]
    if "noise" in params and name == "pixel_values":  # random patch masking (ViT-MAE): the same noise both sides
        vc = getattr(cfg, "vision_config", None) or cfg
        size = _get(vc, "image_size", default=t["image"])
        ps = _get(vc, "patch_size", default=t["patch"])
        h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        ps = ps[0] if isinstance(ps, (list, tuple)) else ps
        n = (h // ps) * (w // ps)
        mu = _get(vc, "masked_unit_size")
        if isinstance(mu, (list, tuple)):  # Hiera masks whole units of (patch_stride-strided) tokens
            stride = _get(vc, "patch_stride", default=[ps, ps])
            n = (h // stride[0] // mu[0]) * (w // stride[-1] // mu[-1])
        noise = torch.rand(b, n, generator=g)
        cands = [dict(c, noise=noise) for c in cands] + cands
    if "shared_kv_states" in params:
        # speculative drafters (Gemma 4 assistants) read the target model's state: its hidden states at
        # one new position (2 x the target's width: embedding and last hidden state side by side) and
        # its last keys / values per attention type over an s-token prompt
        kvh = getattr(text_cfg, "num_key_value_heads", None) or t["kv_heads"]
        hd = getattr(text_cfg, "head_dim", None) or t["head_dim"]
        width = 2 * (getattr(cfg, "backbone_hidden_size", None) or t["hidden"])

        def kv(kind):
            n = (getattr(text_cfg, "num_global_key_value_heads", None) or kvh) if kind == "full_attention" else kvh
            d = (getattr(text_cfg, "global_head_dim", None) or hd) if kind == "full_attention" else hd
            return torch.randn(b, n, s, d, generator=g), torch.randn(b, n, s, d, generator=g)

        cands.insert(0, {"inputs_embeds": torch.randn(b, 1, width, generator=g),
                         "shared_kv_states": {k: kv(k) for k in sorted(set(text_cfg.layer_types))},
                         "attention_mask": torch.ones(b, s, dtype=torch.long), "position_ids": torch.full((b, 1), s)})
    ncb = _get(cfg, "num_codebooks", default=1) if getattr(cfg, "model_type", "") in C.CODEBOOK_ROWS else 1
    cols = _get(cfg, "num_codebooks", default=0) if getattr(cfg, "model_type", "") in C.CODEBOOK_COLUMNS else 0
    for c in cands:
        if ncb > 1 and "input_ids" in c:
            c["input_ids"] = torch.cat([c["input_ids"]] * ncb, 1).reshape(b * ncb, -1)
        if cols and "input_ids" in c:  # the text token, then one code per codebook (ids below both vocabularies)
            c["input_ids"] = torch.stack([c["input_ids"]] + [ids(c["input_ids"].shape[1]) for _ in range(cols)], -1)
        _fill_required(c, params, cfg, b, s, ids, g)
    nq = getattr(cfg, "num_query_tokens", None)
    tok = getattr(cfg, "image_token_id", None)
    tok = tok if isinstance(tok, int) else getattr(cfg, "video_token_id", None)
    if isinstance(nq, int) and isinstance(tok, int):
        # BLIP-2-style: the Q-Former's query outputs replace one image token each, so a prompt
        # beside an image opens with exactly num_query_tokens of them (per frame of a video)
        for c in cands:
            if "pixel_values" in c and "input_ids" in c:
                n = nq * (c["pixel_values"].shape[1] if c["pixel_values"].dim() == 5 else 1)
                c["input_ids"] = torch.cat([torch.full((b, n), tok), c["input_ids"]], 1)
                if "attention_mask" in c:
                    c["attention_mask"] = torch.cat([torch.ones(b, n, dtype=torch.long), c["attention_mask"]], 1)
    for c in cands:
        pv, ids_ = c.get("pixel_values"), c.get("input_ids")
        if pv is None or ids_ is None:
            continue
        if "image_attention_mask" in params and pv.dim() == 5:
            # IDEFICS: which of the row's images each text token attends to (all of them)
            c["image_attention_mask"] = torch.ones(b, ids_.shape[1], pv.shape[1], dtype=torch.long)
        lq = getattr(cfg, "latent_query_num", None)
        if "image_embeds_position_mask" in params and isinstance(lq, int) and lq < ids_.shape[1]:
            # Kosmos-2: the image's latent queries replace the tokens after <image> (the first)
            mask = torch.zeros_like(ids_)
            mask[:, 1:1 + lq] = 1
            c["image_embeds_position_mask"] = mask
    if "qformer_input_ids" in params:  # InstructBLIP: the Q-Former's own text prompt
        q = ids(s)
        for c in cands:
            c.setdefault("qformer_input_ids", q)
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        dec = ids(t["decoder_seq"])
        if getattr(cfg, "model_type", "") in C.DECODER_CODEBOOK_ROWS:
            n = _get(getattr(cfg, "decoder_config", cfg), "num_channels", "num_codebooks", default=1)
            dec = torch.stack([dec] * n, -1)  # (batch, seq, channels): the 2-D layout hits a .view
        elif getattr(cfg, "model_type", "") in C.CODEBOOK_ROWS:
            # MusicGen's text-to-audio model: its decoder reads (batch * codebooks, seq), as its
            # ModelTester's decoder_input_ids
            n = getattr(getattr(cfg, "decoder", None), "num_codebooks", None) or 1
            dec = torch.cat([dec] * n, 1).reshape(b * n, -1)
        for c in cands:
            c["decoder_input_ids"] = dec
    mels = getattr(cfg, "num_mel_bins", None)
    if "decoder_input_values" in params and isinstance(mels, int):
        # text-to-speech decoders (SpeechT5) read mel frames, not ids: (batch, frames, num_mel_bins),
        # as SpeechT5ForTextToSpeechTester's decoder_input_values
        dec = torch.randn(b, t["decoder_seq"], mels, generator=g)
        for c in cands:
            c.setdefault("decoder_input_values", dec)
    canvas = getattr(cfg, "canvas_length", None)
    if isinstance(canvas, int) and "decoder_input_ids" in params:
        # block diffusion (diffusion_gemma): without a canvas the forward draws one with randint on
        # the model's device, which no seed makes equal across devices
        dec = ids(canvas)
        for c in cands:
            c.setdefault("decoder_input_ids", dec)
    if not getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        # a text decoder over an image-text encoder in a config that is not encoder-decoder (BLIP's VQA
        # head: its forward refuses to run without decoder ids or labels); appended, so a forward that
        # takes decoder ids as optional keeps the candidate it takes today, and its dummy values (drawn last)
        dec = ids(t["decoder_seq"])
        cands += [dict(c, decoder_input_ids=dec) for c in cands if "input_ids" in c and "decoder_input_ids" not in c]
    if getattr(cfg, "is_encoder_decoder", False) and variant in ("seq-cls", "qa", "token-cls"):
        # encoder-decoder classifiers shift input_ids into the decoder themselves and pool at
        # the <eos> token (one per row, BART-style): no decoder ids, an <eos> ending each row
        eos = getattr(text_cfg, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
        for c in cands:
            c.pop("decoder_input_ids", None)
            if eos is not None and "input_ids" in c and eos < vocab:
                c["input_ids"] = c["input_ids"].clone()
                c["input_ids"][:, -1] = eos
    if "global_attention_mask" in params:
        # Longformer's QA / multiple-choice heads derive global attention from exactly three
        # separator tokens per row unless given it: global attention on each row's first token
        # (its ModelTester gives the common inputs one global token)
        for c in [c for c in cands if "input_ids" in c and "global_attention_mask" not in c]:
            glob = torch.zeros_like(c["input_ids"])
            glob[..., 0] = 1
            cands.append(dict(c, global_attention_mask=glob))
    if "question_positions" in params:
        # Splinter's pretraining head needs a question token in every row unless told where its
        # questions are: two per row, as SplinterModelTester passes question_positions
        qpos = torch.tensor([[1, s // 2]] * b)
        cands += [dict(c, question_positions=qpos) for c in cands if "input_ids" in c]
    if variant == "multiple-choice":  # (batch, choices, seq): each row's text as 2 choices
        cands = [{k: v[:, None].expand(-1, 2, *v.shape[1:]).contiguous() if v.dim() == 2 else v
                  for k, v in c.items()} for c in cands]
    return cands


def labels_for(model, variant: str, inputs: dict, out) -> dict | None:
    """The labels that make `model` (a head of kind `variant`) compute its loss, shaped from the
    inputs and the forward's outputs; None for heads without a recipe (hf_configs.LOSS_LABELS)."""
    recipe = C.LOSS_LABELS.get(variant)
    params = inspect.signature(model.forward).parameters
    if recipe is None or not ({"labels", "start_positions"} & set(params)) \
            or getattr(model.config, "model_type", "") in C.NO_LOSS:
        return None
    g = torch.Generator().manual_seed(4321)
    logits = getattr(out, "logits", None)
    if recipe == "span" and "start_positions" not in params:
        # QA heads that classify over an answer vocabulary (LXMERT: question_answering_score, its loss
        # from `labels`), not span extractors
        recipe = "class"
        logits = getattr(out, "question_answering_score", logits)
    ids = inputs.get("input_ids")
    b = C.BATCH.get(getattr(model.config, "model_type", ""), C.TINY["batch"])
    n_cls = logits.shape[-1] if isinstance(logits, torch.Tensor) and logits.dim() >= 2 else \
        getattr(model.config, "num_labels", 2)
    mtype = getattr(model.config, "model_type", "")
    if ids is not None and ids.dim() == 3 and mtype in C.CODEBOOK_COLUMNS:
        ids = ids[..., 0]  # text token + audio codes per step: the loss is over the text column
    if ids is not None and mtype in C.CODEBOOK_ROWS:  # (batch * codebooks, seq) -> (batch, seq, codebooks)
        ids = ids.reshape(b, -1, ids.shape[-1]).transpose(1, 2)
    if recipe == "ids" and getattr(model.config, "is_encoder_decoder", False) and "decoder_input_ids" in inputs:
        recipe = "decoder_ids"  # an encoder-decoder's LM loss is over the decoder's tokens (UDOP)
    if recipe == "ids" and ids is not None:
        if mtype in C.LOSS_WITH_IMAGE and "pixel_values" in params and "pixel_values" not in inputs:
            _, ch, h, w = _image(model.config)
            return {"labels": ids, "pixel_values": torch.randn(ids.shape[0], ch, h, w, generator=g)}
        return {"labels": ids}
    if recipe == "decoder_ids" and "decoder_input_ids" in inputs:
        dec = inputs["decoder_input_ids"]
        if dec.dim() == 3:  # parallel codebooks (dia): one row of labels per (batch, channel)
            dec = dec.transpose(1, 2).reshape(-1, dec.shape[1])
        return {"labels": dec}
    if recipe == "decoder_ids" and ids is not None:
        return {"labels": ids}
    if recipe in ("class", "choice", "binary"):
        k = 2 if recipe == "binary" else max(1, n_cls)
        if recipe == "class" and (k == 1 or getattr(model.config, "problem_type", None) == "regression"):
            return {"labels": torch.randn(b, k, generator=g)}
        return {"labels": torch.randint(0, k, (b,), generator=g)}
    if recipe == "token_class" and ids is not None:
        return {"labels": torch.randint(0, max(1, n_cls), ids.shape[:2], generator=g)}
    if recipe == "span" and ids is not None:
        s = ids.shape[-1]
        return {"start_positions": torch.randint(0, s, (b,), generator=g),
                "end_positions": torch.randint(0, s, (b,), generator=g)}
    if recipe == "ctc":
        vocab = getattr(model.config, "vocab_size", None) or 8
        lab = {"labels": torch.randint(1, max(2, vocab), (b, 3), generator=g)}
        feats = inputs.get("input_features")
        if feats is not None and "attention_mask" in params and "attention_mask" not in inputs:
            # conformer CTC heads (parakeet, lasr, granite_speech5) take the logit lengths from the
            # mask: every frame of the (batch, frames, features) input valid
            lab["attention_mask"] = torch.ones(feats.shape[:2], dtype=torch.long)
        wave = inputs.get("input_values")
        if wave is not None and "padding_mask" in params and "padding_mask" not in inputs:
            # wav2vec2-style CTC heads that take the logit lengths from a padding mask (omniASR: without
            # one its encoder returns no output mask and the loss cannot count frames): every sample valid
            lab["padding_mask"] = torch.ones(wave.shape[0], wave.shape[-1], dtype=torch.long)
        return lab
    if recipe == "pixel_class" and "pixel_values" in inputs:
        h, w = inputs["pixel_values"].shape[-2:]
        return {"labels": torch.randint(0, max(1, getattr(model.config, "num_labels", 2)), (b, h, w),
                                        generator=g)}
    return None


# Optional in the signature, required by the model in practice (layout and region-feature models).
_LAYOUT = ("bbox", "visual_feats", "visual_pos")


def _fill_required(c: dict, params, cfg, b: int, s: int, ids, g) -> None:
    """Arguments a forward requires beyond its main input, by name (layout boxes, region
    features, masks, prompts): shapes from the candidate's own tensors and the config."""
    t = C.TINY
    required = [n for n, p in params.items() if (p.default is inspect.Parameter.empty or n in _LAYOUT)
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in c]
    required += [n for n in C.KWARG_INPUTS.get(getattr(cfg, "model_type", ""), ()) if n not in c]
    for n in required:
        if n == "bbox":  # (x0, y0, x1, y1) boxes in 0..1000, x0 <= x1 and y0 <= y1
            lo = torch.randint(0, 500, (b, s, 2), generator=g)
            c[n] = torch.cat([lo, lo + torch.randint(0, 500, (b, s, 2), generator=g)], -1)
        elif n == "visual_feats":
            c[n] = torch.randn(b, 4, _get(cfg, "visual_feat_dim", default=t["hidden"]), generator=g)
        elif n == "visual_pos":
            c[n] = torch.rand(b, 4, _get(cfg, "visual_pos_dim", default=4), generator=g)
        elif n.endswith("_mask") and "input_features" in c and n.startswith("input_features"):
            c[n] = torch.ones(b, c["input_features"].shape[-1], dtype=torch.long)
        elif n in ("task_inputs", "input_ids"):
            c[n] = ids(s)
        elif n == "input_values":
            c[n] = torch.randn(b, 1, t["audio_samples"], generator=g)
        elif n == "input_features" and "input_values" in c:  # codecs with a semantic encoder beside
            # the acoustic one (Xcodec2): one feature frame per hop of the waveform
            sem = getattr(cfg, "semantic_model_config", None) or cfg
            dim = _get(sem, "feature_projection_input_dim", "num_mel_bins", default=t["hidden"])
            c[n] = torch.randn(b, c["input_values"].shape[-1] // (getattr(cfg, "hop_length", None) or 320), dim,
                               generator=g)
        elif n == "query_embeds":
            c[n] = torch.randn(b, _get(cfg, "num_query_tokens", default=4),
                               _get(cfg, "hidden_size", default=t["hidden"]), generator=g)
        elif n == "t_cond":  # Voxtral Realtime's decoder: the time embedding its composite model adds
            c[n] = torch.randn(1, _get(cfg, "hidden_size", default=t["hidden"]), generator=g)
        elif n == "marks":  # decision heads (JEV): 1-based positions of each question's mark in row 0
            c[n] = torch.tensor([[s // 2, s]])
        elif n == "num_options":
            c[n] = torch.tensor([[2, 2]])
        elif n == "question_type_ids":
            c[n] = torch.zeros(1, 2, dtype=torch.long)
        elif n == "bool_masked_pos" and "pixel_values" in c:
            # masked-video pretraining (VideoMAE) requires the mask: one row per video, every row with
            # the same count masked (the visible tokens are reshaped per row); ModelTester's 90 %, first ones
            pv = c["pixel_values"]
            ps = _get(cfg, "patch_size", default=t["patch"])
            ps = ps[0] if isinstance(ps, (list, tuple)) else ps
            seq = (pv.shape[-2] // ps) * (pv.shape[-1] // ps)
            if pv.dim() == 5:  # (batch, frames, channels, h, w): tubelets of tubelet_size frames
                seq *= pv.shape[1] // (_get(cfg, "tubelet_size", default=1) or 1)
            mask = torch.zeros(b, seq, dtype=torch.bool)
            mask[:, :int(0.9 * seq)] = True
            c[n] = mask
        elif n in ("prompt_pixel_values", "prompt_masks") and "pixel_values" in c:
            c[n] = torch.randn(*c["pixel_values"].shape, generator=g)


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
