"""The common views as C++ kernels (csrc/views.h): the geometry, values, aliasing, lazy bits,
autograd and errors each view op gives on CPU, in strict, defer_and_fuse and compiled code;
calls off the C++ fast path (bad dims, symbolic sizes) reach the Python kernel and its errors."""
from __future__ import annotations

import pytest
import torch

import torchtpu
from torchtpu.runtime import tensors

pytestmark = pytest.mark.skipif(getattr(tensors.native, "register_view", None) is None,
                                reason="the C++ extension is not built")

# (name, view of x): each a call the C++ kernel serves, on a (4, 6, 5) tensor
VIEWS = [
    ("select", lambda x: x.select(1, 2)),
    ("select_neg", lambda x: x.select(-1, -2)),
    ("index_int", lambda x: x[3]),
    ("slice", lambda x: x[1:3]),
    ("slice_step", lambda x: x[:, 1:6:2]),
    ("slice_neg", lambda x: x[:, -4:-1]),
    ("slice_clamped", lambda x: x[:, 4:100]),
    ("slice_empty", lambda x: x[:, 5:2]),
    ("narrow", lambda x: x.narrow(2, 1, 3)),
    ("t", lambda x: x[0].t()),
    ("t_1d", lambda x: x[0, 0].t()),
    ("transpose", lambda x: x.transpose(0, 2)),
    ("transpose_neg", lambda x: x.transpose(-1, -3)),
    ("mT", lambda x: x.mT),
    ("permute", lambda x: x.permute(2, 0, 1)),
    ("permute_neg", lambda x: x.permute(-1, -3, -2)),
    ("unsqueeze", lambda x: x.unsqueeze(1)),
    ("unsqueeze_end", lambda x: x.unsqueeze(-1)),
    ("unsqueeze_front", lambda x: x.unsqueeze(-4)),
    ("squeeze_dim", lambda x: x[:, :1].squeeze(1)),
    ("squeeze_dim_kept", lambda x: x.squeeze(1)),
    ("expand", lambda x: x[:, :1].expand(4, 3, 5)),
    ("expand_new", lambda x: x[0, :1].expand(2, 3, -1, 5)),
    ("expand_as", lambda x: x[:1].expand_as(x)),
    ("view", lambda x: x.view(24, 5)),
    ("view_infer", lambda x: x.view(-1)),
    ("reshape", lambda x: x.reshape(4, 30)),
    ("as_strided", lambda x: x.as_strided((3, 4), (5, 1), 7)),
    ("as_strided_no_offset", lambda x: x[1].as_strided((2, 2), (1, 5))),
    ("as_strided_to_end", lambda x: x.as_strided((119,), (1,), 1)),
    ("as_strided_empty", lambda x: x.as_strided((0, 4), (500, 1), 119)),
    ("as_strided_overlap", lambda x: x.as_strided((4, 4), (1, 1))),
    ("squeeze_all", lambda x: x[:, :1, 2:3].squeeze()),
    ("squeeze_dims", lambda x: x[:1, :, :1].squeeze((0, 2))),
    ("diagonal", lambda x: x.diagonal(1, 1, 2)),
    ("movedim", lambda x: x.movedim(0, -1)),
    ("chain", lambda x: x[1:, ::2].transpose(0, 1)[1].t().unsqueeze(0)),
]


def _geometry(t):
    return tuple(t.shape), t.stride(), t.storage_offset()


@pytest.mark.parametrize("name,fn", VIEWS, ids=[v[0] for v in VIEWS])
def test_view_like_cpu(name, fn):
    c = torch.arange(120.0).reshape(4, 6, 5)
    t = c.to("tpu")
    vc, vt = fn(c), fn(t)
    assert _geometry(vt) == _geometry(vc)
    assert vt.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()  # an alias
    assert vt.device == t.device and vt.dtype == t.dtype
    torch.testing.assert_close(vt.cpu(), vc)
    # a write through the view reaches the base, as on CPU
    if vc.numel() and "overlap" not in name:  # (writes through overlapping views: undefined)
        fn(c).add_(1000) if vc.stride().count(0) == 0 else None
        fn(t).add_(1000) if vc.stride().count(0) == 0 else None
        torch.testing.assert_close(t.cpu(), c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex64, torch.int64, torch.bool])
def test_dtypes(dtype):
    c = (torch.arange(30).reshape(5, 6) % 3).to(dtype)
    t = c.to("tpu")
    for fn in (lambda x: x[2], lambda x: x[:, 1:4].t(), lambda x: x.unsqueeze(0).expand(2, 5, 6),
               lambda x: x.permute(1, 0)[3:]):
        torch.testing.assert_close(fn(t).cpu(), fn(c))
        assert _geometry(fn(t)) == _geometry(fn(c))


def test_lazy_bits_kept():
    c = torch.randn(3, 4, dtype=torch.complex64)
    t = c.to("tpu")
    for fn in (lambda x: x.conj()[1], lambda x: x.conj().t(), lambda x: (-x.conj()).imag[1:],
               lambda x: torch._neg_view(x).unsqueeze(0)):
        vc, vt = fn(c), fn(t)
        assert (vt.is_conj(), vt.is_neg()) == (vc.is_conj(), vc.is_neg())
        torch.testing.assert_close(vt.cpu(), vc)


@pytest.mark.parametrize("call", [
    lambda x: x.select(3, 0), lambda x: x.select(1, 6), lambda x: x.select(1, -7),
    lambda x: x[:, ::-1], lambda x: x[:, ::0], lambda x: x.transpose(0, 3),
    lambda x: x.permute(0, 0, 1), lambda x: x.permute(0, 1), lambda x: x.unsqueeze(4),
    lambda x: x.unsqueeze(-5), lambda x: x.squeeze(3), lambda x: x.expand(4, 7, 5),
    lambda x: x.expand(6, 5), lambda x: x.expand(-1, 4, 6, 5), lambda x: x.view(7, -1),
    lambda x: x.t(), lambda x: x.transpose(1, 2).view(-1), lambda x: x.narrow(1, 4, 5),
    lambda x: torch.tensor(1.0, device=x.device).select(0, 0),
    lambda x: x.as_strided((5, 5), (30, 1), 1), lambda x: x.as_strided((-2,), (1,), 4),
    lambda x: x.as_strided((2,), (1,), -1), lambda x: x.as_strided((2,), (1,), 119),
    lambda x: x.as_strided((2, 2), (1,)), lambda x: x.as_strided((2,), (-1,), 4),
    lambda x: x[1:].as_strided((121,), (1,), 0), lambda x: x.split(0), lambda x: x.split([2, 3]),
    lambda x: x.chunk(0), lambda x: x.diagonal(0, 1, 1),
])
def test_errors_like_cpu(call):
    c = torch.randn(4, 6, 5)
    with pytest.raises(Exception) as cpu_err:
        call(c)
    with pytest.raises(type(cpu_err.value)):
        call(c.to("tpu"))


@pytest.mark.parametrize("call", [
    lambda x: x.split(4), lambda x: x.split(2, -1), lambda x: x.chunk(3, 1), lambda x: x.unbind(1),
    lambda x: x.split([1, 3], 0), lambda x: x.tensor_split(3, 2), lambda x: x[:, 1:].split(2, 1),
])
def test_splits_like_cpu(call):
    """split.Tensor is PyTorch's composite over the C++ slices; the others were already."""
    c = torch.arange(120.0).reshape(4, 6, 5)
    t = c.to("tpu")
    got, want = call(t), call(c)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert _geometry(g) == _geometry(w)
        assert g.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        torch.testing.assert_close(g.cpu(), w)


def test_as_strided_bound_follows_a_resize():
    """as_strided's bound is the bytes the storage table holds, grown by resize_ as on CPU."""
    c, t = torch.arange(6.0), torch.arange(6.0, device="tpu")
    for x in (c, t):
        x.resize_(10)
        x[6:] = 1.0
    torch.testing.assert_close(t.as_strided((2, 5), (5, 1)).cpu(), c.as_strided((2, 5), (5, 1)))
    with pytest.raises(RuntimeError):
        c.as_strided((11,), (1,))
    with pytest.raises(RuntimeError):
        t.as_strided((11,), (1,))


def test_zero_dim():
    c = torch.tensor(3.5)
    t = c.to("tpu")
    for fn in (lambda x: x.t(), lambda x: x.unsqueeze(0), lambda x: x.unsqueeze(-1), lambda x: x.expand(3, 2),
               lambda x: x.view(1, 1), lambda x: x.squeeze(0), lambda x: x.transpose(0, -1)):
        vc, vt = fn(c), fn(t)
        assert _geometry(vt) == _geometry(vc)
        torch.testing.assert_close(vt.cpu(), vc)


def test_autograd_through_views():
    c = torch.randn(4, 6, requires_grad=True)
    t = c.detach().to("tpu").requires_grad_()
    for x in (c, t):
        y = (x[1:3].t().unsqueeze(0).expand(2, 6, 2) * torch.arange(24.0, device=x.device).view(2, 6, 2)).sum()
        y = y + x.select(1, 4).sum() * 3 + x.permute(1, 0)[2].sum()
        y.backward()
    torch.testing.assert_close(t.grad.cpu(), c.grad)
    assert t[0]._base is t and t[1:].t()._base is t  # views, as autograd sees them


def test_in_place_on_views_of_views():
    c = torch.zeros(8, 8)
    t = c.to("tpu")
    for x in (c, t):
        x[2:6, 1:7][1:3, ::2].mul_(0).add_(5)
        x.t()[3].add_(1)
        x[5].unsqueeze(0).expand(3, 8).sum()
    torch.testing.assert_close(t.cpu(), c)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_row_add_modes(mode):
    c1, c2 = torch.randn(16, 16), torch.randn(16, 16)
    a, b = c1.to("tpu"), c2.to("tpu")
    with torchtpu.eager_mode(mode):
        outs = [a[i] + b[15 - i] for i in range(16)] + [a[:5, :12].mul(2), a.t()[3:] - b[3:]]
        torch.tpu.synchronize()
    want = [c1[i] + c2[15 - i] for i in range(16)] + [c1[:5, :12].mul(2), c1.t()[3:] - c2[3:]]
    for o, w in zip(outs, want):
        torch.testing.assert_close(o.cpu(), w)


def test_compiled_views():
    def f(x, y):
        return x[1:3].t() @ y[:, 2:4] + x.permute(1, 0).unsqueeze(0).sum(0)[:, 1:3]

    c1, c2 = torch.randn(6, 4), torch.randn(2, 5)
    got = torch.compile(f, backend="tpu")(c1.to("tpu"), c2.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(c1, c2))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_view_of_a_growth_reaches_the_python_kernel(mode):
    """Ids grown along their last dim hold a bucket's padded strides (eager/dynamism.py): a
    view merging that dim throws in Meta's kernel, and the C++ kernel hands the call to the
    Python one, which re-homes the tensor (`unpadded_for_view`) and views it as CPU does."""
    import importlib

    metrics = importlib.import_module("torchtpu.metrics")
    table = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    out = {}
    before = metrics.live_counts().get("unpadded_for_view", 0)
    for dev in ("cpu", "tpu"):
        with torchtpu.eager_mode(mode):
            ids, t, got = torch.tensor([[3, 1], [4, 1]], device=dev), table.to(dev), []
            for _ in range(4):
                x = t[ids] * 2
                flat = x.view(-1, x.size(-1))
                ids = torch.cat([ids, ids.view(-1)[-2:].view(2, 1) % 7 + flat.sum().long() % 5], 1)
                got.append(flat.cpu())
        out[dev] = (ids.cpu(), got)
    assert metrics.live_counts().get("unpadded_for_view", 0) > before
    assert torch.equal(out["tpu"][0], out["cpu"][0])
    for a, b in zip(out["tpu"][1], out["cpu"][1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.int64, torch.bool])
def test_views_feed_ops_in_every_mode(mode, dtype):
    """Views made by the C++ kernels, read by an op, in each mode and dtype class: eager views
    feed strict hits and defer_and_fuse records; compiled code views inside its graph."""
    def f(x):
        y = x[1:, ::2].t()[1] + x.diagonal()[:2].unsqueeze(0).expand(1, 2).sum(0)[0]
        z = torch.cat([x.as_strided((2, 2), (1, 4), 1).reshape(-1), x.select(1, 3).conj() if x.is_complex()
                       else x.select(1, 3), x.split(2)[1].flatten(), y.view(-1)])
        return z.bool() if dtype is torch.bool else z

    c = (torch.arange(16).reshape(4, 4) % 3).to(dtype)
    if dtype is torch.complex64:
        c = c + 1j * torch.arange(16.0).reshape(4, 4)
    t = c.to("tpu")
    if mode == "compile":
        torch._dynamo.reset()
        got = [torch.compile(f, backend="tpu")(t) for _ in range(2)]
    else:
        with torchtpu.eager_mode(mode):
            got = [f(t) for _ in range(2)]  # the second call: a cache hit / a record
            torch.tpu.synchronize()
    for g in got:
        assert g.dtype == f(c).dtype
        torch.testing.assert_close(g.cpu(), f(c))
