"""The memo of quick keys by their bytes (csrc/hit.cpp, csrc/walk.h): a call whose arguments
read as the bytes of a key looked up before takes what the op cache held under that key
without making the key again. Calls that differ only where the key does must each get their
own program, and a cache change (an insertion, a clear) must never leave the memo answering
with a program the cache no longer holds: each against CPU, in both eager modes."""
import pytest
import torch

import torchtpu
from conftest import EAGER_MODES, assert_same, to_tpu
from torchtpu.eager import executor

pytestmark = pytest.mark.skipif(executor._fast is None, reason="the C++ extensions were not built")


def _memo_size() -> int:
    from torchtpu.runtime import _hit

    return _hit.memo_size()


def _x():
    g = torch.Generator().manual_seed(3)
    return torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)


# pairs of calls of one op whose keys differ in one place each
_PAIRS = {
    "a string keyword": (lambda x, y: torch.div(x, y, rounding_mode="floor"),
                         lambda x, y: torch.div(x, y, rounding_mode="trunc")),
    "strides": (lambda x, y: x + y, lambda x, y: x.t() + y),
    "one storage twice": (lambda x, y: x + y, lambda x, y: x + x),
    "a view's offset": (lambda x, y: x[1:] + y[1:], lambda x, y: x[:-1] + y[1:]),
    "a dtype keyword": (lambda x, y: torch.sum(x, 0, dtype=torch.float64),
                        lambda x, y: torch.sum(x, 0, dtype=torch.float32)),
    "a number's type": (lambda x, y: (x > 0).to(torch.int64) + 1, lambda x, y: (x > 0).to(torch.int64) + 1.5),
    "a static int list": (lambda x, y: x.sum((0,)), lambda x, y: x.sum((1,))),
    "a complex number's imaginary part": (lambda x, y: x * 2j, lambda x, y: x * (2 + 0j)),
    "an int past 64 bits (refused)": (lambda x, y: (x > 0).to(torch.int64) + 7,
                                      lambda x, y: (x > 0).to(torch.int64) + 2 ** 64),
    "a bool number": (lambda x, y: (x > 0) & True, lambda x, y: (x > 0) & False),
}


def _outcome(fn, x, y):
    try:
        return fn(x, y)
    except Exception as e:  # noqa: BLE001 - CPU's refusal is the expected outcome there
        return type(e)


@pytest.mark.parametrize("mode", EAGER_MODES)
@pytest.mark.parametrize("name", list(_PAIRS))
def test_calls_differing_where_the_key_does_each_match_cpu(name, mode, gate_open):
    first, second = _PAIRS[name]
    x, y = _x()
    want = [_outcome(f, x, y) for f in (first, second)]
    tx, ty = to_tpu((x, y))
    with torchtpu.eager_mode(mode):
        for _ in range(3):  # alternating, so each is found by the memo while the other is in it
            for f, w in zip((first, second), want):
                got = _outcome(f, tx, ty)
                if isinstance(w, type):
                    assert got is w, f"{name}: CPU raised {w.__name__}, tpu gave {got!r}"
                else:
                    assert_same(got, w, rtol=0, atol=0)


@torchtpu.eager_mode("strict")
def test_repeated_calls_are_found_by_the_memo(gate_open):
    g = torch.Generator().manual_seed(5)
    x, y = to_tpu((torch.randn(3, 7, 5, generator=g), torch.randn(3, 7, 5, generator=g)))  # shapes no other test uses
    before = _memo_size()
    for _ in range(3):
        torch.atan2(x, y)
        torch.atan2(x.transpose(0, 2), y.transpose(0, 2))
    assert _memo_size() >= before + 2


@pytest.mark.parametrize("mode", EAGER_MODES)
def test_a_cleared_cache_is_not_answered_from_the_memo(mode, gate_open):
    x, y = _x()
    tx, ty = to_tpu((x, y))
    with torchtpu.eager_mode(mode):
        for _ in range(3):
            assert_same(torch.hypot(tx, ty), torch.hypot(x, y))
        torchtpu.clear_caches()
        before = torchtpu.metrics().get("compiles", 0)
        for _ in range(3):
            assert_same(torch.hypot(tx, ty), torch.hypot(x, y))
        torch.tpu.synchronize()
        if mode == "strict":  # compiled again: the memo's old program was not used
            assert torchtpu.metrics().get("compiles", 0) > before


@torchtpu.eager_mode("strict")
def test_the_default_dtype_and_device_checks_key_their_calls(gate_open):
    a, b = torch.arange(1, 7).reshape(2, 3), torch.arange(2, 8).reshape(2, 3)
    ta, tb = to_tpu((a, b))
    was = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32, torch.float64):
            torch.set_default_dtype(dtype)
            assert_same(torch.true_divide(ta, tb), torch.true_divide(a, b))
    finally:
        torch.set_default_dtype(was)
    idx = torch.tensor([0, 2])
    tidx = idx.to("tpu")
    on = torchtpu.checks_enabled()
    try:
        for flag in (True, False, True, False):
            torchtpu.set_checks(flag)
            assert_same(torch.index_select(ta, 1, tidx), torch.index_select(a, 1, idx))
    finally:
        torchtpu.set_checks(on)


@torchtpu.eager_mode("strict")
def test_in_place_hits_keep_synchronize_waiting_for_the_written_buffer(gate_open):
    # the written storage's old buffer is dropped without a readiness check when the program
    # took it (csrc/hit.cpp commit): what synchronize() waits for then is the new one
    x = torch.randn(64, 64)
    t = x.to("tpu")
    want = x.clone()
    for _ in range(20):
        t.mul_(1.01).add_(0.5)
        want.mul_(1.01).add_(0.5)
    torch.tpu.synchronize()
    assert_same(t, want)
