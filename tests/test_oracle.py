"""The shared oracle (conftest.check) can fail: a wrong value, a wrong gradient, a result
left on the CPU; and its compile instantiation really compiles."""
import pytest
import torch

import conftest
import torchtpu
from conftest import assert_same, check, in_mode


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
