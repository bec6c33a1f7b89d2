"""Device-side checks: what CPU PyTorch rejects in the data raises on tpu too.

Each case runs the same program on CPU and on tpu in strict, debug, defer_and_fuse and
compiled modes: CPU raises, tpu raises the same exception class naming the op at or
before the next host read, and the device keeps working afterwards (later ops are
right, tensors the failed op did not write are intact)."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu.runtime import checks as pending_checks
from conftest import ALL_MODES, assert_same


def _x():
    return torch.arange(6.0).reshape(2, 3)


def _long(*v):
    return torch.tensor(v, dtype=torch.int64)


# name: (inputs, program, a substring of the op's name the error must carry)
CASES = {
    "gather": (lambda: (_x(), _long([0, 5], [1, 2])), lambda x, i: torch.gather(x, 1, i) * 2, "gather"),
    "gather_negative": (lambda: (_x(), _long([0, -1], [1, 2])), lambda x, i: torch.gather(x, 1, i), "gather"),
    "scatter": (lambda: (_x(), _long([0, 5])), lambda x, i: x.scatter(1, i, 1.0), "scatter"),
    "scatter_add": (lambda: (_x(), _long([0, 5])), lambda x, i: x.scatter_add(1, i, torch.ones_like(x)), "scatter"),
    "scatter_reduce": (lambda: (_x(), _long([0, 5])),
                       lambda x, i: x.scatter_reduce(1, i, torch.ones_like(x), "amax"), "scatter"),
    "index_select": (lambda: (_x(), _long(0, 5)), lambda x, i: torch.index_select(x, 0, i), "index_select"),
    "index_add": (lambda: (_x(), _long(5)), lambda x, i: x.index_add(0, i, torch.ones(1, 3, device=x.device)),
                  "index_add"),
    "index_copy": (lambda: (_x(), _long(5)), lambda x, i: x.index_copy(0, i, torch.ones(1, 3, device=x.device)),
                   "index_copy"),
    "index_fill": (lambda: (_x(), _long(5)), lambda x, i: x.index_fill(0, i, -1.0), "index_fill"),
    "embedding": (lambda: (torch.randn(4, 3), _long(0, 7)), lambda w, i: F.embedding(i, w), "embedding"),
    "embedding_bag": (lambda: (torch.randn(4, 3), _long(0, 7)),
                      lambda w, i: F.embedding_bag(i, w, torch.zeros(1, dtype=torch.int64, device=w.device)),
                      "embedding_bag"),
    "advanced_index": (lambda: (_x(), _long(0, 5)), lambda x, i: x[i] + 1, "index"),
    "advanced_index_dim1": (lambda: (_x(), _long(0, -4)), lambda x, i: x[:, i], "index"),
    "index_put": (lambda: (_x(), _long(5)), lambda x, i: x.index_put((i,), torch.tensor(1.0, device=x.device)),
                  "index_put"),
    "index_put_accumulate": (lambda: (_x(), _long(-3)),
                             lambda x, i: x.index_put((i,), torch.tensor(1.0, device=x.device), accumulate=True),
                             "index_put"),
    "take": (lambda: (_x(), _long(7)), lambda x, i: torch.take(x, i), "take"),
    "put": (lambda: (_x(), _long(-7)), lambda x, i: x.put(i, torch.ones(1, device=x.device)), "put"),
    "one_hot": (lambda: (_long(0, 5),), lambda i: F.one_hot(i, 3), "scatter|one_hot"),
    "cross_entropy": (lambda: (torch.randn(2, 3), _long(0, 5)), lambda x, t: F.cross_entropy(x, t), "nll_loss"),
    "nll_loss_negative": (lambda: (torch.randn(2, 3), _long(-5, 1)), lambda x, t: F.nll_loss(x, t), "nll_loss"),
    "nll_loss2d": (lambda: (torch.randn(2, 3, 2, 2), torch.full((2, 2, 2), 4)),
                   lambda x, t: F.nll_loss(x, t), "nll_loss2d"),
    "multinomial_negative": (lambda: (torch.tensor([0.5, -0.1]),), lambda p: torch.multinomial(p, 1), "multinomial"),
    "multinomial_zero": (lambda: (torch.zeros(2, 3),), lambda p: torch.multinomial(p, 1, True), "multinomial"),
    "bernoulli": (lambda: (torch.tensor([0.5, 1.5]),), lambda p: torch.bernoulli(p), "bernoulli"),
    "floor_divide": (lambda: (_long(1, 2), _long(1, 0)), lambda a, b: torch.floor_divide(a, b), "floor_divide"),
    "div_trunc": (lambda: (_long(1, 2), _long(1, 0)), lambda a, b: torch.div(a, b, rounding_mode="trunc"), "div"),
    "div_floor_scalar": (lambda: (_long(1, 2),), lambda a: torch.div(a, 0, rounding_mode="floor"), "div"),
    "remainder": (lambda: (_long(1, 2), _long(1, 0)), lambda a, b: torch.remainder(a, b), "remainder"),
    "fmod": (lambda: (_long(1, 2), _long(0, 1)), lambda a, b: torch.fmod(a, b), "fmod"),
}

# Cases torch.compile cannot express as one device program: Dynamo graph-breaks on them
# or runs them outside the graph; their compiled run still goes through the eager checks.
_RANDOM = {"multinomial_negative", "multinomial_zero", "bernoulli"}
# one_hot's CPU kernel checks its classes on the host; on a device (CUDA too) it is a
# scatter whose index check fires, with the scatter's message
_SCATTER_TEXT = {"one_hot"}


def _cpu_error(prog, inputs):
    with pytest.raises(Exception) as ei:
        prog(*inputs)
    return ei.value


def _run_tpu(mode, prog, inputs):
    """Issue the program in `mode`, then read its result on the host."""
    if mode == "compile":
        torch._dynamo.reset()
        fn = torch.compile(prog, backend="tpu")
        with torchtpu.eager_mode("strict"):
            out = fn(*inputs)
            out.cpu()
        return
    with torchtpu.eager_mode(mode):
        out = prog(*inputs)
        out.cpu()


def _after(inputs, cpu_inputs):
    """The device still works: a new op is right and the inputs are intact."""
    assert_same(list(inputs), list(cpu_inputs))
    assert_same([t * 2 for t in inputs], [c * 2 for c in cpu_inputs])


# compiled mode costs a Dynamo trace per case: the fast suite compiles a few, the rest is slow
_COMPILED_FAST = {"gather", "index_put", "embedding", "cross_entropy", "one_hot", "floor_divide", "take"}


def _params():
    out = []
    for case in CASES:
        for mode in ALL_MODES:
            slow = mode == "compile" and case not in _COMPILED_FAST
            out.append(pytest.param(case, mode, marks=[pytest.mark.slow] if slow else [], id=f"{case}-{mode}"))
    return out


@pytest.mark.parametrize("case,mode", _params())
def test_cpu_error_is_raised_on_tpu(case, mode):
    make, prog, opname = CASES[case]
    if mode == "compile" and case in _RANDOM:
        pytest.skip("random ops graph-break under torch.compile; the eager modes cover them")
    cpu = make()
    err = _cpu_error(prog, cpu)
    tpu = [t.to("tpu") for t in cpu]
    with pytest.raises(type(err)) as ei:
        _run_tpu(mode, prog, tpu)
    assert type(ei.value) is type(err)
    msg = str(ei.value)
    assert any(n in msg for n in opname.split("|")), msg
    if case not in _SCATTER_TEXT:  # CPU's own message, where CUDA's device asserts lose it
        assert msg.startswith(str(err).split("\n")[0]), (str(err), msg)
    assert pending_checks.pending() == 0
    _after(tpu, cpu)


def test_error_names_the_users_line_and_the_bound():
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    y = torch.gather(x, 1, torch.tensor([[0, 7]], device="tpu"))  # the issuing line
    with pytest.raises(RuntimeError, match=r"index 7 is out of bounds for dimension 1 with size 3") as ei:
        y.cpu()
    assert "test_device_checks.py" in str(ei.value) and "gather" in str(ei.value)


def test_no_host_round_trip_until_a_host_read():
    x = torch.arange(6.0, device="tpu")
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    with torchtpu.eager_mode("strict"):
        y = x[torch.tensor([0, 9], device="tpu")]  # bad, but nothing raises yet
        z = y + 1
        assert pending_checks.pending() >= 1
        assert torchtpu.metrics()["transfers_to_host"] == 0
        with pytest.raises(IndexError, match="index 9 is out of bounds"):
            torch.tpu.synchronize()
    assert pending_checks.pending() == 0
    assert z.shape == (2,)
    assert_same(x, torch.arange(6.0))


def test_valid_indices_raise_nothing_in_any_mode():
    x = torch.randn(5, 5)
    i = torch.tensor([[0, 4, -1], [3, 2, 1]])
    ref = (x[i[0]] + torch.gather(x, 1, i.abs().T.repeat(2, 1)[:4]).sum()) % 3
    for mode in ("strict", "debug", "defer_and_fuse"):
        with torchtpu.eager_mode(mode):
            xt, it = x.to("tpu"), i.to("tpu")
            got = (xt[it[0]] + torch.gather(xt, 1, it.abs().T.repeat(2, 1)[:4]).sum()) % 3
            assert_same(got, ref)


def test_one_flag_array_per_fused_region_and_the_first_error_wins():
    x = torch.arange(6.0, device="tpu")
    torch.tpu.synchronize()
    with torchtpu.eager_mode("defer_and_fuse"):
        a = x[torch.tensor([8], device="tpu")]
        b = torch.take(x, torch.tensor([100], device="tpu"))
        c = a + b
        keep = x * 3
        from torchtpu.eager import deferred

        deferred.flush("test")
        assert pending_checks.pending() == 1  # one packed array for the whole region
        with pytest.raises(IndexError, match="index 8 is out of bounds") as ei:
            keep.cpu()
        assert "index.Tensor" in str(ei.value)
        # the failed region's outputs raise a clear error when read; its input is intact
        with pytest.raises(RuntimeError, match="value was lost"):
            c.cpu()
        assert_same(x, torch.arange(6.0))
        assert_same(x + 1, torch.arange(6.0) + 1)


def test_checks_off_keeps_xla_semantics():
    x = torch.arange(6.0, device="tpu")
    torchtpu.set_checks(False)
    try:
        assert not torchtpu.checks_enabled()
        y = x[torch.tensor([0, 9], device="tpu")]
        assert y.cpu().tolist() == [0.0, 5.0]  # clamped, as XLA does
        assert pending_checks.pending() == 0
    finally:
        torchtpu.set_checks(True)
    assert torchtpu.checks_enabled()
    with pytest.raises(IndexError):
        x[torch.tensor([0, 9], device="tpu")].cpu()


def test_debug_mode_raises_at_the_op():
    x = torch.arange(6.0, device="tpu")
    with torchtpu.eager_mode("debug"):
        with pytest.raises(IndexError, match="out of range in self"):
            torch.index_select(x, 0, torch.tensor([6], device="tpu"))  # no host read needed
    assert_same(x - 1, torch.arange(6.0) - 1)


def test_training_step_with_ignore_index_is_not_a_false_positive():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10)
    ids = torch.tensor([[1, 2, 9], [0, 3, 4]])
    tgt = torch.tensor([[2, -100, 9], [3, 4, -100]])
    ref = F.cross_entropy(head(emb(ids)).reshape(-1, 10), tgt.reshape(-1), ignore_index=-100)
    emb_t, head_t = emb.to("tpu"), head.to("tpu")
    for mode in ("strict", "defer_and_fuse"):
        with torchtpu.eager_mode(mode):
            loss = F.cross_entropy(head_t(emb_t(ids.to("tpu"))).reshape(-1, 10), tgt.to("tpu").reshape(-1),
                                   ignore_index=-100)
            loss.backward()
            assert_same(loss, ref)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_assert_async_in_every_eager_mode(mode):
    # TorchTitan's RoPE asserts on device values each forward; an op with no outputs used to
    # crash defer_and_fuse's recorder (TypeError: 'NoneType' object is not iterable)
    with torchtpu.eager_mode(mode):
        t = torch.arange(5, device="tpu")
        assert torch._assert_async(t.max() <= 127, "in range") is None
        assert (t * 2).sum().item() == 20
        torch._assert_async(t.max() > 127, "t is below 127")
        with pytest.raises(RuntimeError, match="t is below 127"):
            torch.tpu.synchronize()
    assert pending_checks.pending() == 0
