"""PyTorch's OpInfo suite on tpu vs CPU, checked against the committed sweep.

docs/opinfo.json is written by
`python -m torchtpu.validate ops --jobs 2 --json docs/opinfo.json --markdown docs/opinfo.md`
(up to 6 samples per dtype). The fast test runs every OpInfo once (one sample per dtype) and fails if
its state is worse than the sweep's; the slow test (`-m slow`) reruns the sweep's configuration and
also warns on improvements, so docs/opinfo.json gets regenerated and the change shows in review.
"""
import json
import os
import warnings

import pytest
import torch

from torchtpu.validate import ops as v

_SWEEP = os.path.join(os.path.dirname(__file__), "..", "docs", "opinfo.json")
with open(_SWEEP) as f:
    EXPECTED = {k: (r["forward"], r["backward"]) for k, r in json.load(f)["ops"].items()}

# Lower is better.
_RANK = {"pass-native": 0, "skipped": 0, "pass-with-fallback": 1, "mismatch": 2, "error": 3}
_OPS = {v.opinfo_name(o): o for o in v.select()}


_count = [0]


@pytest.fixture(autouse=True)
def _bounded_memory():
    """Hundreds of OpInfos compile thousands of programs: drop them now and then."""
    _count[0] += 1
    if _count[0] % 40 == 0:
        import jax

        from torchtpu.eager import deferred, executor

        executor.clear_cache()
        deferred._fused_cache.clear()
        jax.clear_caches()
    yield


def _check(name, max_samples, warn_improvement):
    r = v.run_opinfo(_OPS[name], [torch.float32, torch.int64], max_samples, backward=True, timeout=120)
    want = EXPECTED.get(name, ("error", "error"))
    got = (r.forward, r.backward)
    worse = [d for d, g, w in zip(("forward", "backward"), got, want) if _RANK[g] > _RANK[w]]
    assert not worse, f"{name}: {got} worse than the sweep's {want}: {r.detail}"
    if warn_improvement and any(_RANK[g] < _RANK[w] for g, w in zip(got, want)):
        warnings.warn(f"{name} improved to {got} (sweep: {want}); regenerate docs/opinfo.json")


# Behind the slow marker for now: on the 2-core CI machine this pass takes ~25 minutes, past
# make test's 20-minute budget; a lighter "every OpInfo once" subset is the next step (issue 3).
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_one_sample(name):
    _check(name, 1, warn_improvement=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_OPS))
def test_opinfo_all_samples(name):
    _check(name, 6, warn_improvement=True)
