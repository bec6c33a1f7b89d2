"""The shared oracle (conftest.check) can fail: a wrong value, a wrong gradient, a result
left on the CPU; and its compile instantiation really compiles."""
import pytest
import torch

import conftest
import torchtpu
from conftest import assert_bits, assert_same, assert_values, check, in_mode


class _WrongOnTpu(torch.autograd.Function):
    """x * 2 forward; backward doubles the gradient only on tpu: a bug check(grad=True) must see."""

    @staticmethod
    def forward(ctx, x):
        ctx.tpu = x.device.type == "tpu"
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (4 if ctx.tpu else 2)


def test_check_fails_on_a_wrong_value_a_wrong_gradient_and_a_cpu_result():
    x = torch.randn(4)
    check(lambda t: t * 2, x, grad=True)
    with pytest.raises(AssertionError):
        check(lambda t: t * 2 + (t.device.type == "tpu"), x)
    with pytest.raises(AssertionError):
        check(_WrongOnTpu.apply, x, grad=True)
    with pytest.raises(AssertionError, match="not a tpu tensor"):
        check(lambda t: t.cpu() * 2, x)


def test_check_gives_the_tpu_side_the_inputs_before_an_in_place_op():
    x = torch.ones(3)
    check(lambda t: t.add_(1), x)  # CPU's call must not have changed what tpu starts from


@pytest.mark.parametrize("mode", conftest.MODES)
def test_in_mode_compiles_only_under_compile(mode):
    torchtpu.reset_metrics()
    with torchtpu.eager_mode("strict" if mode == "compile" else mode):
        out = in_mode(lambda t: t.sin() + 1, mode)(torch.ones(3, device="tpu"))
        assert_same(out, torch.ones(3).sin() + 1)
    assert (torchtpu.metrics().get("compile_graphs", 0) > 0) == (mode == "compile")


def _cpu_only_error(t):
    if t.device.type == "cpu":
        raise RuntimeError("only CPU raises")
    return t


def test_raises_compares_outcomes():
    x = torch.arange(3.0)
    err = check(lambda t: t[torch.tensor([5], device=t.device)], x, raises=True)  # CPU's IndexError, on tpu too
    assert isinstance(err, IndexError) and "index 5 is out of bounds" in str(err)
    assert check(lambda t: t + 1, x, raises=True).device.type == "tpu"  # no error: the results compared
    with pytest.raises(AssertionError, match="tpu returned"):
        check(_cpu_only_error, x, raises=True)
    with pytest.raises(AssertionError):
        check(lambda t: t * 2 + (t.device.type == "tpu"), x, raises=True)


def test_tpu_mode_runs_the_tpu_side_and_its_gradients_in_the_mode():
    before = torchtpu.metrics().get("compile_graphs", 0)
    check(lambda t: t.sin() * 2, torch.randn(4), grad=True, tpu_mode="compile")
    assert torchtpu.metrics()["compile_graphs"] > before
    with pytest.raises(AssertionError):
        check(_WrongOnTpu.apply, torch.randn(4), grad=True, tpu_mode="defer_and_fuse")


class _ContiguousGradOnTpu(torch.autograd.Function):
    """A copy; its backward hands tpu a contiguous gradient, CPU one in the cotangent's layout."""

    @staticmethod
    def forward(ctx, x):
        ctx.tpu = x.device.type == "tpu"
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.contiguous() if ctx.tpu else g * 1


def test_strides_are_the_tpu_tensors_own_and_gradients_have_them_too():
    x = torch.randn(3, 4)
    with pytest.raises(AssertionError, match="strides"):  # its .cpu() copy would be contiguous
        assert_same(x.to("tpu").t()[1:], x.t()[1:].contiguous(), check_stride=True)
    assert_same(x.to("tpu").t()[1:], x.t()[1:], check_stride=True)
    check(_ContiguousGradOnTpu.apply, x.t(), grad=True)
    with pytest.raises(AssertionError, match="strides"):  # the same result, its gradient laid out unlike CPU's
        check(_ContiguousGradOnTpu.apply, x.t(), grad=True, check_stride=True)


def test_assert_values_and_assert_bits_for_comparisons_not_against_cpu():
    t = torch.arange(4.0, device="tpu")
    assert_values([t, 3, "a"], [torch.arange(4.0), 3, "a"])  # either side may be on tpu
    assert_values(t, t.clone())
    with pytest.raises(AssertionError, match="structure"):
        assert_values([t], [t, t])
    with pytest.raises(AssertionError, match="step 2"):
        assert_values([1.0, 2.0], [1.0, 2.1], msg="step 2")
    assert_bits(torch.tensor([float("nan"), 1.0], device="tpu"), torch.tensor([float("nan"), 1.0]))
    with pytest.raises(AssertionError, match="1 differ"):
        assert_bits(torch.tensor([-0.0, 1.0]), torch.tensor([0.0, 1.0]))
    with pytest.raises(AssertionError):
        assert_bits(torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.bfloat16))
    assert_bits(torch.ones(2, dtype=torch.complex128), torch.ones(2, dtype=torch.complex128))
