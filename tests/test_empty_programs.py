"""An op with no element in and none out compiles no program (eager/op_program.EmptyProgram)."""
import pytest
import torch

import torchtpu
from conftest import assert_same


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.int64, torch.bool])
def test_ops_on_empty_tensors_compile_nothing_and_match_cpu(dtype):
    def run(dev):
        a = torch.empty(0, 3, dtype=dtype, device=dev)
        b = torch.zeros(2, 0, dtype=dtype, device=dev)
        outs = [a.clone(), a.t().contiguous(), torch.cat([a, a]), b.flip(1), a.to(torch.float32)]
        if dtype != torch.bool:
            outs += [a * 2, b.neg() if dtype.is_complex or dtype.is_floating_point else b - 1]
        c = a.clone()
        c.zero_()
        outs.append(c)
        return outs

    with torchtpu.eager_mode("strict"):
        torch.tpu.synchronize()
        torchtpu.reset_metrics()
        got = run("tpu")
        m = torchtpu.metrics()
    assert_same(got, run("cpu"))
    assert m.get("compiles", 0) == 0 and m["empty_programs"] >= 6, m
    # the empty executables serve their next calls too
    torchtpu.reset_metrics()
    assert_same(run("tpu"), run("cpu"))
    assert torchtpu.metrics().get("compiles", 0) == 0


def test_an_empty_input_with_a_nonempty_result_still_computes():
    with torchtpu.eager_mode("strict"):
        torchtpu.reset_metrics()
        got = torch.zeros(0, 3, device="tpu").sum(0), torch.ones(0, device="tpu").prod()
        m = torchtpu.metrics()
    # the two factories' results are empty; the sum and the product compile
    assert m["empty_programs"] == 2 and m["compiles"] == 2, m
    assert_same(got, (torch.zeros(3), torch.tensor(1.0)))


def test_a_traced_graphs_empty_constant_compiles_no_eager_program():
    # FakeTensorMode runs ops on a graph's constant tensors for real while Dynamo traces
    torch._dynamo.reset()

    def f(x):
        empty = torch.tensor([], device=x.device)
        return torch.cat([x.flatten(), empty]) * 2

    x = torch.arange(4.0)
    torchtpu.reset_metrics()
    got = torch.compile(f, backend="tpu")(x.to("tpu"))
    assert_same(got, f(x))
    m = torchtpu.metrics()
    assert m.get("compiles", 0) <= 1, m  # the graph's own program, no eager one
