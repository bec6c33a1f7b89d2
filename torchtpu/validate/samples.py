"""An OpInfo's samples, drawn without PyTorch's test-function lookup.

`op.sample_inputs(...)` / `op.error_inputs(...)` wrap their samples in common_utils'
TrackedInputIter, whose constructor calls `extract_test_fn()`: an `inspect.stack()` that
reads the source of every frame on the stack, looking for a unittest.TestCase. Our sweeps
and tests have none, so it always finds nothing (the samples are then seeded with
common_utils.SEED), yet under pytest's deep stacks it is a large share of a quick OpInfo
test's time. The lookup is skipped only while our samples are drawn, so the
samples and their seed are exactly what PyTorch's own iterator gives.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Iterator

from torch.testing._internal import common_utils
from torch.testing._internal.opinfo import core as opinfo_core

# both modules hold the function under that name (opinfo.core imports it from common_utils)
_HOLDERS = (common_utils, opinfo_core)


@contextlib.contextmanager
def _no_test_fn_lookup():
    saved = [m.extract_test_fn for m in _HOLDERS]
    for m in _HOLDERS:
        m.extract_test_fn = _no_test_fn
    try:
        yield
    finally:
        for m, fn in zip(_HOLDERS, saved):
            m.extract_test_fn = fn


def _no_test_fn():
    return None


def sample_inputs(op, device, dtype, limit: int | None = None, **kwargs) -> Iterator:
    """`op.sample_inputs(device, dtype, **kwargs)`, lazily, stopping after `limit` (None: all).
    The lookup happens only when the iterator is made, so iterating it later is as fast."""
    with _no_test_fn_lookup():
        return itertools.islice(op.sample_inputs(device, dtype, **kwargs), limit)


def error_inputs(op, device, **kwargs) -> list:
    """`op.error_inputs(device, **kwargs)`, as a list."""
    with _no_test_fn_lookup():
        return list(op.error_inputs(device, **kwargs))
