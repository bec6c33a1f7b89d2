"""Greedy generation with a tiny Llama: programs compiled per run and tokens/s, next to
torch CPU eager in the same run.

    python -m torchtpu.bench generate [--tokens 16,256] [--caches dynamic,static]
                                      [--modes strict,defer_and_fuse,compile]

A tiny random Llama-architecture model (Transformers, no hub), an 8-token prompt,
greedy decoding. Per cache (Transformers' default DynamicCache, and
cache_implementation="static") and mode (strict, defer_and_fuse, and strict eager
around a forward compiled with torch.compile(backend="tpu")), each run starts from
empty executable caches: the short generate is the warm-up, then the long one is run
twice, first (compiling what the warm-up did not) and warm. Reported: the programs one
decode step needs (what a 2-token generate compiles after a 1-token one, from empty
caches: the unit of the issue-19 acceptance, new programs at most 4x it), programs the
warm-up compiled, programs the long run compiled after it and whether that is within 4x
a step's, first-run and warm tokens/s, the ratio first/warm, and whether the tokens
equal CPU's.
"""
from __future__ import annotations

import argparse
import copy
import os
import time

import torch

import torchtpu

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _generate(model, prompt, tokens: int, cache: str):
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        return model.generate(prompt, **kw)


def _timed(fn):
    t0 = time.perf_counter()
    before = torchtpu.metrics()["compiles"]  # every program: ops', regions' and graphs'
    out = fn().cpu()
    return out, time.perf_counter() - t0, torchtpu.metrics()["compiles"] - before


def _fresh(base, mode):
    torch._dynamo.reset()
    torchtpu.clear_caches()
    model = copy.deepcopy(base).to("tpu")
    if mode == "compile":
        model.forward = torch.compile(model.forward, backend="tpu")
    return model, ("strict" if mode == "compile" else mode)


def _step_programs(base, prompt, cache: str, mode: str) -> int:
    """Programs one decode step needs in this mode (the acceptance's unit): from empty
    caches, generate 1 token (the prefill), then 2 (prefill again, and one decode step):
    the second compiles what a decode step needs beyond the prefill's programs."""
    model, eager = _fresh(base, mode)
    p = prompt.to("tpu")
    with torchtpu.eager_mode(eager):
        _timed(lambda: _generate(model, p, 1, cache))
        return _timed(lambda: _generate(model, p, 2, cache))[2]


def _run(base, prompt, short: int, long: int, cache: str, mode: str, ref):
    step = _step_programs(base, prompt, cache, mode)
    model, eager = _fresh(base, mode)
    p = prompt.to("tpu")
    with torchtpu.eager_mode(eager):
        _, t_warmup, c_warmup = _timed(lambda: _generate(model, p, short, cache))
        out1, t_first, c_long = _timed(lambda: _generate(model, p, long, cache))
        out2, t_warm, c_again = _timed(lambda: _generate(model, p, long, cache))
    same = torch.equal(out1, ref) and torch.equal(out2, ref)
    return dict(step_programs=step, warmup_programs=c_warmup, long_programs=c_long, again_programs=c_again,
                first_tps=long / t_first, warm_tps=long / t_warm, ratio=t_first / t_warm, same=same)


def _within(new, step) -> str:
    return "-" if new is None or step is None else ("yes" if new <= 4 * max(step, 1) else "NO")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.bench generate")
    p.add_argument("--tokens", default="16,256", help="warm-up and long run lengths (new tokens)")
    p.add_argument("--caches", default="dynamic,static")
    p.add_argument("--modes", default="strict,defer_and_fuse,compile")
    args = p.parse_args(argv)
    short, long = (int(x) for x in args.tokens.split(","))
    caches = args.caches.split(",")
    modes = args.modes.split(",")
    base = _model()
    prompt = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(2))
    rows = []
    total = len(caches) * (len(modes) + 1)
    i = 0
    for cache in caches:
        i += 1
        print(f"[{i}/{total}] {cache} cache, torch CPU eager ...", flush=True)
        _generate(base, prompt, short, cache)
        t0 = time.perf_counter()
        ref = _generate(base, prompt, long, cache)
        cpu_tps = long / (time.perf_counter() - t0)
        rows.append((cache, "torch cpu", None, None, None, cpu_tps, cpu_tps, 1.0, True))
        for mode in modes:
            i += 1
            print(f"[{i}/{total}] {cache} cache, {mode} ...", flush=True)
            try:
                r = _run(base, prompt, short, long, cache, mode, ref)
            except Exception as e:  # a failing mode is a row, not the end of the benchmark
                print(f"    failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                rows.append((cache, mode, None, None, None, None, None, None, False))
                continue
            print(f"    {r}", flush=True)
            rows.append((cache, mode, r["step_programs"], r["warmup_programs"], r["long_programs"],
                         r["first_tps"], r["warm_tps"], r["ratio"], r["same"]))
    print()
    print(f"greedy generate, tiny Llama, 8-token prompt: {short} new tokens (warm-up), then {long} "
          f"(first run, then warm), XLA:{torchtpu.platform()} vs torch CPU eager")
    hdr = (f"{'cache':<9}{'mode':<16}{'step progs':>11}{'warm-up progs':>14}{'new progs':>11}{'<=4x':>6}"
           f"{'first tok/s':>13}{'warm tok/s':>12}{'first/warm':>12}{'tokens':>9}")
    print(hdr)
    print("-" * len(hdr))

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for cache, mode, cs, cw, cl, ft, wt, ratio, same in rows:
        print(f"{cache:<9}{mode:<16}{f(cs, 'd'):>11}{f(cw, 'd'):>14}{f(cl, 'd'):>11}{_within(cl, cs):>6}"
              f"{f(ft, '.1f'):>13}{f(wt, '.1f'):>12}{f(ratio, '.2f'):>12}"
              f"{('equal' if same else 'DIFFER'):>9}")
    return 0
