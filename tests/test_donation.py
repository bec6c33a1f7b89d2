"""The one donation rule (runtime/donation.exclusively_held) on the running Python.

A buffer is handed to XLA to overwrite only when nothing but the program's own argument
list and the holders the caller names (its storage entry) references it. The rule reads
a reference count, a CPython detail; supported: CPython 3.11-3.13, where a container's
element nothing else holds counts 2 as the rule takes it (the container, the call's
argument). 3.14 stops counting some evaluation-stack references: the calibration at
import (donation.ALONE) follows it, and the end-to-end tests below say whether it still
holds there.
"""
import sys

import numpy as np
import pytest
import torch

import torchtpu
from conftest import assert_same
from torchtpu.runtime import donation, executables, storage

SUPPORTED = {(3, 11), (3, 12), (3, 13)}


def test_refcount_convention_pinned_on_this_python():
    if sys.version_info[:2] not in SUPPORTED:
        pytest.skip(f"CPython {sys.version_info[:2]} is not a pinned version (calibrated: ALONE={donation.ALONE})")
    assert donation.ALONE == 2


def test_exclusively_held_counts_every_other_reference():
    bufs = [object(), object()]
    assert donation.exclusively_held(bufs, 0)
    other = bufs[1]  # a second holder the rule is not told about
    assert not donation.exclusively_held(bufs, 1)
    assert donation.exclusively_held(bufs, 1, holders=1)  # ... and one it is told about
    del other
    assert donation.exclusively_held(bufs, 1)
    again = [bufs[0]]  # another container
    assert not donation.exclusively_held(bufs, 0)
    assert donation.exclusively_held(again, 0, holders=1)


def test_strict_partial_write_donates_only_a_buffer_nothing_else_holds():
    n = 1 << 17
    big = torch.zeros(n, device="tpu")
    g = torch.arange(1024.0, device="tpu")
    with torchtpu.eager_mode("strict"):
        torchtpu.reset_metrics()
        big[:1024].copy_(g)  # warm up: the first call traces
        big[1024:2048].copy_(g)
        assert torchtpu.metrics().get("donated_writes", 0) >= 1
        held = storage.lookup(big).buf  # now someone else sees the old buffer
        torchtpu.reset_metrics()
        big[2048:3072].copy_(g)
        assert torchtpu.metrics().get("donated_writes", 0) == 0
    want = torch.zeros(n)
    want[:2048] = torch.arange(1024.0).repeat(2)
    np.testing.assert_array_equal(np.asarray(held), want.numpy())  # still readable, unchanged
    want[2048:3072] = torch.arange(1024.0)
    assert_same(big, want)


def _donating_regions():
    return [k for k in executables.regions if k.donated]


def test_deferred_region_donates_overwritten_inputs_but_not_held_ones(monkeypatch):
    from torchtpu.eager import deferred

    monkeypatch.setattr(deferred, "DONATE", True)  # TORCHTPU_DEFER_DONATE=1 (off by default)
    p = torch.ones(1000, device="tpu")
    torch.tpu.synchronize()  # p is a buffer (as a parameter is), not still pending, under either default mode
    with torchtpu.eager_mode("defer_and_fuse"):
        executables.regions.clear()
        # an earlier test may have marked mul or add as churning (its regions are replayed op
        # by op, without donation) in this process
        deferred.forget_signatures()
        p.mul_(2.0).add_(1.0)
        torch.tpu.synchronize()
        assert _donating_regions()  # the old parameter buffer went to XLA
        executables.regions.clear()
        held = storage.lookup(p).buf
        p.mul_(2.0).add_(1.0)
        torch.tpu.synchronize()
        assert not _donating_regions()
    np.testing.assert_array_equal(np.asarray(held), np.full(1000, 3.0, np.float32))
    assert_same(p, torch.full((1000,), 7.0))


@pytest.mark.slow  # a Dynamo compile: ~10 s on the loaded 2-core machine
def test_compiled_graph_donates_mutated_input_but_not_held_one():
    def step(p, g):
        p.add_(g)
        return p.sum()

    f = torch.compile(step, backend="tpu", fullgraph=True)
    p = torch.zeros(64, device="tpu")
    g = torch.ones(64, device="tpu")
    f(p, g)
    held = storage.lookup(p).buf
    f(p, g)
    np.testing.assert_array_equal(np.asarray(held), np.ones(64, np.float32))  # not overwritten
    del held
    f(p, g)
    assert_same(p, torch.full((64,), 3.0))
