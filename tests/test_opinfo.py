"""PyTorch's OpInfo suite on tpu vs CPU, checked against the expected states in one data file.

tests/opinfo_expected.json ({OpInfo: [forward, backward]}) is written by the full sweep:
`python -m torchtpu.validate ops --jobs 2 --json docs/opinfo.json --markdown docs/opinfo.md
 --write-expected tests/opinfo_expected.json` (float32 + int64, up to 6 samples per dtype).

- test_opinfo_fast (in `make test`): every OpInfo once -- its first float32 sample (int64 when it
  has no float32), drawn on CPU, forward only -- fails if that state is worse than the expected
  forward state (also with the sample drawn on tpu, as the sweep draws it).
- test_opinfo_one_sample / test_opinfo_all_samples (`-m slow`): the sweep's configuration, backward
  included; the latter also warns on improvements, so the expected file gets regenerated and the
  change shows in review.
- test_opinfo_in_mode (`-m slow`): the same check in defer_and_fuse and under torch.compile against
  tests/opinfo_expected_<mode>.json, written by `python -m torchtpu.validate ops --mode <mode> ...
  --write-expected tests/opinfo_expected_<mode>.json` (see docs/opinfo.md's mode sections).
"""
import json
import os
import warnings

import pytest
import torch

from torchtpu.validate import ops as v

_EXPECTED = os.path.join(os.path.dirname(__file__), "opinfo_expected.json")
with open(_EXPECTED) as f:
    EXPECTED = {k: tuple(s) for k, s in json.load(f).items()}

# Lower is better.
_RANK = {"pass-native": 0, "skipped": 0, "pass-with-fallback": 1, "mismatch": 2, "error": 3}
_OPS = {v.opinfo_name(o): o for o in v.select()}


def test_expected_covers_op_db():
    assert sorted(EXPECTED) == sorted(_OPS), "regenerate tests/opinfo_expected.json (see the docstring)"


_count = [0]


@pytest.fixture(autouse=True)
def _bounded_memory():
    """Hundreds of OpInfos compile thousands of programs: drop them now and then."""
    _count[0] += 1
    if _count[0] % 40 == 0:
        v.clear_caches()
    yield


def _expected(mode):
    path = os.path.join(os.path.dirname(__file__), f"opinfo_expected_{mode}.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {k: tuple(s) for k, s in json.load(f).items()}


MODE_EXPECTED = {m: _expected(m) for m in ("defer_and_fuse", "compile")}


def _check(name, max_samples, warn_improvement, mode="strict", expected=EXPECTED):
    r = v.run_opinfo(_OPS[name], [torch.float32, torch.int64], max_samples, backward=True, timeout=600,
                     mode=mode)
    want = expected.get(name, ("error", "error"))
    got = (r.forward, r.backward)
    worse = [d for d, g, w in zip(("forward", "backward"), got, want) if _RANK[g] > _RANK[w]]
    assert not worse, f"{name}: {got} worse than expected {want}: {r.detail}"
    if warn_improvement and any(_RANK[g] < _RANK[w] for g, w in zip(got, want)):
        warnings.warn(f"{name} improved to {got} (expected: {want}); regenerate tests/opinfo_expected.json")


@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_fast(name):
    op = _OPS[name]
    dtype = torch.float32 if torch.float32 in op.supported_dtypes("cpu") else torch.int64
    want = EXPECTED.get(name, ("error", "error"))[0]
    # samples drawn on CPU and moved: no random-fill program to compile per sample shape (most of
    # this test's time when drawn on tpu). The expected states were measured the sweep's
    # way, on tpu-drawn samples (a few ops want a sample tensor left on CPU: tensor_split's
    # indices), so a worse state is judged again that way.
    r = v.run_opinfo(op, [dtype], 1, backward=False, timeout=600, samples_on="cpu")
    if _RANK[r.forward] > _RANK[want]:
        r = v.run_opinfo(op, [dtype], 1, backward=False, timeout=600)
    assert _RANK[r.forward] <= _RANK[want], f"{name}: forward {r.forward} worse than expected {want}: {r.detail}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_one_sample(name):
    _check(name, 1, warn_improvement=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_all_samples(name):
    _check(name, 6, warn_improvement=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode,name", [(m, n) for m, exp in MODE_EXPECTED.items() for n in sorted(exp)])
def test_opinfo_in_mode(mode, name):
    _check(name, 6, warn_improvement=False, mode=mode, expected=MODE_EXPECTED[mode])
