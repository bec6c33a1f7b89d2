"""PyTorch's OpInfo suite on tpu vs CPU: every OpInfo once (one sample per dtype).

Expected states live in tests/opinfo_expected.json (written by
`python -m torchtpu.validate ops --max-samples 1 --write-expected tests/opinfo_expected.json`).
A state worse than expected fails; a better one warns, so the data file gets
updated and the improvement shows in review. The full sweep is
`python -m torchtpu.validate ops --json docs/opinfo.json`, or this file with `-m slow`.
"""
import json
import os
import warnings

import pytest
import torch

from torchtpu.validate import ops as v

_EXPECTED_PATH = os.path.join(os.path.dirname(__file__), "opinfo_expected.json")
with open(_EXPECTED_PATH) as f:
    EXPECTED = json.load(f)

# Lower is better.
_RANK = {"pass-native": 0, "skipped": 0, "pass-with-fallback": 1, "mismatch": 2, "error": 3}
_OPS = {v.opinfo_name(o): o for o in v.select()}


_FULL_PATH = os.path.join(os.path.dirname(__file__), "..", "docs", "opinfo.json")


def _full_expected():
    with open(_FULL_PATH) as f:
        return {k: [r["forward"], r["backward"]] for k, r in json.load(f)["ops"].items()}


def _check(name, max_samples, expected=EXPECTED):
    r = v.run_opinfo(_OPS[name], [torch.float32, torch.int64], max_samples, backward=True, timeout=120)
    want_f, want_b = expected.get(name, ["error", "error"])
    got = (r.forward, r.backward)
    worse = [d for d, g, w in zip(("forward", "backward"), got, (want_f, want_b)) if _RANK[g] > _RANK[w]]
    assert not worse, f"{name}: {got} worse than expected {(want_f, want_b)}: {r.detail}"
    if got != (want_f, want_b) and any(_RANK[g] < _RANK[w] for g, w in zip(got, (want_f, want_b))):
        warnings.warn(f"{name} improved to {got} (expected {want_f, want_b}); update {_EXPECTED_PATH}")


@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_one_sample(name):
    _check(name, 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_all_samples(name):
    """The full sweep's configuration (6 samples per dtype), against docs/opinfo.json."""
    _check(name, 6, _full_expected())
