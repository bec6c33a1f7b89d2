"""Reports of a sweep: per-mode summary counts, the terminal table, the per-modality chart and
docs/hf.md, written from the sweep's JSON."""
from __future__ import annotations

import json
import os
import sys

import torch

import torchtpu

from . import hf_configs as C
from .hf_compare import ATOL, MODES, ROUNDING_FACTOR, RTOL, STATES, Result, mismatch_cause, result_from as _result_from
from .hf_inputs import _class_modality


def summarize(results: list[Result], mode: str) -> dict:
    counts = {s: 0 for s in STATES}
    by_modality: dict[str, dict] = {}
    for r in results:
        if r.modality in ("", "unknown") and r.cls:
            r.modality = _class_modality(r.cls)
        counts[r.state] += 1
        by_modality.setdefault(r.modality or "unknown", {s: 0 for s in STATES})[r.state] += 1
    ran_cpu = counts["match"] + counts["mismatch"] + counts["tpu-error"] + counts["cpu-ok"]
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
    bwd_cpu = bwd_den + bwd["cpu-ok"]
    gen_cpu = gen_den + gen["cpu-ok"]
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
        "ran_on_cpu_pct": pct(ran_cpu, len(results)),
        "types_ran_on_cpu": len({r.model_type for r in results if r.state in _RAN}),
        "backward_ran_on_cpu": bwd_cpu, "generate_ran_on_cpu": gen_cpu,
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


_RAN = ("match", "mismatch", "tpu-error", "cpu-ok")


def _tf_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except Exception:
        return "?"


def _states(s: dict) -> list[str]:
    """The states a mode's tables show: the coverage pass has no tpu states, tpu modes no cpu-ok."""
    if s["mode"] == "cpu":
        return ["cpu-ok", "cpu-error", "skipped"]
    return [st for st in STATES if st != "cpu-ok" or s["states"].get(st)]


def print_summary(s: dict, out=sys.stdout) -> None:
    print(file=out)
    print(f"{'state':<12}{'forward':>9}{'backward':>10}{'generate':>10}", file=out)
    print("-" * 41, file=out)
    for st in _states(s):
        print(f"{st:<12}{s['states'].get(st, 0):>9}{s['backward'].get(st, 0):>10}{s['generate'].get(st, 0):>10}",
              file=out)
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
    for st in _states(summary):
        vals = [summary["by_modality"][m].get(st, 0) for m in mods]
        ax.barh(mods, vals, left=left, color=colors.get(st, "#90caf9"), label=st)
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("models")
    ax.set_title(f"Transformers {summary['transformers']} on tpu vs CPU ({summary['mode']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cause(detail: str) -> str:
    """Whose a CPU-side failure is: an upstream limit (a library that cannot be installed beside
    torch 2.13 here, a model without forward(), a tracker that needs a live session) or ours (the
    harness has no working tiny config / inputs for it yet)."""
    if "requires the timm library" in detail:
        return "upstream: needs timm, which needs torchvision (PyPI's does not load beside torch 2.13)"
    if "requires the torchaudio library" in detail:
        return "upstream: needs torchaudio (PyPI's does not load beside torch 2.13)"
    if "natten library" in detail or "detectron2 library" in detail:
        return "upstream: needs natten / detectron2 (C++ builds against a CUDA torch)"
    if "_forward_unimplemented" in detail:
        return "upstream: the class has no forward() (generate-only / codec wrapper)"
    if "inference_session" in detail:
        return "upstream: forward needs a live video inference session"
    if "shared_kv_states" in detail:
        return "upstream: a drafter whose forward needs its target model's shared KV states"
    if "name 'BlockMask' is not defined" in detail:
        return ("upstream: Transformers turns flex attention off when the accelerator is named tpu, "
                "and the model names BlockMask unguarded")
    if detail.startswith("upstream:"):  # a skip whose reason the harness data states
        return detail.split("\n", 1)[0]
    if "timed out" in detail:
        return "ours: CPU reference over the time limit"
    return "ours: harness has no working tiny config / inputs yet"


def coverage_lines(results_by_mode: dict, mapped: list[str] | None) -> list[str]:
    """Types whose CPU reference ran (any variant, any mode) against every type the auto mappings
    map; the heads seen by the coverage pass (`--mode cpu`)."""
    ran: set[str] = set()
    seen: set[str] = set()
    for rs in results_by_mode.values():
        for r in rs:
            seen.add(r.model_type)
            if r.state in _RAN:
                ran.add(r.model_type)
    total = len(mapped) if mapped else len(seen)
    out = ["## Coverage", "",
           f"- model types the auto mappings of Transformers {_tf_version()} map: {total}",
           f"- types whose tiny model ran on CPU (any head, any sweep below): {len(ran)} "
           f"({round(100 * len(ran) / total, 1) if total else 0} %)",
           f"- types not reached by any sweep yet: {len(set(mapped or []) - seen)}"]
    cpu = results_by_mode.get("cpu")
    if cpu:
        ok = sum(r.state == "cpu-ok" for r in cpu)
        bwd = [r for r in cpu if r.backward]
        gen = [r for r in cpu if r.generate]
        out += [f"- coverage pass (`--mode cpu`, every head class): {len(cpu)} (type, head) pairs run, "
                f"{ok} ran on CPU; losses: {sum(r.backward == 'cpu-ok' for r in bwd)} of {len(bwd)}; "
                f"generate: {sum(r.generate == 'cpu-ok' for r in gen)} of {len(gen)}"]
    return out + [""]


def write_markdown(path: str, summaries: dict, results_by_mode: dict, argv_by_mode: dict,
                   chart: str | None, notes: dict | None = None, mapped: list[str] | None = None) -> None:
    lines = ["# Hugging Face Transformers on tpu", ""]
    lines += [n + "\n" for n in (notes or {}).get("", [])]
    lines += coverage_lines(results_by_mode, mapped)
    for mode, s in summaries.items():
        lines += [f"## Mode `{mode}`", "",
                  f"Generated by `python -m torchtpu.validate hf {' '.join(argv_by_mode[mode])}` "
                  f"(transformers {s['transformers']}, torch {s['torch']}, XLA:{torchtpu.platform()}; "
                  f"float32, atol={s['atol']}, rtol={s['rtol']}).", "",
                  "| state | forward | backward (heads with a loss) | generate |", "|---|---:|---:|---:|"]
        for st in _states(s):
            lines.append(f"| {st} | {s['states'].get(st, 0)} | {s['backward'].get(st, 0)} | "
                         f"{s['generate'].get(st, 0)} |")
        if s.get("planned", s["models"]) > s["models"]:
            lines += ["", f"**Partial sweep**: {s['models']} of {s['planned']} models ran before the "
                      "run was stopped (models run in a seeded random order, so this is a uniform "
                      "sample; `--resume` continues it from the JSON checkpoint)."]
        lines += ["", f"- models: {s['models']} ({s['model_types']} model types)",
                  f"- ran on CPU (the denominator): {s['ran_on_cpu']}",
                  f"- ran on tpu without error: {s['tpu_no_error_pct']} %",
                  f"- match CPU numerics: {s['match_pct']} %",
                  f"- zero CPU fallbacks (of those that ran): {s['zero_fallback_pct']} %",
                  f"- backward match (heads with a loss): {s['backward_match_pct']} %",
                  f"- greedy generate match: {s['generate_match_pct']} %", ""]
        lines += [n + "\n" for n in (notes or {}).get(mode, [])]
        if chart and mode == next(iter(summaries)):
            lines += [f"![states by modality]({os.path.basename(chart)})", ""]
        sts = _states(s)
        lines += ["| modality | " + " | ".join(sts) + " |", "|---" * (len(sts) + 1) + "|"]
        for m, c in sorted(s["by_modality"].items()):
            lines.append(f"| {m} | " + " | ".join(str(c.get(st, 0)) for st in sts) + " |")
        if s["fallback_ops_models"]:
            lines += ["", "Ops that fell back to CPU (number of models):", ""]
            lines += [f"- `{k}`: {v}" for k, v in s["fallback_ops_models"].items()]
        bad = [r for r in results_by_mode[mode] if r.state in ("mismatch", "tpu-error")
               or r.backward in ("mismatch", "tpu-error") or r.generate in ("mismatch", "tpu-error")]
        if bad:
            lines += ["", "### Backend failures", "",
                      "Cause: a mismatch is weighed against the same model run in float64 on CPU: tpu about as "
                      f"close to that answer as CPU float32 is (within {ROUNDING_FACTOR:g}x) is float32 rounding, "
                      "farther is ours; every tpu-error is ours.", "",
                      "| model | state | bwd | gen | op | cause | detail |", "|---|---|---|---|---|---|---|"]
            for r in sorted(bad, key=lambda r: r.key):
                d = (r.detail or r.backward_detail or r.generate_detail).replace("|", "/")[:200]
                why = C.DIAGNOSED.get(r.key) or (mismatch_cause(r) if "mismatch" in (r.state, r.backward) else "ours")
                lines.append(f"| {r.key} | {r.state} | {r.backward} | {r.generate} | {r.failing_op} | {why} | {d} |")
        other = [r for r in results_by_mode[mode] if r.state in ("cpu-error", "skipped")]
        if other:
            lines += ["", "### Not run (cpu-error: the tiny config or dummy inputs do not work on CPU "
                      "either; excluded from the denominator)", "",
                      "| model | state | cause | detail |", "|---|---|---|---|"]
            for r in sorted(other, key=lambda r: r.key):
                lines.append(f"| {r.key} | {r.state} | {cause(r.detail)} | {r.detail.replace('|', '/')[:160]} |")
        unchecked = [(r, what, st, det) for r in results_by_mode[mode] if r.state not in ("cpu-error", "skipped")
                     for what, st, det in (("backward", r.backward, r.backward_detail),
                                           ("generate", r.generate, r.generate_detail))
                     if st in ("cpu-error", "skipped")]
        if unchecked:
            lines += ["", "### Checks not run (the forward ran; its backward or generate fails on CPU too, or "
                      "cannot run beside it)", "", "| model | check | state | cause | detail |", "|---|---|---|---|---|"]
            for r, what, st, det in sorted(unchecked, key=lambda x: (x[0].key, x[1])):
                lines.append(f"| {r.key} | {what} | {st} | {cause(det)} | {det.replace('|', '/')[:160]} |")
        lines.append("")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def merge_files(json_path: str, files: list[str]) -> dict[str, int]:
    """Merge the rows of sweep files run as separate pieces (`--json piece.json`, in parallel)
    into `json_path`: a row replaces the same (type:variant) row of its mode (a type's other heads
    keep theirs: a sweep of one head says nothing about the others), and each touched mode's
    summary is recomputed from all its rows. Returns rows merged per mode."""
    with open(json_path) as f:
        data = json.load(f)
    merged: dict[str, int] = {}
    for path in files:
        with open(path) as f:
            piece = json.load(f)
        for mode, sec in piece.get("modes", {}).items():
            rows = sec.get("models", {})
            target = data["modes"].setdefault(mode, {"argv": sec.get("argv", []), "models": {}})
            target["models"].update(rows)
            merged[mode] = merged.get(mode, 0) + len(rows)
    for mode in merged:
        target = data["modes"][mode]
        target["models"] = dict(sorted(target["models"].items()))
        summary = summarize([_result_from(d) for d in target["models"].values()], mode)
        summary["planned"] = summary["models"]
        target["summary"] = summary
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    return merged


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
    notes = {m: data["modes"][m].get("notes", []) for m in modes}
    notes[""] = data.get("notes", [])
    try:
        from .hf_tiny import model_types

        mapped = model_types()
    except Exception:  # transformers missing: the report still renders, without the denominator
        mapped = None
    write_markdown(md_path, summaries, results, argvs, chart, notes, mapped)


def _md_direct(args, summary, results, argv):
    chart = os.path.splitext(args.markdown)[0] + "_states.png"
    write_chart(chart, summary)
    write_markdown(args.markdown, {args.mode: summary}, {args.mode: results}, {args.mode: argv}, chart)
