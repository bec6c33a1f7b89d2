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
import json
import os
import sys

from . import hf_configs as C
from .hf_tiny import model_types, tiny_config, variants  # noqa: F401  (sets HF_HUB_OFFLINE first)
from .hf_compare import MODES, STATES, Result, compare, leaves, result_from as _result_from  # noqa: F401
from .hf_inputs import make_inputs, modality  # noqa: F401
from .hf_report import _md_direct, merge_files, print_summary, report_from_json, summarize  # noqa: F401
from .hf_run import build, compile_available, reference, run_model  # noqa: F401
from .hf_workers import run_all
from .progress import Progress


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m torchtpu.validate hf")
    p.add_argument("--json", help="write per-model states here (e.g. docs/hf.json)")
    p.add_argument("--markdown", help="write a markdown report here (e.g. docs/hf.md), with a PNG chart")
    p.add_argument("--models", nargs="*", help="model types (default: every type in the auto mappings)")
    p.add_argument("--subset", action="store_true", help="the representative subset make test runs")
    p.add_argument("--mode", default="defer_and_fuse", choices=MODES,
                   help="an eager mode, compile, or cpu: the coverage pass (CPU reference only, no tpu)")
    p.add_argument("--variants", nargs="*", default=["base", "head"], choices=["base", "head", "heads"],
                   help="base model, first head (HEAD_PRIORITY), every head class of the type")
    p.add_argument("--attn", choices=["eager", "sdpa"], help="force attn_implementation (default: config's)")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--generate", action="store_true",
                   help="greedy generate(max_new_tokens=8) on causal-LM and encoder-decoder heads")
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
    p.add_argument("--merge-from", nargs="+", metavar="JSON",
                   help="run nothing: merge these sweep files (pieces run in parallel, each with its own "
                        "--json) into --json, recompute the summaries, render --markdown")
    args = p.parse_args(argv)
    if args.merge_from:
        if not args.json:
            p.error("--merge-from needs --json (the file to merge into)")
        for mode, n in merge_files(args.json, args.merge_from).items():
            print(f"{mode}: {n} rows merged into {args.json}")
        if args.markdown:
            report_from_json(args.json, args.markdown)
        return 0
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
        notes = data["modes"].get(args.mode, {}).get("notes", []) if args.merge else []  # hand-written
        data["modes"][args.mode] = {"summary": summ, "argv": argv, "models": dict(sorted(prev.items())),
                                    **({"notes": notes} if notes else {})}
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    if args.markdown:
        report_from_json(args.json, args.markdown) if args.json else _md_direct(args, summary, results, argv)
    return 0


def _partial(args) -> str:
    """The per-mode checkpoint: one JSON line per finished model."""
    return f"{args.json}.{args.mode}.partial"
