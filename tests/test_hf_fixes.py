"""Backend fixes found by the Hugging Face sweep (issue 6), one test per fix."""
import pytest
import torch

import torchtpu  # noqa: F401
from conftest import assert_same


def _grads_as_cpu(mod_cls, x, h0, **kw):
    """The recurrent module on CPU and on tpu (the same seeded weights): output, hidden state
    and the gradients of a loss over both for the inputs and every parameter."""
    torch.manual_seed(0)
    cpu = mod_cls(**kw)
    tpu = mod_cls(**kw)
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    outs = []
    for m, dev in ((cpu, "cpu"), (tpu, "tpu")):
        xi = x.to(dev).requires_grad_()
        hi = tuple(h.to(dev).requires_grad_() for h in h0)
        out, hn = m(xi, hi if len(hi) > 1 else hi[0])
        hn = hn if isinstance(hn, tuple) else (hn,)
        loss = out.sin().sum() + sum((h * h).sum() for h in hn)
        grads = torch.autograd.grad(loss, [xi, *hi, *m.parameters()])
        outs.append((out, hn, grads))
    assert_same(outs[1], outs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_fused_cell(no_fallback, bias):
    # nn.LSTM on a non-CPU device runs aten::_thnn_fused_lstm_cell (+ _backward_impl), which has
    # no CPU kernel to fall back to (parakeet / nemotron ASR decoders).
    x = torch.randn(3, 5, 4)
    h0 = (torch.randn(2, 5, 6), torch.randn(2, 5, 6))
    _grads_as_cpu(torch.nn.LSTM, x, h0, input_size=4, hidden_size=6, num_layers=2, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_gru_fused_cell(no_fallback, bias):
    x = torch.randn(3, 5, 4)
    h0 = (torch.randn(1, 5, 6),)
    _grads_as_cpu(torch.nn.GRU, x, h0, input_size=4, hidden_size=6, bias=bias)


def test_lstm_cell_no_hidden_grad(no_fallback):
    # only the output is used: grad_cy arrives undefined
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(4, 6)
    tcell = torch.nn.LSTMCell(4, 6)
    tcell.load_state_dict(cell.state_dict())
    tcell = tcell.to("tpu")
    x = torch.randn(3, 4)
    h = (torch.randn(3, 6), torch.randn(3, 6))
    g1 = torch.autograd.grad(cell(x, h)[0].sum(), list(cell.parameters()))
    g2 = torch.autograd.grad(tcell(x.to("tpu"), tuple(t.to("tpu") for t in h))[0].sum(), list(tcell.parameters()))
    assert_same(g2, g1, atol=1e-5, rtol=1e-5)

