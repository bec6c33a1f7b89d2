"""A training step over a varying number of rows compiles once per bucket: the loss
(nll_loss forward and backward), softmax backward and embedding backward have rules over a
dynamic dim, and a small static argument of the varying size (the targets beside dynamic
scores) is padded for the call through the host instead of keying the program by its size.

Each check runs sizes in two buckets against CPU (values and gradients); the second size of
a bucket must compile nothing new."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import EAGER_MODES, assert_same, modes

SIZES = (20, 27, 40, 50)  # buckets 32, 32, 64, 64
AGAIN = (27, 50)


def _compiles():
    return torchtpu.metrics()["compiles"]


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _over_sizes(mode, step):
    """step(n, device, mark) -> tensors, on CPU and on tpu (with `mark` marking its varying
    inputs); the tpu results must match CPU's and a bucket's second size compile nothing."""
    with torchtpu.eager_mode(mode):
        for n in SIZES:
            want = step(n, "cpu", lambda t, d: t)
            before = _compiles()
            got = step(n, "tpu", lambda t, d: torchtpu.mark_dynamic(t, d, 1, 64))
            torch.tpu.synchronize()
            new = _compiles() - before
            assert_same(got, want, atol=1e-5, rtol=1e-5)
            if n in AGAIN:
                assert new == 0, f"size {n}: {new} new programs in a bucket already compiled"


def _scores(n, dev, mark, classes=7):
    x = torch.randn(n, classes, generator=_g(n)).to(dev)
    return mark(x, 0).requires_grad_()


@pytest.mark.parametrize("mode", modes(*EAGER_MODES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_over_varying_rows(mode, reduction):
    weight = torch.rand(7, generator=_g(1)) + 0.5

    def step(n, dev, mark):
        x = _scores(n, dev, mark)
        target = torch.randint(0, 7, (n,), generator=_g(n + 1))
        target[::5] = -100  # ignore_index rows among the valid ones
        loss = F.cross_entropy(x, target.to(dev), weight=weight.to(dev), reduction=reduction)
        cot = torch.randn(loss.shape, generator=_g(n + 2)).to(dev)
        (grad,) = torch.autograd.grad(loss, x, cot)
        return loss.detach(), grad

    _over_sizes(mode, step)


@pytest.mark.parametrize("mode", modes(*EAGER_MODES))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_backward_along_and_across_the_varying_dim(mode, log):
    f = F.log_softmax if log else F.softmax

    def step(n, dev, mark):
        x = _scores(n, dev, mark)
        ys = [f(x, dim=0), f(x, dim=1)]
        cots = [torch.randn(n, 7, generator=_g(n + k)).to(dev) for k in (3, 4)]
        return tuple(torch.autograd.grad(y, x, c)[0] for y, c in zip(ys, cots))

    _over_sizes(mode, step)


@pytest.mark.parametrize("mode", modes(*EAGER_MODES))
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 3}, {"scale_grad_by_freq": True}],
                         ids=["plain", "padding_idx", "scale_grad_by_freq"])
def test_embedding_backward_over_varying_indices(mode, kw):
    table = torch.randn(10, 4, generator=_g(5))

    def step(n, dev, mark):
        w = table.to(dev).requires_grad_()
        ids = mark(torch.randint(0, 10, (n,), generator=_g(n)).to(dev), 0)
        out = F.embedding(ids, w, **kw)
        (grad,) = torch.autograd.grad(out, w, torch.randn(n, 4, generator=_g(n + 6)).to(dev))
        return grad

    _over_sizes(mode, step)


@pytest.mark.parametrize("mode", modes(*EAGER_MODES))
def test_unannotated_training_loop_compiles_per_bucket(mode):
    """No mark_dynamic: the embedding's index length varies step to step (eager/dynamism.py
    vary_index), and everything after it, loss and backward included, stays in buckets."""
    lengths = (41, 50, 44, 63, 37, 58)  # one bucket (64) after the first, exact, size

    def train(dev):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 32)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses, programs = [], []
        for k, n in enumerate(lengths):
            ids = torch.randint(0, 32, (1, n), generator=_g(k)).to(dev)
            before = _compiles() if dev == "tpu" else 0
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 32), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if dev == "tpu":
                torch.tpu.synchronize()
                programs.append(_compiles() - before)
        return torch.stack(losses), [p.detach() for p in model.parameters()], programs

    want_loss, want_params, _ = train("cpu")
    with torchtpu.eager_mode(mode):
        got_loss, got_params, programs = train("tpu")
    assert_same((got_loss, got_params), (want_loss, want_params), atol=1e-5, rtol=1e-5)
    assert programs[2:] == [0] * (len(lengths) - 2), programs


@pytest.mark.parametrize("mode", modes(*EAGER_MODES))
@pytest.mark.parametrize("case", ["causal", "plain", "keys_with_mask"])
def test_attention_backward_over_varying_lengths(mode, case):
    """The fused attention's backward keeps the rows (queries) and the keys in their buckets:
    padded rows add nothing to the keys' gradients, padded keys are masked."""
    def step(n, dev, mark):
        g = _g(n)
        rows = 8 if case == "keys_with_mask" else n
        q = torch.randn(1, 4, rows, 8, generator=g).to(dev)
        k, v = (torch.randn(1, 4, n, 8, generator=g).to(dev) for _ in range(2))
        if case != "keys_with_mask":
            q = mark(q, 2)
        k, v = mark(k, 2), mark(v, 2)
        xs = [t.requires_grad_() for t in (q, k, v)]
        mask = (torch.rand(rows, n, generator=g) > 0.3).to(dev) if case == "keys_with_mask" else None
        out = F.scaled_dot_product_attention(*xs, attn_mask=mask, is_causal=case == "causal")
        return (out.detach(),) + torch.autograd.grad(out, xs, torch.randn(1, 4, rows, 8, generator=g).to(dev))

    _over_sizes(mode, step)
