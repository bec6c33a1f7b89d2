"""PyTorch's OptimizerInfo database (the inputs of its test_optim.py) on tpu vs CPU.

    python -m torchtpu.validate optims [--optims Adam SGD ...]
                                      [--dtypes float32 bfloat16 float64 complex64]
                                      [--modes strict defer_and_fuse] [--steps 3]
                                      [--json PATH] [--markdown [PATH]]

`torch.testing._internal.common_optimizers.optim_db` holds, for each of PyTorch's 15
optimizers, the constructor arguments its device-generic tests use (`optim_inputs_func`: lr,
weight_decay, maximize, amsgrad, tensor lr and betas, ...), the implementations it has
(`supported_impls`: foreach, fused), its LR schedulers (`scheduler_inputs`) and the arguments
that must raise (`optim_error_inputs_func`). For every optimizer, input, implementation
(the for-loop one, `foreach=True` where "foreach" is supported, `fused=True` where "fused"
is), dtype (complex64 only where `supports_complex`) and eager mode, the same parameters
(a weight (10, 5) and a bias (5,); Muon, which takes only 2-D parameters, just the weight)
are built on CPU and on tpu from a seeded generator and stepped `--steps` times with the same
gradients (drawn on CPU, moved to tpu). An optimizer whose `step` needs a closure (LBFGS)
gets one that recomputes a loss (an ill-conditioned quadratic of the parameters, see
closure_loss) on its own device and calls backward: the same function on both devices; it
takes one step (up to 20 iterations), since its float32 iterates after that are chaotic. Tensor-valued arguments (a tensor lr, tensor
betas) are cloned per device and, as test_optim.py passes them, stay CPU tensors on both.
Compared afterwards: the parameters, every entry of `state_dict()["state"]` (tensors moved
to CPU; a parameter-shaped state tensor, and with capturable or fused every state tensor,
must live on tpu) and the param groups' numeric hyperparameters (lr after a scheduler).

Inputs PyTorch gives only for CUDA (capturable=True, tensor lr/betas with capturable) run
too, since "tpu" is a capturable device as CUDA is: tpu runs them as given, the CPU oracle
(which refuses capturable) with capturable=False, as the for-loop implementation when CPU
refuses the input's own implementation without capturable (tensor betas with foreach).

Tolerances (`torch.testing.assert_close`-like, |tpu - cpu| <= atol + rtol * |cpu|, NaNs
equal): float32, float64 and complex64 rtol 1e-5 atol 1e-6, relaxed to rtol 1e-4 atol 1e-5
when needed (such a case passes and is reported "relaxed"); bfloat16 rtol 1.6e-2 atol 1e-2.
Each tensor is judged by its own dtype (a float32 `step` of a bfloat16 run by float32's).
A difference beyond them is weighed against CPU's run of the case in float64 (complex128) from
the same values: when tpu's value is no further from it than 4x CPU's own (plus the relaxed or
bfloat16 tolerance), it is rounding: the case passes, reported "weighed" (see weigh()).

One scheduler case per entry of `oi.scheduler_inputs` (a list of LRScheduler constructors:
StepLR, ReduceLROnPlateau, LinearLR, ...), on the "default" input with the for-loop
implementation, max(--steps, 5) steps, schedulers stepped after each optimizer step
(ReduceLROnPlateau with a constant metric).

Error inputs (`optim_error_inputs_func`, float32, each mode; the CPU ones and, with the
arguments built on CPU and moved, the CUDA ones): each runs on CPU and on tpu; one CPU does
not raise (or warn) as expected is skipped; tpu passes when it raises (or warns) the expected
class with a message matching the expected pattern.

Outcomes: "passed" (values match, or an error input raised as on CPU), "as_cpu" (CPU raises
for the case, e.g. fused with complex64, and tpu raises the same exception class: passed, as
CPU), "failed" (tpu raises where CPU works, a value differs: the largest difference and which
tensor, CPU raises and tpu does not or raises another class, an error input not raised) and
"skipped" (SparseAdam: sparse gradients, no tpu sparse tensors). Ops that fell back to the
CPU in a case (`torchtpu.metrics()["fallback_ops"]`, reset before each case) are listed per
case: a defect even when the values match. Cases = passed + as_cpu + failed.

Exit status 0 unless the sweep itself crashes. `--markdown` without a path writes
docs/pytorch_optims.md.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import Parameter

from .progress import Progress
from .timeout import time_limit

DTYPES = ("float32", "bfloat16", "float64", "complex64")
MODES = ("strict", "defer_and_fuse")
TIGHT = (1e-5, 1e-6)
RELAXED = (1e-4, 1e-5)
BF16 = (1.6e-2, 1e-2)
DEFAULT_MARKDOWN = "docs/pytorch_optims.md"
CASE_TIMEOUT = 180
SKIP = {"SparseAdam": "sparse gradients (no tpu sparse tensors)"}
TWO_D_ONLY = {"Muon"}
CLIQUEY = ("foreach", "fused")


@dataclass
class Case:
    oi: object
    kind: str  # "run", "scheduler", "error"
    desc: str
    kwargs: dict = field(default_factory=dict)
    impl: str = "forloop"
    dtype: torch.dtype = torch.float32
    config: str = "cpu"  # "cuda": an input PyTorch gives only for CUDA
    sched: int | None = None
    error: tuple | None = None  # (cpu ErrorOptimizerInput, tpu ErrorOptimizerInput)

    @property
    def name(self) -> str:
        return self.oi.name


def _dname(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0][:300] if s else ''}"


def _kw_repr(kw: dict) -> str:
    def r(v):
        if isinstance(v, torch.Tensor):
            return f"tensor({v.tolist()})"
        if isinstance(v, tuple):
            return "(" + ", ".join(r(x) for x in v) + ")"
        return repr(v)
    return "{" + ", ".join(f"{k}={r(v)}" for k, v in kw.items()) + "}"


# ------------------------------------------------------------------ case lists

@contextlib.contextmanager
def _as_cuda():
    """optim_db's input functions with every device taken for CUDA (its CUDA-only inputs)."""
    from torch.testing._internal import common_optimizers as co
    orig = co._get_device_type
    co._get_device_type = lambda device: "cuda"
    try:
        yield
    finally:
        co._get_device_type = orig


def optim_inputs(oi, dtype):
    """[(OptimizerInput, "cpu" | "cuda")]: the CPU inputs, then the CUDA-only ones."""
    cpu = list(oi.optim_inputs_func(device="cpu", dtype=dtype))
    seen = {i.desc for i in cpu}
    with _as_cuda():
        cuda = [i for i in oi.optim_inputs_func(device="cpu", dtype=dtype) if i.desc not in seen]
    return [(i, "cpu") for i in cpu] + [(i, "cuda") for i in cuda]


def error_inputs(oi, dtype):
    """The error inputs of `oi` built on CPU (CPU's own, then the CUDA-only ones)."""
    if oi.optim_error_inputs_func is None:
        return []
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = list(oi.optim_error_inputs_func(device="cpu", dtype=dtype))
        seen = {(e.optimizer_error_input.desc, e.error_regex) for e in cpu}
        with _as_cuda():
            cuda = [e for e in oi.optim_error_inputs_func(device="cpu", dtype=dtype)
                    if (e.optimizer_error_input.desc, e.error_regex) not in seen]
    return cpu + cuda


def impls(oi) -> list[str]:
    out = ["forloop"]
    if "foreach" in oi.supported_impls:
        out.append("foreach")
    if "fused" in oi.supported_impls and "cpu" in oi.supports_fused_on:
        out.append("fused")
    return out


def impl_kwargs(oi, impl: str) -> dict:
    return {f: f == impl for f in CLIQUEY if f in oi.supported_impls}


def _scheduler_names(oi, fns) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = oi.optim_cls([Parameter(torch.zeros(2, 2))])
        return "+".join(type(f(opt)).__name__ for f in fns)


def cases(names, dtypes) -> tuple[list[Case], list[dict]]:
    from torch.testing._internal.common_optimizers import optim_db

    out, skipped = [], []
    for oi in optim_db:
        if names and oi.name not in names:
            continue
        if oi.name in SKIP:
            skipped.append({"optim": oi.name, "reason": SKIP[oi.name]})
            continue
        for dtype in dtypes:
            if dtype.is_complex and not oi.supports_complex:
                continue
            for inp, cfg in optim_inputs(oi, dtype):
                for impl in impls(oi):
                    out.append(Case(oi, "run", inp.desc, dict(inp.kwargs), impl, dtype, cfg))
            default = next((i for i, c in optim_inputs(oi, dtype) if i.desc == "default"), None)
            if default is not None:
                for si, fns in enumerate(oi.scheduler_inputs):
                    out.append(Case(oi, "scheduler", f"default + {_scheduler_names(oi, fns)}",
                                    dict(default.kwargs), "forloop", dtype, "cpu", sched=si))
        errs_cpu = error_inputs(oi, torch.float32)
        errs_tpu = error_inputs(oi, torch.float32)
        for a, b in zip(errs_cpu, errs_tpu):
            out.append(Case(oi, "error", a.optimizer_error_input.desc, dict(a.optimizer_error_input.kwargs),
                            "-", torch.float32, error=(a, b)))
    return out, skipped


# ------------------------------------------------------------------ running

def case_steps(case: Case, steps: int) -> int:
    """Optimizer steps a case takes: `steps`, at least 5 with a scheduler; one for an
    optimizer whose step is a closure-driven loop (LBFGS: up to 20 iterations a step), whose
    float32 iterates after that are chaotic: CPU's own float32 and float64 runs part ways."""
    if case.oi.step_requires_closure:
        return 1
    return max(steps, 5) if case.kind == "scheduler" else steps


def _draw(shape, dtype, g):
    wide = torch.complex128 if dtype.is_complex else torch.float64
    return torch.randn(shape, generator=g, dtype=wide).to(dtype)


def closure_loss(params, targets, weights):
    """The loss a closure recomputes: sum w * |p - t|^2 over the parameters, the weights spread
    log-uniformly over 1e-2..1e2. So ill-conditioned a quadratic is neither solved within
    LBFGS's first steps (its state would then be rounding noise around an exact minimum, its
    curvature pairs 1/y.s of vanishing y.s) nor chaotic as a non-convex function is."""
    return sum((w * (p - t).abs() ** 2).sum() for p, t, w in zip(params, targets, weights))


def run_optimizer(oi, kwargs, dev, dtype, steps, sched=None, widen=False) -> dict:
    """Step `oi` on `dev`: {name: value} of parameters, optimizer state and param-group
    hyperparameters, tensors on CPU, plus "__devices__": {name: device type on `dev`}.
    `widen`: the same values (drawn in `dtype`) stepped in float64 / complex128."""
    shapes = [("weight", (10, 5))] + ([] if oi.name in TWO_D_ONLY else [("bias", (5,))])
    g = torch.Generator().manual_seed(0)
    wide = torch.complex128 if dtype.is_complex else torch.float64

    def draw(shape):
        t = _draw(shape, dtype, g)
        return t.to(wide) if widen else t
    init = [draw(s) for _, s in shapes]
    targets = [draw(s) for _, s in shapes]
    grads = [[draw(s) for _, s in shapes] for _ in range(steps)]
    weights = [(10 ** (4 * torch.rand(s, generator=g, dtype=torch.float64) - 2)).to(dtype.to_real())
               for _, s in shapes]
    weights = [w.double() for w in weights] if widen else weights
    params = [Parameter(t.to(dev)) for t in init]
    tgt = [t.to(dev) for t in targets]
    wts = [w.to(dev) for w in weights]
    opt = oi.optim_cls(params, **copy.deepcopy(kwargs))
    schedulers = [f(opt) for f in oi.scheduler_inputs[sched]] if sched is not None else []

    def closure():
        opt.zero_grad()
        loss = closure_loss(params, tgt, wts)
        loss.backward()
        return loss

    for s in range(steps):
        if oi.step_requires_closure:
            opt.step(closure)
        else:
            for p, gr in zip(params, grads[s]):
                p.grad = gr.to(dev)
            opt.step()
        for sch in schedulers:
            if isinstance(sch, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sch.step(1.0)
            else:
                sch.step()

    out, devices = {}, {}
    names = [n for n, _ in shapes]
    for n, p in zip(names, params):
        out[f"param:{n}"] = p.detach().cpu()
    sd = opt.state_dict()
    for idx, st in sd["state"].items():
        for k, v in st.items():
            key = f"state[{names[idx]}].{k}"
            if isinstance(v, (list, tuple)):  # LBFGS keeps lists of tensors (old_dirs, ro, al)
                out[f"{key}.len"] = len(v)
                items = [(f"{key}[{j}]", x) for j, x in enumerate(v)]
            else:
                items = [(key, v)]
            for kk, x in items:
                if isinstance(x, torch.Tensor):
                    devices[kk] = x.device.type
                    x = x.detach().cpu()
                out[kk] = x
    for gi, grp in enumerate(sd["param_groups"]):
        for k, v in grp.items():
            if k == "params" or isinstance(v, (bool, str)) or v is None:
                continue
            flat = v if isinstance(v, (tuple, list)) else (v,)
            for j, x in enumerate(flat):
                if isinstance(x, torch.Tensor) or (isinstance(x, (int, float)) and not isinstance(x, bool)):
                    key = f"group{gi}.{k}" + (f"[{j}]" if len(flat) > 1 else "")
                    out[key] = x.detach().cpu() if isinstance(x, torch.Tensor) else x
    out["__devices__"] = devices
    return out


def _tensor_diff(x: torch.Tensor, y: torch.Tensor, tol) -> tuple[bool, float]:
    """(within tol, largest absolute difference) of tpu value y against CPU value x."""
    wide = torch.complex128 if x.is_complex() else torch.float64
    a, b = x.to(wide), y.to(wide)
    rtol, atol = tol
    d = (a - b).abs()
    nan_a = a.isnan() if not a.is_complex() else (a.real.isnan() | a.imag.isnan())
    nan_b = b.isnan() if not b.is_complex() else (b.real.isnan() | b.imag.isnan())
    same = (a == b) | (nan_a & nan_b)
    ok = same | (d <= atol + rtol * a.abs())
    worst = d.masked_fill(same, 0).nan_to_num(float("inf"))
    return bool(ok.all()), (worst.max().item() if worst.numel() else 0.0)


def compare(cpu: dict, tpu: dict, strict_device: bool = False, dtype=torch.float32) -> tuple[list, str]:
    """Differences between two run_optimizer results: ([(name, message, max abs diff)], tol),
    tol "tight", "relaxed" or "bf16". `strict_device`: every state tensor must live on tpu
    (capturable, fused); otherwise only parameter-shaped ones. Python floats (a loss LBFGS
    keeps) are judged by the case's `dtype`, equal within rounding of Python's own floats
    (a learning rate) otherwise."""
    bad, used = [], "tight"
    for name in sorted(set(cpu) | set(tpu)):
        if name == "__devices__":
            continue
        if name not in tpu or name not in cpu:
            bad.append((name, "missing on tpu" if name not in tpu else "only on tpu", None))
            continue
        x, y = cpu[name], tpu[name]
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            bad.append((name, f"{type(y).__name__} on tpu, {type(x).__name__} on CPU", None))
            continue
        if not isinstance(x, torch.Tensor):
            if isinstance(x, float) or isinstance(y, float):
                if not name.startswith("state"):
                    ok = math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                else:
                    levels = [BF16] if dtype in (torch.bfloat16, torch.float16) else [TIGHT, RELAXED]
                    hit = next((li for li, (rt, at) in enumerate(levels) if abs(x - y) <= at + rt * abs(x)), None)
                    ok = hit is not None
                    if hit == 1:
                        used = "relaxed"
                if not ok:
                    bad.append((name, f"{y!r} on tpu, {x!r} on CPU", abs(x - y)))
            elif x != y:
                bad.append((name, f"{y!r} on tpu, {x!r} on CPU", None))
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            bad.append((name, f"{tuple(y.shape)} {_dname(y.dtype)} on tpu, {tuple(x.shape)} {_dname(x.dtype)} on CPU", None))
            continue
        if not (x.is_floating_point() or x.is_complex()):
            if not torch.equal(x, y):
                bad.append((name, "integer values differ", None))
            continue
        levels = [BF16] if x.dtype in (torch.bfloat16, torch.float16) else [TIGHT, RELAXED]
        for li, tol in enumerate(levels):
            ok, worst = _tensor_diff(x, y, tol)
            if ok:
                if li == 1:
                    used = "relaxed"
                break
        else:
            rtol, atol = levels[-1]
            bad.append((name, f"max abs diff {worst:.3g} (rtol {rtol:g}, atol {atol:g})", worst))
        if x.dtype == torch.bfloat16 and used == "tight":
            used = "bf16"
    devs = tpu.get("__devices__", {})
    for name, dev in sorted(devs.items()):
        x = cpu.get(name)
        want_tpu = strict_device or (isinstance(x, torch.Tensor) and x.numel() > 1)
        if want_tpu and dev != "tpu":
            bad.append((name, f"state tensor on {dev}, expected on tpu", None))
    return bad, used


def _sync() -> None:
    try:
        torch.tpu.synchronize()
    except Exception:  # noqa: BLE001 -- a poisoned queue surfaces in the next case's own read
        pass


def _attempt(fn):
    """(result, None) or (None, exception)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with time_limit(CASE_TIMEOUT):
                return fn(), None
    except Exception as e:  # noqa: BLE001 -- any exception is the measured outcome
        return None, e


def _cpu_oracle(case: Case, steps: int) -> dict:
    """The case on CPU: {"res", "err", "oracle" (what ran), "kw" (its arguments)}."""
    oi = case.oi
    kw = {**case.kwargs, **impl_kwargs(oi, case.impl)}

    def run(k):
        return _attempt(lambda: run_optimizer(oi, k, "cpu", case.dtype, steps, case.sched))
    if case.config == "cuda" and kw.get("capturable"):
        kw["capturable"] = False
        res, err = run(kw)
        if err is None or case.impl == "forloop" or "capturable" not in str(err):
            return {"res": res, "err": err, "oracle": f"CPU, capturable=False, {case.impl}", "kw": kw}
        kw2 = {**kw, **impl_kwargs(oi, "forloop")}
        res2, err2 = run(kw2)
        if err2 is None:
            return {"res": res2, "err": None, "oracle": "CPU, capturable=False, forloop", "kw": kw2}
        return {"res": res, "err": err, "oracle": f"CPU, capturable=False, {case.impl}", "kw": kw}
    res, err = run(kw)
    return {"res": res, "err": err, "oracle": "CPU", "kw": kw}


def _reference(case: Case, steps: int, cpu: dict):
    """CPU's run of the case in float64 (complex128) from the same values, once per case."""
    if "ref" not in cpu:
        res, err = _attempt(lambda: run_optimizer(case.oi, cpu["kw"], "cpu", case.dtype, steps, case.sched,
                                                  widen=True))
        cpu["ref"] = res
    return cpu["ref"]


def weigh(bad: list, cpu: dict, tpu: dict, ref: dict, notes: list | None = None) -> list:
    """The differences of `bad` (from compare) that float rounding does not explain. A
    numeric one is explained when tpu's value is no further from the float64 run `ref` than
    4x CPU's own largest distance from it (over the tensor, or over all entries of a state
    list such as LBFGS's ro, whose rounding errors are heavy-tailed), plus the relaxed or
    bfloat16 tolerance; one without a measure (a list length, an iteration count, a missing
    entry) when CPU's own value differs from float64's there too. `notes` collects what was
    explained, with both distances from float64."""
    ref_c = {}
    for k, v in ref.items():
        x = cpu.get(k)
        ref_c[k] = v.to(x.dtype) if isinstance(v, torch.Tensor) and isinstance(x, torch.Tensor) else v
    cpu_off = {n for n, _, _ in compare(ref_c, cpu)[0]}

    def cpu_err(name):
        x, r = cpu.get(name), ref.get(name)
        if not (isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor) and x.shape == r.shape):
            return 0.0
        wide = torch.complex128 if x.is_complex() else torch.float64
        return (x.to(wide) - r.to(wide)).abs().nan_to_num(0.0).max().item() if x.numel() else 0.0
    group_err = {}
    for name in cpu:
        g = re.sub(r"\[\d+\]$", "", name)
        group_err[g] = max(group_err.get(g, 0.0), cpu_err(name))
    left = []
    for item in bad:
        name = item[0]
        x, y, r = cpu.get(name), tpu.get(name), ref.get(name)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and isinstance(r, torch.Tensor) \
                and x.shape == y.shape == r.shape and (x.is_floating_point() or x.is_complex()) \
                and x.dtype == y.dtype:
            rtol, atol = BF16 if x.dtype in (torch.bfloat16, torch.float16) else RELAXED
            wide = torch.complex128 if x.is_complex() else torch.float64
            rr = r.to(wide)
            e_cpu = group_err.get(re.sub(r"\[\d+\]$", "", name), 0.0)
            d = (y.to(wide) - rr).abs()
            if bool((d <= 4 * e_cpu + atol + rtol * rr.abs()).all()):
                if notes is not None:
                    notes.append(f"{name} (from float64: tpu {d.max().item():.3g}, CPU {cpu_err(name):.3g})")
                continue
            left.append((name, f"{item[1]}; from float64: tpu {d.nan_to_num(float('inf')).max().item():.3g}, "
                               f"CPU {e_cpu:.3g}", item[2]))
            continue
        if isinstance(x, float) and isinstance(y, float) and isinstance(r, float):
            if abs(y - r) <= 4 * abs(x - r) + RELAXED[1] + RELAXED[0] * abs(r):
                if notes is not None:
                    notes.append(f"{name} (from float64: tpu {abs(y - r):.3g}, CPU {abs(x - r):.3g})")
                continue
        elif name in cpu_off:
            if notes is not None:
                notes.append(f"{name} ({item[1]}; CPU differs from float64 there too)")
            continue
        left.append(item)
    return left


def run_case(case: Case, mode: str, steps: int, cpu: dict) -> dict:
    """One case on tpu in `mode` against its CPU result `cpu` (from _cpu_oracle)."""
    import torchtpu

    oi = case.oi
    kw = {**case.kwargs, **impl_kwargs(oi, case.impl)}
    rec = {"optim": oi.name, "kind": case.kind, "desc": case.desc, "config": case.config,
           "impl": case.impl, "dtype": _dname(case.dtype), "mode": mode, "kwargs": _kw_repr(kw)}
    cpu_res, cpu_err = cpu["res"], cpu["err"]
    rec["oracle"] = cpu["oracle"]
    torchtpu.reset_metrics()
    t0 = time.perf_counter()

    def go():
        with torchtpu.eager_mode(mode):
            r = run_optimizer(oi, kw, "tpu", case.dtype, steps, case.sched)
            torch.tpu.synchronize()
            return r
    res, err = _attempt(go)
    if err is not None:
        _sync()
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    rec["fallbacks"] = dict(torchtpu.metrics().get("fallback_ops", {}))
    if cpu_err is not None:
        rec["cpu_error"] = _first_line(cpu_err)
        if err is None:
            rec.update(status="failed", cause=f"CPU raises {_first_line(cpu_err)}; tpu runs without error")
        elif isinstance(err, type(cpu_err)) or isinstance(cpu_err, type(err)):
            rec.update(status="as_cpu", cause=f"both raise {type(cpu_err).__name__}", tpu_error=_first_line(err))
        else:
            rec.update(status="failed", tpu_error=_first_line(err),
                       cause=f"CPU raises {_first_line(cpu_err)}; tpu raises {_first_line(err)}")
        return rec
    if err is not None:
        rec.update(status="failed", tpu_error=_first_line(err), cause=f"tpu raises {_first_line(err)} (CPU runs)")
        return rec
    strict_dev = bool(kw.get("capturable")) or bool(kw.get("fused"))
    bad, tol = compare(cpu_res, res, strict_device=strict_dev, dtype=case.dtype)
    rec["tol"] = tol
    if bad:
        ref = _reference(case, steps, cpu)
        if ref is not None:
            notes = []
            left = weigh(bad, cpu_res, res, ref, notes)
            if not left:
                rec.update(tol="weighed", weighed=notes)
            bad = left
    if bad:
        bad.sort(key=lambda b: -(b[2] if b[2] is not None and not math.isnan(b[2]) else math.inf))
        rec["differences"] = [{"tensor": n, "message": m, "max_abs": d} for n, m, d in bad]
        worst = bad[0]
        more = f" (and {len(bad) - 1} more: {', '.join(b[0] for b in bad[1:6])})" if len(bad) > 1 else ""
        rec.update(status="failed", cause=f"mismatch: {worst[0]} {worst[1]}{more}")
    else:
        rec["status"] = "passed"
    return rec


def _convert_params(obj, memo):
    """The parameters of an error input with every tensor moved to tpu (identity kept)."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            new = obj.detach().to("tpu")
            new = Parameter(new, requires_grad=obj.requires_grad) if isinstance(obj, Parameter) \
                else new.requires_grad_(obj.requires_grad)
            if obj.grad is not None:
                new.grad = obj.grad.to("tpu")
            memo[id(obj)] = new
        return memo[id(obj)]
    if isinstance(obj, list):
        return [_convert_params(x, memo) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_convert_params(x, memo) for x in obj)
    if isinstance(obj, dict):
        return {k: _convert_params(v, memo) for k, v in obj.items()}
    return obj


def _error_outcome(oi, ei, params):
    """(raised the expected class, its message matches, description)."""
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum

    oin = ei.optimizer_error_input
    err = None
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        try:
            with time_limit(CASE_TIMEOUT):
                opt = oi.optim_cls(params, **oin.kwargs)
                if ei.error_on == OptimizerErrorEnum.STEP_ERROR:
                    opt.step()
                if any(isinstance(t, torch.Tensor) and t.device.type == "tpu"
                       for t in torch.utils._pytree.tree_leaves(params)):
                    torch.tpu.synchronize()
        except Exception as e:  # noqa: BLE001 -- the measured outcome
            err = e
    if issubclass(ei.error_type, Warning):
        hits = [w for w in ws if issubclass(w.category, ei.error_type)]
        matched = any(re.search(ei.error_regex, str(w.message)) for w in hits)
        desc = (f"warns {hits[0].category.__name__}: {str(hits[0].message).splitlines()[0][:200]}" if hits
                else "no warning" + (f" (raises {_first_line(err)})" if err is not None else ""))
        return bool(hits), matched, desc
    if err is None:
        return False, False, "no error"
    return isinstance(err, ei.error_type), re.search(ei.error_regex, str(err)) is not None, f"raises {_first_line(err)}"


def run_error_case(case: Case, mode: str) -> dict:
    import torchtpu

    oi = case.oi
    ei_cpu, ei_tpu = case.error
    rec = {"optim": oi.name, "kind": "error", "desc": case.desc, "config": "cpu", "impl": "-",
           "dtype": "float32", "mode": mode, "kwargs": _kw_repr(case.kwargs),
           "expected": f"{ei_cpu.error_type.__name__} matching {ei_cpu.error_regex!r}"}
    c_type, c_match, c_desc = _error_outcome(oi, ei_cpu, ei_cpu.optimizer_error_input.params)
    rec["cpu"] = c_desc
    if not c_type:
        rec.update(status="skipped", cause=f"CPU does not raise the expected error: {c_desc}")
        return rec
    torchtpu.reset_metrics()
    t0 = time.perf_counter()
    with torchtpu.eager_mode(mode):
        try:
            params = _convert_params(ei_tpu.optimizer_error_input.params, {})
        except Exception as e:  # noqa: BLE001
            rec.update(status="failed", cause=f"moving the input's parameters to tpu raises {_first_line(e)}",
                       fallbacks={})
            return rec
        t_type, t_match, t_desc = _error_outcome(oi, ei_tpu, params)
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    rec["fallbacks"] = dict(torchtpu.metrics().get("fallback_ops", {}))
    rec["tpu"] = t_desc
    if t_type and (t_match or not c_match):
        rec["status"] = "passed"
    else:
        rec.update(status="failed", cause=f"expected {rec['expected']} (CPU {c_desc}); tpu {t_desc}")
    return rec


# ------------------------------------------------------------------ reports

COLUMNS = ("cases", "passed", "failed", "as_cpu", "relaxed", "weighed", "fallbacks")


def summarize(records: list[dict], by_mode: bool) -> dict:
    """Counts per optimizer (and mode): cases = passed + as_cpu + failed; relaxed and weighed
    are passed cases that needed the relaxed tolerance or the float64 weighing; fallbacks are
    cases in which an op fell back to the CPU."""
    out = {}
    for r in records:
        if r["status"] == "skipped":
            continue
        k = (r["optim"], r["mode"]) if by_mode else r["optim"]
        s = out.setdefault(k, dict.fromkeys(COLUMNS, 0))
        s["cases"] += 1
        s[r["status"]] += 1
        if r["status"] == "passed":
            s["relaxed"] += r.get("tol") == "relaxed"
            s["weighed"] += r.get("tol") == "weighed"
        s["fallbacks"] += bool(r.get("fallbacks"))
    return out


def _key(r: dict) -> str:
    cfg = " [cuda input]" if r.get("config") == "cuda" else ""
    return f"{r['optim']} | {r['kind']}: {r['desc']}{cfg} | {r['impl']} | {r['dtype']} | {r['mode']}"


def summary_text(records: list[dict]) -> str:
    per = summarize(records, by_mode=False)
    heads = ("cases", "passed", "failed", "as-CPU", "relaxed", "weighed", "fallbk")
    lines = [f"{'optimizer':12}" + "".join(f" {h:>8}" for h in heads)]
    tot = dict.fromkeys(COLUMNS, 0)
    for name, s in per.items():
        lines.append(f"{name:12}" + "".join(f" {s[c]:8}" for c in COLUMNS))
        for c in COLUMNS:
            tot[c] += s[c]
    lines.append(f"{'total':12}" + "".join(f" {tot[c]:8}" for c in COLUMNS))
    return "\n".join(lines)


def markdown(records: list[dict], meta: dict, skipped: list[dict]) -> str:
    out = ["# PyTorch's OptimizerInfo database on tpu", "",
           f"Generated {meta['when']} by `{meta['command']}` (torch {meta['torch']}, jax {meta['jax']}, "
           f"XLA platform {meta['platform']}; {meta['seconds']:.0f} s).", "",
           f"Every OptimizerInfo of `torch.testing._internal.common_optimizers.optim_db`, each of its "
           f"inputs (CPU's and the CUDA-only capturable ones), implementations (for-loop, foreach, fused), "
           f"dtypes ({', '.join(meta['dtypes'])}) and eager modes ({', '.join(meta['modes'])}), stepped "
           f"{meta['steps']} times on tpu and on CPU with the same parameters and gradients; parameters, "
           f"optimizer state and hyperparameters compared (float rtol 1e-5 atol 1e-6, relaxed to 1e-4/1e-5 "
           f"where needed; bfloat16 rtol 1.6e-2 atol 1e-2); one case per LR scheduler input; every error "
           f"input. `as CPU`: CPU raises for the case and tpu raises the same class (passed). "
           f"`weighed`: passed, a difference beyond the tolerance no larger than 4x CPU's own float32 "
           f"distance from a float64 run of the case. "
           f"`fallbacks`: cases in which an op fell back to the CPU. See `torchtpu/validate/optims.py`.", ""]
    if skipped:
        out += ["Skipped: " + "; ".join(f"{s['optim']} ({s['reason']})" for s in skipped), ""]
    out += ["| optimizer | mode | cases | passed | failed | as CPU | relaxed | weighed | fallbacks |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, mode), s in summarize(records, by_mode=True).items():
        out.append(f"| {name} | {mode} | " + " | ".join(str(s[c]) for c in COLUMNS) + " |")
    tot = summarize([dict(r, optim="total", mode="") for r in records], by_mode=False).get("total")
    if tot:
        out.append("| **total** | | " + " | ".join(str(tot[c]) for c in COLUMNS) + " |")
    fails = [r for r in records if r["status"] == "failed"]
    out += ["", f"## Failures ({len(fails)})", ""]
    if not fails:
        out.append("None.")
    for r in fails:
        out.append(f"- `{_key(r)}` ({r['kwargs']}): {r['cause']}")
    fb = [r for r in records if r.get("fallbacks")]
    out += ["", f"## CPU fallbacks ({len(fb)} cases)", ""]
    if not fb:
        out.append("None.")
    for r in fb:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(r["fallbacks"].items()))
        out.append(f"- `{_key(r)}`: {ops}")
    rel = [r for r in records if r.get("tol") == "relaxed" and r["status"] == "passed"]
    out += ["", f"## Passed only at the relaxed tolerance ({len(rel)} cases)", ""]
    out.append("None." if not rel else "\n".join(f"- `{_key(r)}`" for r in rel))
    wei = [r for r in records if r.get("tol") == "weighed" and r["status"] == "passed"]
    out += ["", f"## Passed as rounding, weighed against float64 ({len(wei)} cases)", ""]
    out.append("None." if not wei else "\n".join(
        f"- `{_key(r)}`: {'; '.join(r['weighed'][:4])}" + (f" (+{len(r['weighed']) - 4} more)" if len(r['weighed']) > 4 else "")
        for r in wei))
    sk = [r for r in records if r["status"] == "skipped"]
    if sk:
        out += ["", f"## Error inputs skipped ({len(sk)}: CPU does not raise them)", ""]
        seen = set()
        for r in sk:
            k = (r["optim"], r["desc"])
            if k not in seen:
                seen.add(k)
                out.append(f"- {r['optim']}: {r['desc']}: {r['cause']}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.validate.optims", description=__doc__.split("\n\n")[0])
    ap.add_argument("--optims", nargs="*", default=None, help="optimizer class names (Adam SGD ...); default all")
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=("strict", "debug", "defer_and_fuse"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", nargs="?", const=DEFAULT_MARKDOWN, default=None)
    args = ap.parse_args(argv)

    import jax
    import torchtpu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _main(args, argv, jax, torchtpu)


def _main(args, argv, jax, torchtpu) -> int:
    t_start = time.perf_counter()
    dtypes = [getattr(torch, d) for d in args.dtypes]
    todo, skipped = cases(set(args.optims or ()), dtypes)
    for s in skipped:
        print(f"skipped {s['optim']}: {s['reason']}", file=sys.stderr)
    prog = Progress(len(todo) * len(args.modes), "optims ")
    records = []
    for case in todo:
        if case.kind == "error":
            for mode in args.modes:
                with contextlib.redirect_stdout(sys.stderr):
                    r = run_error_case(case, mode)
                records.append(r)
                prog.step(_key(r), r["status"] + (" (fallbacks)" if r.get("fallbacks") else ""))
            continue
        steps = case_steps(case, args.steps)
        with contextlib.redirect_stdout(sys.stderr):
            cpu = _cpu_oracle(case, steps)
        for mode in args.modes:
            with contextlib.redirect_stdout(sys.stderr):
                r = run_case(case, mode, steps, cpu)
            records.append(r)
            prog.step(_key(r), r["status"] + (" (fallbacks)" if r.get("fallbacks") else ""))

    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python -m torchtpu.validate.optims" + ("" if not argv else " " + " ".join(argv)),
            "dtypes": args.dtypes, "modes": args.modes, "steps": args.steps, "torch": torch.__version__,
            "jax": jax.__version__, "platform": torchtpu.platform(),
            "seconds": round(time.perf_counter() - t_start, 1)}
    print()
    print(summary_text(records))
    fails = [r for r in records if r["status"] == "failed"]
    for r in fails:
        print(f"  FAIL {_key(r)}: {r['cause']}")
    for r in records:
        if r.get("fallbacks"):
            print(f"  FALLBACK {_key(r)}: {r['fallbacks']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        summary = {k: v for k, v in summarize(records, by_mode=False).items()}
        Path(args.json).write_text(json.dumps({"meta": meta, "skipped": skipped, "summary": summary,
                                               "cases": records}, indent=1, default=str))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(records, meta, skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
