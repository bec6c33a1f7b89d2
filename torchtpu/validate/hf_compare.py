"""What one Hugging Face model check produces and how tpu outputs are compared with CPU's:
the per-model `Result`, its states, the float32 tolerances, and the output comparison."""
from __future__ import annotations

import os
import traceback
from dataclasses import asdict, dataclass, field

import torch

# cpu-ok: the coverage pass (--mode cpu) ran the CPU reference only, and it worked.
STATES = ("match", "mismatch", "tpu-error", "cpu-error", "skipped", "cpu-ok")
MODES = ("cpu", "strict", "defer_and_fuse", "compile")
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
    # a mismatch judged against a float64 CPU run of the same model: {"forward"/"backward":
    # [CPU float32's distance from it, tpu's]} or the reason that run failed (see rounding())
    float64: dict = field(default_factory=dict)
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


def result_from(d: dict) -> Result:
    return Result(**{k: v for k, v in d.items() if k in Result.__dataclass_fields__})


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


def rounding(actual, expected, exact, grads: bool = False) -> list[float]:
    """[CPU's, tpu's] largest distance from `exact` (the same model run in float64 on CPU) over the
    output tensors where tpu and CPU float32 disagree beyond the tolerances. A float32 model whose
    CPU result is itself that far from the float64 answer has no better answer to match: tpu no
    farther from it than CPU is rounding (ill-conditioned outputs: near-ties, normalisations of
    near-constant values), tpu much farther is a bug."""
    a, e, x = dict(leaves(actual)), dict(leaves(expected)), dict(leaves(exact))
    cpu = tpu = 0.0
    for k, ev in e.items():
        av, xv = a.get(k), x.get(k)
        if av is None or xv is None or not ev.is_floating_point() or av.shape != ev.shape \
                or xv.shape != ev.shape:
            continue
        ac, ec, xc = av.detach().cpu().double(), ev.detach().double(), xv.detach().double()
        atol = ATOL * max(1.0, ec.abs().max().item()) if grads and GRAD_ATOL_SCALED and ec.numel() else ATOL
        if torch.allclose(ac, ec, atol=atol, rtol=RTOL, equal_nan=True):
            continue
        fin = torch.isfinite(ac) & torch.isfinite(ec) & torch.isfinite(xc)
        if fin.any():
            cpu = max(cpu, (ec[fin] - xc[fin]).abs().max().item())
            tpu = max(tpu, (ac[fin] - xc[fin]).abs().max().item())
    return [float(f"{cpu:.3g}"), float(f"{tpu:.3g}")]


# tpu within this factor of CPU float32's own distance from the float64 answer: rounding, not a bug
ROUNDING_FACTOR = 2.0


def mismatch_cause(r) -> str:
    """Whose a mismatch is, from its float64 verdicts (Result.float64): float32 rounding when tpu
    is about as close to the float64 answer as CPU is, else ours."""
    parts = []
    for what in ("forward", "backward"):
        v = r.float64.get(what)
        if (what == "forward" and r.state != "mismatch") or (what == "backward" and r.backward != "mismatch"):
            continue
        if isinstance(v, list):
            cpu, tpu = v
            whose = "float32 rounding" if tpu <= ROUNDING_FACTOR * cpu else "ours"
            parts.append(f"{what}: {whose} (from a float64 run: CPU {cpu:.1e}, tpu {tpu:.1e})")
        else:
            parts.append(f"{what}: ours ({v or 'not judged against float64'})")
    return "; ".join(parts) or "ours"


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
