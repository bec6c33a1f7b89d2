"""PyTorch's ModuleInfo database (the inputs of its test_modules.py) on tpu vs CPU.

    python -m torchtpu.validate modules [--modules nn.Conv2d ...] [--dtypes float32 bfloat16 float64]
                                        [--modes strict defer_and_fuse compile] [--limit N]
                                        [--json P] [--markdown P]

`torch.testing._internal.common_modules.module_db` holds, for each of ~110 nn modules, the
constructor arguments and forward inputs PyTorch's own device-generic module tests use (batched
and unbatched, each constructor option, train and eval where they differ), and the inputs that
must raise. For each module, dtype it supports on CPU, training flag and input: the module is
built on CPU from a fixed seed, a deep copy moved to tpu (a lazy module gets CPU's values after
CPU's first forward), and both run forward, then backward of every floating output with the
same random cotangent. Compared with CPU: every output, the gradient of every input and
parameter, and the state dict afterwards (running statistics). The tpu side runs in the given
eager mode, or, for `compile`, as `torch.compile(module, backend="tpu")` in strict mode.

Each dtype the module builds in on CPU is tried, beyond the info's own list (most list only
float32 and float64): a case CPU refuses is no case. A float32, bfloat16 or half mismatch is
weighed against CPU's float64 run: when tpu's result is no further from float64 than 4x CPU's
own result is (plus a small absolute slack), the case is `rounding` (passes, counted apart);
otherwise it fails. Ops that fell back to the CPU
(torchtpu.metrics()["fallback_ops"]) are listed per case: a defect even when values match.

Error inputs (`module_error_inputs_func`, construction or forward errors): tpu must raise the
exception class CPU raises, with the message PyTorch's test expects.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
import warnings
from pathlib import Path

import torch

from .progress import Progress

TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-2),
       torch.float16: (1e-3, 1e-3)}
MODES = ("strict", "defer_and_fuse", "compile")


def _on(dev, tree):
    """Tensors of `tree` on `dev`, fresh leaves keeping requires_grad."""
    from torch.utils._pytree import tree_map

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.detach().to(dev).requires_grad_(x.requires_grad)
        return x
    return tree_map(move, tree)


def _tensors(tree):
    from torch.utils._pytree import tree_flatten
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _run(module, args, kwargs, dev, *, compiled=False):
    """Forward and backward on `dev`: (outputs, input and parameter grads, state dict), all on CPU."""
    a, k = _on(dev, args), _on(dev, kwargs)
    torch.manual_seed(1)
    if compiled:  # a fresh Dynamo cache per case: past its recompile limit it would run eager
        torch._dynamo.reset()
    fn = torch.compile(module, backend="tpu", fullgraph=False) if compiled else module
    out = fn(*a, **k)
    flat = _tensors(out)
    diff = [o for o in flat if o.requires_grad and (o.is_floating_point() or o.is_complex())]
    grads = []
    if diff:
        g = torch.Generator().manual_seed(2)
        cots = [torch.randn(o.shape, generator=g, dtype=o.dtype).to(dev) for o in diff]
        wrt = [x for x in _tensors((a, k)) if x.requires_grad] + [p for p in module.parameters() if p.requires_grad]
        got = torch.autograd.grad(diff, wrt, cots, allow_unused=True)
        grads = [None if x is None else x.detach().cpu() for x in got]
    state = {n: v.detach().cpu() for n, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
    return [o.detach().cpu() for o in flat], grads, state


def _pairs(cpu, tpu):
    """(name, cpu tensor, tpu tensor) for everything two _run results hold; a structural
    difference is a (name, None, message) entry."""
    out = []
    for what, xs, ys in (("output", cpu[0], tpu[0]), ("grad", cpu[1], tpu[1])):
        if len(xs) != len(ys):
            out.append((what, None, f"{len(ys)} {what}s on tpu, {len(xs)} on CPU"))
            continue
        out += [(f"{what}{i}", x, y) for i, (x, y) in enumerate(zip(xs, ys))]
    if cpu[2].keys() != tpu[2].keys():
        out.append(("state", None, f"state keys differ: {sorted(set(cpu[2]) ^ set(tpu[2]))}"))
    else:
        out += [(f"state[{n}]", cpu[2][n], tpu[2][n]) for n in cpu[2]]
    return out


def compare(cpu, tpu, dtype):
    """The differences between two _run results: a list of (name, message, max abs diff or None)."""
    rtol, atol = TOL.get(dtype, (1e-5, 1e-6))
    bad = []
    for name, x, y in _pairs(cpu, tpu):
        if x is None:
            if isinstance(y, str):
                bad.append((name, y, None))
            elif y is not None:
                bad.append((name, "None on CPU, a tensor on tpu", None))
            continue
        if y is None:
            bad.append((name, "a tensor on CPU, None on tpu", None))
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            bad.append((name, f"{tuple(y.shape)} {y.dtype} on tpu, {tuple(x.shape)} {x.dtype} on CPU", None))
            continue
        if x.is_floating_point() or x.is_complex():
            ok = torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = torch.equal(x, y)
        if not ok:
            d = (x.to(torch.complex128 if x.is_complex() else torch.float64)
                 - y.to(torch.complex128 if y.is_complex() else torch.float64)).abs().nan_to_num(float("inf"))
            bad.append((name, f"max abs diff {d.max().item():.3g}", d.max().item()))
    return bad


def _weigh_in_float64(build, args, kwargs, cpu, tpu, names):
    """Whether each mismatching tensor is as close to CPU's float64 result as CPU's own result
    in the case's dtype is (4x, plus slack): rounding, not a wrong result."""
    try:
        m64 = build(torch.float64)
        ref = _run(m64, _cast(args, torch.float64), _cast(kwargs, torch.float64), "cpu")
    except Exception:  # noqa: BLE001 -- a module without float64 support: no weighing
        return False
    r = {n: x for n, x, _ in _pairs(ref, ref)}
    c = {n: x for n, x, _ in _pairs(cpu, cpu)}
    t = {n: y for n, _, y in _pairs(cpu, tpu)}
    for n in names:
        if n not in r or r[n] is None or c.get(n) is None or not isinstance(t.get(n), torch.Tensor):
            return False
        e_cpu = (c[n].double() - r[n]).abs().max().item()
        e_tpu = (t[n].double() - r[n]).abs().max().item()
        if not e_tpu <= 4 * e_cpu + 1e-6 * max(1.0, r[n].abs().max().item()):
            return False
    return True


def _cast(tree, dtype):
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.detach().to(dtype).requires_grad_(x.requires_grad)
                    if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tree)


def run_case(mi, dtype, training, mint, mode) -> dict:
    import torchtpu
    from torch.nn.modules.lazy import LazyModuleMixin

    cargs, ckw = mint.constructor_input.args, mint.constructor_input.kwargs
    fargs, fkw = mint.forward_input.args, mint.forward_input.kwargs

    def build(dt):
        torch.manual_seed(0)
        m = mi.module_cls(*cargs, **ckw).to(dt)
        m.train(training)
        return m

    torchtpu.reset_metrics()
    eager = "strict" if mode == "compile" else mode
    try:
        m_cpu = build(dtype)
        m_tpu = copy.deepcopy(m_cpu)
        cpu = _run(m_cpu, fargs, fkw, "cpu")
    except Exception as e:  # noqa: BLE001 -- CPU itself refuses: not a case
        return {"state": "cpu_error", "detail": _first_line(e)}
    try:
        with torchtpu.eager_mode(eager):
            m_tpu.to("tpu")
            if isinstance(m_tpu, LazyModuleMixin):  # sized by CPU's forward: take its values
                m_tpu.load_state_dict(m_cpu.state_dict())
            tpu = _run(m_tpu, fargs, fkw, "tpu", compiled=mode == "compile")
            torch.tpu.synchronize()  # anything still pending raises here, in its own case
    except Exception as e:  # noqa: BLE001
        return {"state": "error", "detail": f"{type(e).__name__}: {_first_line(e)}",
                "fallbacks": _fallbacks()}
    bad = compare(cpu, tpu, dtype)
    res = {"fallbacks": _fallbacks()}
    if not bad:
        return {"state": "passed", **res}
    if dtype != torch.float64 and all(d is not None for _, _, d in bad) and \
            _weigh_in_float64(build, fargs, fkw, cpu, tpu, [n for n, _, _ in bad]):
        return {"state": "rounding", "detail": "; ".join(f"{n}: {msg}" for n, msg, _ in bad[:3]), **res}
    return {"state": "mismatch", "detail": "; ".join(f"{n}: {msg}" for n, msg, _ in bad[:4]), **res}


def run_error_case(mi, dtype, err, mode) -> dict:
    """An error input: construction or forward must raise CPU's exception class and message."""
    import re

    import torchtpu
    from torch.testing._internal.common_modules import ModuleErrorEnum

    mint = err.module_error_input
    cargs, ckw = mint.constructor_input.args, mint.constructor_input.kwargs
    fwd = mint.forward_input  # None for a construction error
    fargs, fkw = (fwd.args, fwd.kwargs) if fwd is not None else ((), {})

    def attempt(dev):
        try:
            m = mi.module_cls(*cargs, **ckw)
            if err.error_on == ModuleErrorEnum.CONSTRUCTION_ERROR:
                return None
            m = m.to(dtype).to(dev)
            m(*_on(dev, fargs), **_on(dev, fkw))
            if dev == "tpu":  # a device-side check (an index out of range) raises at the sync
                torch.tpu.synchronize()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    cpu = attempt("cpu")
    if cpu is None:
        return {"state": "cpu_error", "detail": "CPU does not raise"}
    with torchtpu.eager_mode("strict" if mode == "compile" else mode):
        tpu = attempt("tpu")
    if tpu is None:
        return {"state": "mismatch", "detail": f"no error on tpu; CPU raises {type(cpu).__name__}: {_first_line(cpu)}"}
    if type(tpu) is not type(cpu) or not re.search(err.error_regex, str(tpu)):
        return {"state": "mismatch", "detail": f"tpu raises {type(tpu).__name__}: {_first_line(tpu)}; "
                                               f"CPU {type(cpu).__name__}: {_first_line(cpu)}"}
    return {"state": "passed"}


def _first_line(e) -> str:
    s = str(e).strip().splitlines()
    return s[0][:240] if s else type(e).__name__


def _fallbacks() -> list[str]:
    import torchtpu
    return sorted(torchtpu.metrics().get("fallback_ops", {}))


def cases(names, dtypes, limit):
    """(module info, dtype, training, index, ModuleInput or ErrorModuleInput, is_error)."""
    from torch.testing._internal.common_modules import module_db

    for mi in module_db:
        if names and mi.name not in names:
            continue
        for dtype in dtypes:  # beyond the info's own dtypes too: CPU decides (cpu_error: no case)
            for training in ((True, False) if mi.train_and_eval_differ else (True,)):
                try:
                    inputs = mi.module_inputs_func(mi, device="cpu", dtype=dtype, requires_grad=True,
                                                   training=training)
                except Exception:  # noqa: BLE001 -- the info cannot make inputs for this dtype
                    continue
                for i, mint in enumerate(inputs[:limit]):
                    if mint.forward_input is not None:
                        yield mi, dtype, training, i, mint, False
            if mi.module_error_inputs_func is not None:
                errs = mi.module_error_inputs_func(mi, device="cpu", dtype=dtype, requires_grad=False,
                                                   training=True)
                for i, err in enumerate(errs):
                    yield mi, dtype, True, i, err, True


def _key(mi, dtype, training, i, mint, is_error, mode) -> str:
    desc = getattr(mint.module_error_input if is_error else mint, "desc", "") or ""
    kind = "error" if is_error else ("train" if training else "eval")
    return f"{mi.name}|{str(dtype).replace('torch.', '')}|{mode}|{kind}|{i}:{desc}"


def summarize(results: dict) -> dict:
    per = {}
    for key, r in results.items():
        name, dtype, mode, kind, _ = key.split("|", 4)
        row = per.setdefault((name, mode), dict(cases=0, passed=0, rounding=0, failed=0, errors_checked=0,
                                                 fallbacks=0))
        if r["state"] == "cpu_error":
            continue
        row["cases"] += 1
        row["errors_checked"] += kind == "error"
        row["passed"] += r["state"] == "passed"
        row["rounding"] += r["state"] == "rounding"
        row["failed"] += r["state"] in ("mismatch", "error")
        row["fallbacks"] += bool(r.get("fallbacks"))
    return per


def markdown(results: dict, meta: dict) -> str:
    per = summarize(results)
    modes = sorted({m for _, m in per}, key=MODES.index)
    tot = {m: [0, 0, 0, 0] for m in modes}
    for (_, m), row in per.items():
        t = tot[m]
        t[0] += row["cases"]; t[1] += row["passed"]; t[2] += row["rounding"]; t[3] += row["failed"]  # noqa: E702
    lines = [
        "# PyTorch's ModuleInfo inputs on tpu",
        "",
        "Written by `python -m torchtpu.validate modules` (torchtpu/validate/modules.py): every module of",
        "`torch.testing._internal.common_modules.module_db` (the inputs of PyTorch's own device-generic",
        "`test_modules.py`), each dtype it supports on CPU, train and eval where they differ, each input;",
        "forward, the gradient of every input and parameter, and the state dict afterwards, against CPU;",
        "and each error input, which must raise CPU's exception and message. *rounding*: a difference",
        "no larger than 4x CPU's own distance (in the same dtype) from its float64 result.",
        "",
        f"Run: {meta['when']}, dtypes {', '.join(meta['dtypes'])}, modes {', '.join(modes)}"
        + (f", at most {meta['limit']} inputs per module, dtype and flag" if meta.get("limit") else "")
        + "".join(f"; {n}" for n in meta.get("notes", ())) + ".",
        "",
        "| mode | cases | passed | rounding | failed | % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in modes:
        c, p, r, f = tot[m]
        lines.append(f"| {m} | {c} | {p} | {r} | {f} | {100 * (p + r) / max(c, 1):.2f} |")
    lines += ["", "## Per module", "", "| module | " + " | ".join(f"{m} (pass/cases)" for m in modes) + " |",
              "| --- |" + " ---: |" * len(modes)]
    for name in sorted({n for n, _ in per}):
        cells = []
        for m in modes:
            row = per.get((name, m))
            cells.append("" if row is None else f"{row['passed'] + row['rounding']}/{row['cases']}"
                         + (f" ({row['fallbacks']} with fallbacks)" if row["fallbacks"] else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    bad = [(k, r) for k, r in results.items() if r["state"] in ("mismatch", "error")]
    lines += ["", "## Failures", ""]
    lines += [f"- `{k}`: {r['state']}: {r.get('detail', '')}" for k, r in sorted(bad)] or ["None."]
    fell = [(k, r["fallbacks"]) for k, r in results.items() if r.get("fallbacks")]
    lines += ["", "## Cases with ops run on the CPU", ""]
    lines += [f"- `{k}`: {', '.join(f)}" for k, f in sorted(fell)] or ["None."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.validate modules", description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="*", default=None, help="ModuleInfo names (nn.Conv2d ...); default all")
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16", "float64"])
    ap.add_argument("--modes", nargs="*", default=["strict", "defer_and_fuse"], choices=MODES)
    ap.add_argument("--limit", type=int, default=0, help="at most N inputs per module, dtype and flag")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--merge", nargs="*", default=None, metavar="JSON",
                    help="run nothing: write --json/--markdown from these runs' JSON (one per mode, say)")
    args = ap.parse_args(argv)
    if args.merge:
        return _merge(args)

    import torchtpu  # noqa: F401 -- registers the device

    warnings.simplefilter("ignore")
    dtypes = [getattr(torch, d) for d in args.dtypes]
    todo = list(cases(set(args.modules or ()), dtypes, args.limit or None))
    prog = Progress(len(todo) * len(args.modes), "modules ")
    results = {}
    for mode in args.modes:
        for mi, dtype, training, i, mint, is_error in todo:
            key = _key(mi, dtype, training, i, mint, is_error, mode)
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    r = (run_error_case(mi, dtype, mint, mode) if is_error
                         else run_case(mi, dtype, training, mint, mode))
            except Exception as e:  # noqa: BLE001 -- the harness's own failure: recorded, the sweep goes on
                r = {"state": "error", "detail": f"harness: {type(e).__name__}: {_first_line(e)}"}
            results[key] = r
            prog.step(key, r["state"])
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dtypes": args.dtypes,
            "modes": args.modes, "limit": args.limit, "torch": torch.__version__}
    per = summarize(results)
    print(f"\n{'mode':16} {'cases':>6} {'passed':>6} {'round':>6} {'failed':>6} {'fallbk':>6}")
    for mode in args.modes:
        rows = [r for (_, m), r in per.items() if m == mode]
        print(f"{mode:16} {sum(r['cases'] for r in rows):6} {sum(r['passed'] for r in rows):6} "
              f"{sum(r['rounding'] for r in rows):6} {sum(r['failed'] for r in rows):6} "
              f"{sum(r['fallbacks'] for r in rows):6}")
    for k, r in sorted(results.items()):
        if r["state"] in ("mismatch", "error"):
            print(f"  FAIL {k}: {r.get('detail', '')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, meta))
    return 0


def _merge(args) -> int:
    results, metas = {}, []
    for p in args.merge:
        run = json.loads(Path(p).read_text())
        results.update(run["results"])
        metas.append(run["meta"])
    meta = {"when": ", ".join(sorted({m["when"] for m in metas})),
            "dtypes": sorted({d for m in metas for d in m["dtypes"]}),
            "modes": [m for m in MODES if any(m in x["modes"] for x in metas)], "limit": 0,
            "notes": [f"{', '.join(m['modes'])}: at most {m['limit']} inputs per module, dtype and flag"
                      for m in metas if m.get("limit")],
            "torch": metas[0].get("torch")}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
