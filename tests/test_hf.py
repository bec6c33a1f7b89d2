"""Hugging Face Transformers on tpu vs CPU: the representative subset of issue 6.

The full sweep is `python -m torchtpu.validate hf --json docs/hf.json --markdown docs/hf.md`; this
file runs ~20 architectures (torchtpu/validate/hf_configs.py: SUBSET) forward in the current eager
mode, and backward + greedy generate(max_new_tokens=8) for a few causal LMs (SUBSET_TRAIN).
Expected states are data in hf_configs.py: a known backend failure is a strict xfail (visible in
review; fixing it turns the xfail into a failure that asks for the data to be updated).
"""
import pytest

pytest.importorskip("transformers")

from torchtpu.validate import hf  # noqa: E402
from torchtpu.validate import hf_configs as C  # noqa: E402


def _params(expected: dict, index=None):
    out = []
    for t in sorted(expected):
        want = expected[t] if index is None else expected[t][index]
        marks = [] if want == "match" else [pytest.mark.xfail(
            strict=True, reason=f"known backend failure ({want}): {C.KNOWN_FAILURES.get(t, '')}")]
        out.append(pytest.param(t, marks=marks, id=t))
    return out


def _run(model_type, **kw):
    variant, cls = hf.variants(model_type, ("head",))[0]
    r = hf.run_model(model_type, variant, cls, mode=None, **kw)
    assert r.state != "cpu-error", f"the tiny config or inputs fail on CPU: {r.detail}"
    return variant, r


@pytest.mark.parametrize("model_type", _params(C.SUBSET))
def test_forward(model_type):
    _, r = _run(model_type, backward=False, timeout=150)
    assert r.state == "match", f"{model_type}: {r.state}: {r.failing_op} {r.detail}"


@pytest.mark.parametrize("model_type", _params(C.SUBSET_TRAIN, 0))
def test_backward(model_type):
    variant, r = _run(model_type, backward=True, timeout=150)
    assert variant == "causal-lm"
    assert r.state == "match", f"forward: {r.state}: {r.detail}"
    assert r.backward == "match", f"{model_type}: backward {r.backward}: {r.backward_detail}"


@pytest.mark.parametrize("model_type", _params(C.SUBSET_TRAIN, 1))
def test_generate(model_type):
    variant, r = _run(model_type, backward=False, generate=True, timeout=170)
    assert variant == "causal-lm"
    assert r.generate == "match", f"{model_type}: generate {r.generate}: {r.generate_detail}"
