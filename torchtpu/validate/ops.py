"""OpInfo conformance: every sample of every OpInfo in PyTorch's op_db, on tpu and on CPU.

    python -m torchtpu.validate ops [--json PATH] [--markdown PATH] [--ops NAME ...]
                                    [--dtypes float32 int64] [--max-samples N] [--no-backward]
    python -m torchtpu.validate ops --mode compile|defer_and_fuse [...]
        the same sweep with tpu's side run compiled (torch.compile(backend="tpu"), forward and
        backward graphs) or deferred and fused; its own report and expected file per mode
    python -m torchtpu.validate ops --errors [--ops NAME ...] [--json PATH] [--markdown PATH]
        every OpInfo's error_inputs instead (see validate/error_inputs.py); --markdown
        replaces only the report's "Error inputs" section

Each OpInfo ends in one state per direction (forward, and backward for
differentiable ones): pass-native, pass-with-fallback, mismatch, error, skipped.
CPU PyTorch is the oracle; tolerances are torch.testing.assert_close's per dtype.
As in PyTorch's own cross-device test (test_ops.py test_compare_cpu), results go through
the sample's output_process_fn_grad before comparing (eigenvector signs, singular-vector
phases), and a sample that asks for device="cpu" expects its result there. Complex-only
OpInfos (no float32/int64 on CPU) run in complex64.

    --write-expected PATH   {OpInfo: [forward, backward]}, the data tests/test_opinfo.py checks
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

import torchtpu

from . import report_sections
from .names import opinfo_name
from .opinfo_causes import CAUSES
from .progress import Progress
from .samples import sample_inputs
from .timeout import Timeout as _Timeout, time_limit as _time_limit

MODES = ("strict", "defer_and_fuse", "compile")
STATES = ("pass-native", "pass-with-fallback", "mismatch", "error", "skipped")
_RANK = {s: i for i, s in enumerate(("skipped", "pass-native", "pass-with-fallback", "mismatch", "error"))}

# Ops whose values are random or uninitialized: only shapes, dtypes and devices are compared.
NONDETERMINISTIC = {
    "bernoulli", "normal", "normal_", "uniform", "rand_like", "randn_like", "randint_like", "randint",
    "multinomial", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "exponential", "geometric", "cauchy", "log_normal", "randn", "rand", "torch.randn", "randperm",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "bernoulli_",
    "pca_lowrank", "svd_lowrank",  # random projections
}
# Sparse layouts are out of scope for an XLA device: reported as skipped, with this reason.
SPARSE = {"to_sparse", "sparse.mm.reduce", "sparse.sampled_addmm"}
DTYPES = {"float32": torch.float32, "int64": torch.int64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "bool": torch.bool, "float64": torch.float64,
          "complex64": torch.complex64}


@dataclass
class Result:
    name: str
    forward: str = "skipped"
    backward: str = "skipped"
    detail: str = ""
    fallback_ops: set = field(default_factory=set)
    samples: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"forward": self.forward, "backward": self.backward, "detail": self.detail[:500],
                "fallback_ops": sorted(self.fallback_ops), "samples": self.samples,
                "seconds": round(self.seconds, 2)}


def _worse(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        return t.requires_grad_(x.requires_grad) if x.is_leaf else t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("tpu")
    if isinstance(x, str) and x == "cpu":
        return "tpu"
    return x


def _clone(x):
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        return c.requires_grad_(x.requires_grad)
    return x


def _compare(actual, expected, values: bool, dtype, device: str = "tpu", op=None) -> None:
    """`device`: where the results belong ("cpu" when the sample asks for it, e.g. empty_like(x, device="cpu"))."""
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        raise AssertionError(f"output structure differs: {a_spec} vs {e_spec}")
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"expected a tensor, got {type(a).__name__}")
            if e.device.type == "cpu" and a.device.type != device:
                raise AssertionError(f"result on {a.device}, expected {device}")
            if a.shape != e.shape or a.dtype != e.dtype:
                raise AssertionError(f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(e.shape)} {e.dtype}")
            if values:
                ac = a.detach().cpu()
                ec = e.detach()
                if ec.is_conj():
                    ec = ec.resolve_conj()
                if ec.is_neg():
                    ec = ec.resolve_neg()
                torch.testing.assert_close(ac, ec, equal_nan=True, check_stride=False, **_tol(dtype, ec.dtype, op))
        elif values and isinstance(e, float) and isinstance(a, float):
            torch.testing.assert_close(a, e, equal_nan=True)
        elif values and a != e and not (isinstance(e, float) and e != e):
            raise AssertionError(f"{a!r} != {e!r}")


# assert_close's defaults for the half types (rtol, atol)
_HALF_TOL = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def opinfo_tolerance(op, dtype) -> tuple[float, float]:
    """PyTorch's (rtol, atol) for a half dtype: assert_close's default, widened by the
    OpInfo's own toleranceOverride / precisionOverride decorators for that dtype."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo

    rtol, atol = _HALF_TOL[dtype]
    for d in getattr(op, "decorators", ()) or ():
        for dec in d.decorators if isinstance(d, DecorateInfo) else [d]:
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                rtol, atol = max(rtol, dec.d[dtype].rtol), max(atol, dec.d[dtype].atol)
            elif isinstance(dec, precisionOverride) and dtype in dec.d:
                atol = max(atol, dec.d[dtype])
    return rtol, atol


def _tol(dtype, out_dtype, op=None):
    if out_dtype in _HALF_TOL:
        rtol, atol = opinfo_tolerance(op, out_dtype)
        return {"rtol": rtol, "atol": atol}
    if out_dtype in (torch.float32, torch.complex64):
        return {"rtol": 1.3e-5, "atol": 1e-5}
    return {}


def _grads(outs, inputs, seed: int):
    leaves = [o for o in tree_flatten(outs)[0]
              if isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point() or o.is_complex())]
    if not leaves or not inputs:
        return None
    g = torch.Generator().manual_seed(seed)
    cots = [torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device) for o in leaves]
    return torch.autograd.grad(leaves, inputs, cots, allow_unused=True)


def run_opinfo(op, dtypes, max_samples: int, backward: bool, timeout: int = 120,
               mode: str = "strict", samples_on: str = "tpu") -> Result:
    """`mode`: how tpu's side runs: "strict" and "defer_and_fuse" as eager modes, "compile" as
    torch.compile(backend="tpu") of the op (its backward through the compiled backward graph).
    `samples_on`: where the samples are drawn first ("cpu": moved to tpu, which compiles no
    random-fill program per sample shape; the quick test's choice)."""
    name = opinfo_name(op)
    res = Result(name)
    t0 = time.perf_counter()
    # The same samples in every run and process: samples are drawn with torch's generator on the
    # device, and some sample functions also draw from Python's and NumPy's (linalg.eigh's UPLO).
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    values = name not in NONDETERMINISTIC and op.name not in NONDETERMINISTIC
    if op.name in SPARSE or op.name.startswith("sparse."):
        res.detail = "sparse layouts are not supported on tpu"
        return res
    tested = False
    supported = op.supported_dtypes("cpu")
    if dtypes and not any(d in supported for d in dtypes) and torch.complex64 in supported:
        # complex-only OpInfos (imag, view_as_real, istft, ...): measured in complex64 rather
        # than left untested
        dtypes = [torch.complex64]
    try:
        with _time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for dtype in dtypes:
                if dtype not in op.supported_dtypes("cpu"):
                    continue
                want_grad = backward and op.supports_autograd and (dtype.is_floating_point or dtype.is_complex) and \
                    dtype in op.supported_backward_dtypes("cpu")
                samples = _samples(op, dtype, want_grad, max_samples, samples_on)
                if isinstance(samples, str):
                    res.detail = samples
                    continue
                for i, sample in enumerate(samples):
                    tested = True
                    res.samples += 1
                    fwd, bwd = _run_sample(op, sample, values, want_grad, dtype, res, seed=i, mode=mode)
                    res.forward = _worse(res.forward, fwd)
                    if want_grad:
                        res.backward = _worse(res.backward, bwd)
    except _Timeout as e:
        res.forward = _worse(res.forward, "error")
        res.detail = str(e)
    if not tested and not res.detail:
        res.detail = "no sample for the requested dtypes"
    res.seconds = time.perf_counter() - t0
    return res


def _samples(op, dtype, want_grad, max_samples, first="tpu"):
    """Samples made on tpu, as PyTorch's device-generic tests make them on the device under
    test (a sample keeps on CPU what the op wants there, e.g. tensor_split's indices);
    samples made on CPU and moved when the generator itself cannot run on tpu, or when asked."""
    if first == "tpu":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return [("tpu", s) for s in sample_inputs(op, "tpu", dtype, max_samples, requires_grad=want_grad)]
        except Exception:
            pass
    try:
        return [("cpu", s) for s in sample_inputs(op, "cpu", dtype, max_samples, requires_grad=want_grad)]
    except Exception as e:  # the sample generator itself failed on CPU
        return f"sample generation failed: {type(e).__name__}: {e}"


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        c = x.detach().cpu().clone() if x.device.type != "cpu" else x.detach().clone()
        return c.requires_grad_(x.requires_grad)
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("cpu")
    if isinstance(x, str) and x in ("tpu", "tpu:0"):
        return "cpu"
    return x


def _random_sample(op, sample) -> bool:
    """Attention samples with dropout draw random masks: only shapes and dtypes compare."""
    if "attention" not in op.name:
        return False
    import inspect

    kwargs = dict(sample.kwargs)
    # dropout_p may come positionally (multi_head_attention_forward): bind to the real signature
    fn = getattr(torch.nn.functional, op.name.split(".")[-1], None)
    try:
        bound = inspect.signature(fn).bind(sample.input, *sample.args, **sample.kwargs)
        kwargs = {**bound.arguments, **kwargs}
    except (TypeError, ValueError):
        pass
    p = kwargs.get("dropout_p", kwargs.get("dropout", 0.0))
    return isinstance(p, (int, float)) and p > 0 and kwargs.get("training", True) is not False


class _Runner:
    """Runs tpu's side of a sample in one mode. Each sample compiles afresh under "compile"
    (Dynamo's cache reset, static shapes): a sample must not run the eager fallback Dynamo takes
    past its recompile limit, nor inherit another sample's dynamic dims."""

    def __init__(self, mode: str):
        self.mode = mode

    def call(self, op, args, kwargs):
        if self.mode == "compile":
            import torch._dynamo

            torch._dynamo.reset()
            fn = torch.compile(lambda *a, **k: op(*a, **k), backend="tpu", dynamic=False)
            with torchtpu.eager_mode("strict"):
                return fn(*args, **kwargs)
        with torchtpu.eager_mode(self.mode):
            return op(*args, **kwargs)

    def grads(self, outs, inputs, seed):
        # a compiled forward's backward is its compiled backward graph, whatever the eager mode
        with torchtpu.eager_mode("strict" if self.mode == "compile" else self.mode):
            return _grads(outs, inputs, seed)


def _run_sample(op, made, values, want_grad, dtype, res: Result, seed: int, mode: str = "strict"):
    run = _Runner(mode)
    where, sample = made
    values = values and not _random_sample(op, sample)
    triple = (sample.input, sample.args, sample.kwargs)
    if where == "tpu":
        cpu_sample = tree_map(_to_cpu, triple)
        tpu_sample = tree_map(lambda x: x.detach().clone().requires_grad_(x.requires_grad)
                              if isinstance(x, torch.Tensor) else x, triple)
    else:
        tpu_sample = tree_map(_to_tpu, triple)
        cpu_sample = tree_map(_clone, triple)
    try:
        expected = op(cpu_sample[0], *cpu_sample[1], **cpu_sample[2])
    except Exception:
        return "skipped", "skipped"  # the CPU reference rejects this sample
    # The sample's output_process_fn_grad maps results that are defined only up to a choice
    # (eigenvector signs and phases, singular vectors) to comparable ones: PyTorch's own
    # cross-device test (test_compare_cpu) and gradient tests compare through it.
    post = getattr(sample, "output_process_fn_grad", None) or (lambda x: x)
    try:
        expected = post(expected)
    except Exception:
        post = lambda x: x  # noqa: E731  (it holds tensors of the other device)
    # A sample made on tpu that names the CPU device (the *_like / new_* factories' cross-device
    # cases) wants its result on CPU, as PyTorch's device-generic tests expect.
    device = "cpu" if where == "tpu" and _asks_for_cpu(tpu_sample) else "tpu"
    torchtpu.reset_metrics()
    try:
        actual = post(run.call(op, (tpu_sample[0], *tpu_sample[1]), tpu_sample[2]))
        fb = torchtpu.metrics()["fallback_ops"]
        _compare(actual, expected, values, dtype, device, op)
    except AssertionError as e:
        res.detail = res.detail or f"forward: {_short(e)}"
        return "mismatch", "skipped"
    except Exception as e:
        res.detail = res.detail or f"forward: {type(e).__name__}: {_short(e)}"
        return "error", "skipped"
    res.fallback_ops |= set(fb)
    fwd = "pass-with-fallback" if fb else "pass-native"
    if not want_grad:
        return fwd, "skipped"
    try:
        eg = _grads(expected, _grad_inputs_from(cpu_sample), seed)
    except Exception:
        return fwd, "skipped"
    if eg is None:
        return fwd, "skipped"
    torchtpu.reset_metrics()
    try:
        ag = run.grads(actual, _grad_inputs_from(tpu_sample), seed)
        fb = torchtpu.metrics()["fallback_ops"]
        _compare([g for g in ag if g is not None] if ag else [],
                 [g for g in eg if g is not None], values, dtype, op=op)
    except AssertionError as e:
        res.detail = res.detail or f"backward: {_short(e)}"
        return fwd, "mismatch"
    except Exception as e:
        res.detail = res.detail or f"backward: {type(e).__name__}: {_short(e)}"
        return fwd, "error"
    res.fallback_ops |= {f"backward:{k}" for k in fb}
    return fwd, "pass-with-fallback" if fb else "pass-native"


def _asks_for_cpu(triple) -> bool:
    kwargs = triple[2]
    d = kwargs.get("device") if isinstance(kwargs, dict) else None
    return (isinstance(d, str) and d.split(":")[0] == "cpu") or (isinstance(d, torch.device) and d.type == "cpu")


def _grad_inputs_from(triple):
    leaves = tree_flatten(triple)[0]
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return " | ".join(x.strip() for x in s[:4])[:300]


_BY_NAME: dict = {}
_RUN_COUNT = [0]
CLEAR_EVERY = 25  # OpInfos between compile-cache clears: a worker's compiled programs pile up


def clear_caches() -> None:
    """Drop compiled programs (executor, fused-graph and JAX caches): hundreds of OpInfos compile
    thousands of programs, and a long-lived worker otherwise grows by gigabytes."""
    import jax

    from ..eager import executor  # (its clear drops the fused regions too)

    executor.clear_cache()
    jax.clear_caches()


def _run_named(name: str, dtypes, max_samples, backward, timeout, mode="strict") -> Result:
    if not _BY_NAME:
        _BY_NAME.update({opinfo_name(o): o for o in select()})
    _RUN_COUNT[0] += 1
    if _RUN_COUNT[0] % CLEAR_EVERY == 0:
        clear_caches()
    return run_opinfo(_BY_NAME[name], [DTYPES[d] for d in dtypes], max_samples, backward, timeout, mode)


def select(names=None):
    from torch.testing._internal.common_methods_invocations import op_db

    ops = list(op_db)
    if names:
        wanted = set(names)
        ops = [o for o in ops if o.name in wanted or opinfo_name(o) in wanted]
    return ops


def summarize(results: list[Result]) -> dict:
    fwd = {s: 0 for s in STATES}
    bwd = {s: 0 for s in STATES}
    for r in results:
        fwd[r.forward] += 1
        bwd[r.backward] += 1
    total = len(results)
    diff = total - bwd["skipped"]
    return {
        "opinfos": total,
        "forward": fwd,
        "backward": bwd,
        "forward_native_pct": round(100 * fwd["pass-native"] / max(total, 1), 2),
        "forward_any_pass_pct": round(100 * (fwd["pass-native"] + fwd["pass-with-fallback"]) / max(total, 1), 2),
        "backward_native_pct_of_differentiable": round(100 * bwd["pass-native"] / max(diff, 1), 2),
        # OpInfos CPU PyTorch cannot run here (CUDA-only jiterator/flash/float8 ops, sparse layouts)
        # end "skipped": the same shares over the OpInfos that ran
        "forward_native_pct_of_tested": round(100 * fwd["pass-native"] / max(total - fwd["skipped"], 1), 2),
        "forward_any_pass_pct_of_tested": round(
            100 * (fwd["pass-native"] + fwd["pass-with-fallback"]) / max(total - fwd["skipped"], 1), 2),
        "lowered_overloads": len(torchtpu.lowered_ops()),
    }


def print_summary(summary: dict, out=sys.stdout) -> None:
    print(file=out)
    print(f"{'state':<22}{'forward':>10}{'backward':>10}", file=out)
    print("-" * 42, file=out)
    for s in STATES:
        print(f"{s:<22}{summary['forward'][s]:>10}{summary['backward'][s]:>10}", file=out)
    print("-" * 42, file=out)
    print(f"OpInfos: {summary['opinfos']}   forward native: {summary['forward_native_pct']}%   "
          f"forward pass (any): {summary['forward_any_pass_pct']}%   backward native (of "
          f"differentiable): {summary['backward_native_pct_of_differentiable']}%   lowered overloads: "
          f"{summary['lowered_overloads']}", file=out)
    print(f"Of the {summary['opinfos'] - summary['forward']['skipped']} OpInfos that ran: forward native "
          f"{summary['forward_native_pct_of_tested']}%   forward pass (any) "
          f"{summary['forward_any_pass_pct_of_tested']}%", file=out)


def _passes(forward: str, backward: str) -> bool:
    """An OpInfo passes when it ran forward and neither direction mismatched or raised."""
    ok = ("pass-native", "pass-with-fallback", "skipped")
    return forward != "skipped" and forward in ok and backward in ok


DEFAULT_DTYPES = ["float32", "int64"]


def mode_heading(mode: str, dtypes=None) -> str:
    """The report section of one mode's sweep (and its dtypes, when not the default ones)."""
    extra = f" ({', '.join(dtypes)})" if dtypes and list(dtypes) != DEFAULT_DTYPES else ""
    return f"## Mode: {mode}{extra}"


def write_mode_section(path: str, mode: str, summary: dict, results: list[Result], argv: list[str],
                       against: str | None, dtypes=None) -> dict:
    """The report's section for a mode's sweep (or strict's over other dtypes): its states, and
    every OpInfo that passes in the strict sweep in `against` but not here, with its diagnosed
    cause (with no `against`, every OpInfo that does not pass). Returns the counts."""
    if against:
        with open(against) as f:
            strict = {k: (v["forward"], v["backward"]) for k, v in json.load(f)["ops"].items()}
    else:  # every OpInfo that ran
        strict = {r.name: ("pass-native", "skipped") for r in results if r.forward != "skipped"}
    here = {r.name: r for r in results}
    base = [n for n in sorted(here) if n in strict and _passes(*strict[n])]
    lost = [n for n in base if not _passes(here[n].forward, here[n].backward)]
    causes = CAUSES.get(mode, {})
    passing = len(base) - len(lost)
    pct = round(100 * passing / max(len(base), 1), 2)
    lines = [mode_heading(mode, dtypes), "",
             f"Generated by `python -m torchtpu.validate ops {' '.join(argv)}` (torch {torch.__version__}, "
             f"XLA:{torchtpu.platform()}); tpu's side "
             + ("runs as `torch.compile(op, backend=\"tpu\")`, its gradients through the compiled backward graph."
                if mode == "compile" else f"runs in the {mode} eager mode."), "",
             "| state | forward | backward |", "|---|---:|---:|"]
    for st in STATES:
        lines.append(f"| {st} | {summary['forward'][st]} | {summary['backward'][st]} |")
    lines += ["", (f"- Of the {len(base)} OpInfos that pass in strict (`{against}`), forward and backward: "
                   f"**{passing} pass in {mode} ({pct} %)**." if against else
                   f"- Of the {len(base)} OpInfos that ran: **{passing} pass ({pct} %)**."),
              f"- Diagnosed of the {len(lost)} that do not: {sum(n in causes for n in lost)}.", ""]
    if lost:
        lines += ["| OpInfo | strict | " + mode + " | detail | cause |", "|---|---|---|---|---|"]
        for n in lost:
            r = here[n]
            detail = (r.detail or "").replace("|", "/")[:160]
            lines.append(f"| {n} | {'/'.join(strict[n])} | {r.forward}/{r.backward} | {detail} | "
                         f"{causes.get(n, 'undiagnosed').replace('|', '/')} |")
    # passing, but partly on the CPU fallback where strict runs natively: slower here, not wrong
    hosted = [n for n in base if n not in lost and any(
        st == "pass-native" and h == "pass-with-fallback"
        for st, h in zip(strict[n], (here[n].forward, here[n].backward)))]
    if hosted:
        lines += [f"- Passing with part of the op on the CPU fallback where strict runs natively "
                  f"({len(hosted)}; slower, not wrong): " + ", ".join(hosted) + ".", ""]
    report_sections.replace(path, mode_heading(mode, dtypes), "\n".join(lines) + "\n")
    return {"strict_passing": len(base), "passing": passing, "pct": pct, "lost": lost}


def write_markdown(path: str, summary: dict, results: list[Result], argv: list[str]) -> None:
    # the error-input sweep's and the other modes' sections are theirs: kept as they are
    others = report_sections.kept(path, ("## Error inputs", "## Mode: "))
    lines = ["# OpInfo conformance on tpu", "",
             f"Generated by `python -m torchtpu.validate ops {' '.join(argv)}` "
             f"(torch {torch.__version__}, XLA:{torchtpu.platform()}).", "",
             "| state | forward | backward |", "|---|---:|---:|"]
    for s in STATES:
        lines.append(f"| {s} | {summary['forward'][s]} | {summary['backward'][s]} |")
    lines += ["", f"- OpInfos: {summary['opinfos']}",
              f"- forward native: {summary['forward_native_pct']} %",
              f"- forward passing with fallback allowed: {summary['forward_any_pass_pct']} %",
              f"- backward native, of differentiable: {summary['backward_native_pct_of_differentiable']} %",
              f"- of the {summary['opinfos'] - summary['forward']['skipped']} OpInfos that ran (not skipped): "
              f"forward native {summary['forward_native_pct_of_tested']} %, forward passing with fallback "
              f"allowed {summary['forward_any_pass_pct_of_tested']} %",
              f"- ATen overloads lowered natively: {summary['lowered_overloads']}", "",
              "## Not passing natively", "", "| OpInfo | forward | backward | detail |", "|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r.name):
        if r.forward in ("pass-native", "skipped") and r.backward in ("pass-native", "skipped"):
            continue
        detail = (r.detail or ", ".join(sorted(r.fallback_ops))).replace("|", "/")[:160]
        lines.append(f"| {r.name} | {r.forward} | {r.backward} | {detail} |")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + others)


def write_expected(path: str, results: list[Result]) -> None:
    """{OpInfo: [forward, backward]}, one OpInfo a line (a state change is a one-line diff)."""
    rows = [f"{json.dumps(r.name)}: {json.dumps([r.forward, r.backward])}"
            for r in sorted(results, key=lambda r: r.name)]
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(rows) + "\n}\n")


def _run_isolated(name, job, results, prog) -> None:
    """One OpInfo in a pool of its own: a worker it kills is charged to it alone."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        try:
            r = pool.submit(_run_named, name, *job).result()
        except Exception as e:
            r = Result(name, forward="error", detail=f"worker died: {type(e).__name__}: {e}")
    results.append(r)
    prog.step(r.name, f"fwd {r.forward}, bwd {r.backward}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m torchtpu.validate ops")
    p.add_argument("--json", help="write per-OpInfo states and the lowered overloads here")
    p.add_argument("--markdown", help="write a markdown report here (e.g. docs/opinfo.md)")
    p.add_argument("--ops", nargs="*", help="OpInfo names (default: all 702)")
    p.add_argument("--dtypes", nargs="*", default=DEFAULT_DTYPES, choices=sorted(DTYPES))
    p.add_argument("--max-samples", type=int, default=6, help="samples per OpInfo and dtype")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--mode", default="strict", choices=MODES,
                   help="how tpu's side runs: an eager mode, or torch.compile(backend='tpu')")
    p.add_argument("--timeout", type=int, default=180, help="seconds per OpInfo")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--against", default="docs/opinfo.json",
                   help="the strict sweep's JSON a section compares with (over the same dtypes; '' for none)")
    p.add_argument("--errors", action="store_true",
                   help="run the OpInfos' error_inputs: same exception class and message as CPU")
    p.add_argument("--write-expected", metavar="PATH",
                   help="write {OpInfo: [forward, backward]} states, the data tests/test_opinfo.py checks")
    args = p.parse_args(argv)
    ops = select(args.ops)
    if args.errors:
        from . import error_inputs

        return error_inputs.main(ops, argv, args.json, args.markdown)
    names = [opinfo_name(o) for o in ops]
    prog = Progress(len(ops), "ops ")
    results = []
    job = (list(args.dtypes), args.max_samples, not args.no_backward, args.timeout, args.mode)
    if args.jobs <= 1:
        for name in names:
            r = _run_named(name, *job)
            results.append(r)
            prog.step(r.name, f"fwd {r.forward}, bwd {r.backward}")
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        todo = list(names)
        while todo:
            # A dead worker (a crash in XLA or torch, or the OOM killer) breaks the whole pool and
            # fails every pending future with it: what is unfinished runs again in a fresh pool
            # while each round finishes something; then each alone, so an OpInfo that kills its
            # worker by itself ends in "error" (worker died) and takes no other one with it.
            died = []
            with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
                futs = {pool.submit(_run_named, n, *job): n for n in todo}
                for fut in cf.as_completed(futs):
                    try:
                        r = fut.result()
                    except Exception as e:
                        died.append((futs[fut], f"worker died: {type(e).__name__}: {e}"))
                        continue
                    results.append(r)
                    prog.step(r.name, f"fwd {r.forward}, bwd {r.backward}")
            progressed = len(died) < len(todo)
            todo = [n for n, _ in died]
            if todo and not progressed:  # nothing finished: one pool each finds the culprit
                for n in todo:
                    _run_isolated(n, job, results, prog)
                todo = []
        results.sort(key=lambda r: names.index(r.name))
    summary = summarize(results)
    print_summary(summary)
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "argv": argv, "ops": {r.name: r.to_json() for r in results},
                       "lowered": torchtpu.lowered_ops()}, f, indent=1, sort_keys=True)
    if args.markdown and (args.mode != "strict" or list(args.dtypes) != DEFAULT_DTYPES):
        # strict over other dtypes (complex64) is a section too, which that dtype's sweeps compare with
        against = args.against if args.mode != "strict" else None
        got = write_mode_section(args.markdown, args.mode, summary, results, argv, against or None, args.dtypes)
        print(f"{args.mode}: {got['passing']} of the {got['strict_passing']} OpInfos passing in strict pass "
              f"({got['pct']} %); {len(got['lost'])} do not: {', '.join(got['lost'][:20])}")
    elif args.markdown:
        write_markdown(args.markdown, summary, results, argv)
    if args.write_expected:
        write_expected(args.write_expected, results)
    return 0
