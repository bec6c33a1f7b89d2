"""Autograd's error messages name tensor types as PyTorch does for CUDA: "torch.tpu.FloatTensor"
where CPU says "torch.FloatTensor" (CUDA "torch.cuda.FloatTensor"), ATen's own name for the
types PyTorch's table leaves alone (CPU "CPUBFloat16Type", CUDA "CUDABFloat16Type")."""
import pytest
import torch

import torchtpu


def _modified_saved_tensor_error(dev, dtype, via_grad):
    x = torch.randn(3, device=dev, dtype=dtype, requires_grad=True)
    y = x.sigmoid()  # saves its output for backward
    y.mul_(2)  # ... which this modifies
    with pytest.raises(RuntimeError) as info:
        if via_grad:
            torch.autograd.grad(y.sum(), x)
        else:
            y.sum().backward()
    return str(info.value)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("via_grad", [False, True])
@pytest.mark.parametrize("dtype,cpu_name,tpu_name", [
    (torch.float32, "torch.FloatTensor", "torch.tpu.FloatTensor"),
    (torch.float64, "torch.DoubleTensor", "torch.tpu.DoubleTensor"),
    (torch.bfloat16, "CPUBFloat16Type", "tpuBFloat16Type"),
])
def test_autograd_error_names_the_type_as_pytorch(mode, via_grad, dtype, cpu_name, tpu_name):
    cpu = _modified_saved_tensor_error("cpu", dtype, via_grad)
    assert f"[{cpu_name} [3]]" in cpu
    with torchtpu.eager_mode(mode):
        tpu = _modified_saved_tensor_error("tpu", dtype, via_grad)
    assert tpu == cpu.replace(cpu_name, tpu_name)


def test_other_backward_errors_pass_through_unchanged():
    x = torch.randn(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of torch.Size\(\[4\]\)"):
        (x * 2).backward(torch.ones(4, device="tpu"))
