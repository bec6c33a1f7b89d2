"""Writes through every kind of view reach the base exactly as on CPU."""
import pytest
import torch

import torchtpu  # noqa: F401
from conftest import assert_same

VIEWS = {
    "view": lambda x: x.view(-1),
    "view_2d": lambda x: x.view(4, 6),
    "reshape": lambda x: x.reshape(2, 12),
    "transpose": lambda x: x.transpose(0, 1),
    "t": lambda x: x.t(),
    "permute": lambda x: x.reshape(2, 3, 4).permute(2, 0, 1),
    "slice": lambda x: x[1:3],
    "slice_step": lambda x: x[::2],
    "slice_cols": lambda x: x[:, 1:5:2],
    "select": lambda x: x[2],
    "select_col": lambda x: x[:, 3],
    "narrow": lambda x: x.narrow(1, 2, 3),
    "expand_then_select": lambda x: x[0:1].expand(3, 6)[0],
    "squeeze": lambda x: x[1:2].squeeze(0),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(offset=1),
    "unfold": lambda x: x.view(-1).unfold(0, 4, 4),
    "as_strided": lambda x: x.as_strided((2, 2), (6, 1), 1),
    "detach": lambda x: x.detach(),
    "alias": lambda x: torch.ops.aten.alias(x),
    "split": lambda x: x.split(2)[1],
    "chunk": lambda x: x.chunk(3, dim=1)[2],
    "unbind": lambda x: x.unbind(0)[3],
    "nested": lambda x: x.t()[1:5].t()[::2],
    "movedim": lambda x: x.reshape(2, 3, 4).movedim(0, 2)[1],
    "view_dtype": lambda x: x.view(torch.int32),
}


def _base():
    return torch.arange(24, dtype=torch.float32).reshape(4, 6)


@pytest.mark.parametrize("name", sorted(VIEWS))
@pytest.mark.parametrize("write", ["fill", "add", "mul", "copy"])
def test_write_through_view(name, write, no_fallback):
    make = VIEWS[name]

    def program(dev):
        base = _base().to(dev)
        v = make(base)
        if write == "fill":
            v.fill_(-1)
        elif write == "add":
            v.add_(1)
        elif write == "mul":
            v.mul_(3)
        else:
            v.copy_(torch.full(v.shape, 7).to(v.dtype).to(dev))
        return base, v

    cb, cv = program("cpu")
    tb, tv = program("tpu")
    assert tv.device.type == "tpu"
    assert tv.shape == cv.shape and tv.stride() == cv.stride()
    assert tv.storage_offset() == cv.storage_offset()
    assert_same(tb, cb, equal_nan=True)
    assert_same(tv, cv)


def test_views_share_storage():
    x = torch.zeros(3, 4, device="tpu")
    y = x.t()
    assert y.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert y._base is x


def test_transpose_column_fill():
    x = torch.zeros(3, 4, device="tpu")
    x.t()[1].fill_(-1)
    expected = torch.zeros(3, 4)
    expected[:, 1] = -1
    assert_same(x, expected)


def test_strided_slice_iadd():
    a = torch.arange(10.0)
    b = a.to("tpu")
    a[::2] += 1
    b[::2] += 1
    assert_same(b, a)


def test_flat_view_add():
    x = torch.arange(6.0).reshape(2, 3)
    y = x.to("tpu")
    x.view(-1).add_(1)
    y.view(-1).add_(1)
    assert_same(y, x)


def test_base_write_visible_in_view():
    x = torch.zeros(4, 4, device="tpu")
    d = x.diagonal()
    x.fill_(2)
    assert_same(d, torch.full((4,), 2.0))


def test_read_noncontiguous_views():
    x = torch.randn(5, 7)
    t = x.to("tpu")
    for f in (lambda z: z.t(), lambda z: z[1::2, ::3], lambda z: z[:, None, 2].expand(5, 3),
              lambda z: z.as_strided((3, 3), (1, 7), 2)):
        assert_same(f(t), f(x))


@pytest.mark.parametrize("name", ["squeeze_", "unsqueeze_", "transpose_", "t_", "as_strided_"])
def test_inplace_geometry_ops(name, no_fallback):
    def program(dev):
        x = torch.arange(6.0).reshape(1, 6).to(dev) if dev == "cpu" else torch.ones(1, 6, device=dev)
        if dev != "cpu":
            x.copy_(torch.arange(6.0).reshape(1, 6))
        base = x
        if name == "squeeze_":
            x = x[:, 1:5].squeeze_(0)
        elif name == "unsqueeze_":
            x = x[0].unsqueeze_(1)
        elif name == "transpose_":
            x = x.view(2, 3).transpose_(0, 1)
        elif name == "t_":
            x = x.view(3, 2).t_()
        else:
            x = x.view(6).as_strided_((2, 2), (1, 2), 1)
        x.mul_(-1)
        return base, x

    cb, cx = program("cpu")
    tb, tx = program("tpu")
    assert tx.shape == cx.shape and tx.stride() == cx.stride()
    assert_same(tx, cx)
    assert_same(tb, cb)


def _random_views(n=60, seed=0):
    import random

    rnd = random.Random(seed)
    out = []
    while len(out) < n:
        nd = rnd.randint(1, 3)
        sizes = [rnd.randint(1, 4) for _ in range(nd)]
        strides = [rnd.choice([0, 1, 2, 3, 4, 6, 8, 12, 24]) for _ in range(nd)]
        offset = rnd.randint(0, 5)
        extent = offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
        if extent <= 60:
            out.append((tuple(sizes), tuple(strides), offset))
    return out


@pytest.mark.parametrize("geom", _random_views())
def test_random_strided_read_write(geom, no_fallback):
    sizes, strides, offset = geom
    base_c = torch.arange(60.0)
    base_t = base_c.to("tpu")
    assert_same(base_t.as_strided(sizes, strides, offset),
                base_c.as_strided(sizes, strides, offset))
    touched = base_c.as_strided(sizes, strides, offset).reshape(-1).tolist()
    overlapping = len(set(touched)) != len(touched)  # writes there have no defined order
    if not overlapping:
        val = torch.randn(sizes)
        vc = base_c.as_strided(sizes, strides, offset)
        vt = base_t.as_strided(sizes, strides, offset)
        vc.copy_(val)
        vt.copy_(val.to("tpu"))
        assert_same(base_t, base_c)


_VIEW_SOURCES = {
    "contiguous": lambda x: x,
    "permuted": lambda x: x.permute(2, 0, 3, 1),
    "sliced": lambda x: x[:, 1:, ::2],
    "selected": lambda x: x[1],
    "scalar": lambda x: x[1, 2, 3, 4],
    "size-1 dim": lambda x: x[:, :1],
}
_VIEW_OPS = {
    "t": lambda x: x.t() if x.dim() <= 2 else None,
    "transpose": lambda x: x.transpose(0, -1),
    "detach": lambda x: x.detach(),
    "alias": lambda x: torch.ops.aten.alias(x),
    "expand new dim": lambda x: x.expand(2, *x.shape),
    "expand size-1": lambda x: x[..., :1].expand(*x.shape[:-1], 7) if x.dim() else None,
    "split": lambda x: x.split(2, -1) if x.dim() else None,
    "unsqueeze 0": lambda x: x.unsqueeze(0),
    "unsqueeze -1": lambda x: x.unsqueeze(-1),
    "permute": lambda x: x.permute(list(reversed(range(x.dim())))),
    "select": lambda x: x.select(-1, -1) if x.dim() else None,
    "slice step": lambda x: x[..., 1:-1:2] if x.dim() else None,
    "slice clamp": lambda x: x[-100:100] if x.dim() else None,
    "squeeze dim": lambda x: x.squeeze(1) if x.dim() > 1 else None,
}


@pytest.mark.parametrize("src", list(_VIEW_SOURCES))
def test_fast_view_geometry_matches_cpu(src):
    """The stride-arithmetic view kernels give CPU's sizes, strides and offsets."""
    base = torch.arange(120.0).reshape(2, 3, 4, 5)
    c, t = _VIEW_SOURCES[src](base), _VIEW_SOURCES[src](base.to("tpu"))
    for name, op in _VIEW_OPS.items():
        rc = op(c)
        if rc is None:
            continue
        rt = op(t)
        for a, b in zip(rc if isinstance(rc, tuple) else [rc], rt if isinstance(rt, tuple) else [rt]):
            assert (a.shape, a.stride(), a.storage_offset()) == (b.shape, b.stride(), b.storage_offset()), name
            try:
                assert_same(b, a)
            except AssertionError as e:
                e.add_note(name)
                raise


@pytest.mark.parametrize("op", [
    lambda x: x.transpose(0, 5), lambda x: x.select(0, 9), lambda x: x.permute(0, 0, 1, 2),
    lambda x: x.unsqueeze(9), lambda x: x.expand(3, 3), lambda x: x.split(0, 1),
])
def test_fast_view_errors_match_cpu(op):
    base = torch.zeros(2, 3, 4, 5)
    with pytest.raises(Exception) as cpu_err:
        op(base)
    with pytest.raises(type(cpu_err.value)):
        op(base.to("tpu"))


@pytest.mark.parametrize("view", ["unsqueeze", "slice", "transpose", "select", "view"])
def test_views_of_conj_and_neg_keep_their_bits(view):
    f = {
        "unsqueeze": lambda t: t.unsqueeze(0),
        "slice": lambda t: t[:, 1:],
        "transpose": lambda t: t.t(),
        "select": lambda t: t[1],
        "view": lambda t: t.view(-1),
    }[view]
    z = torch.randn(2, 3, dtype=torch.complex64)
    zt = z.to("tpu")
    assert_same(f(zt.conj()), f(z.conj()))
    assert_same(f(torch.ops.aten._neg_view(zt)), f(torch.ops.aten._neg_view(z)))


def test_partial_writes_into_big_storages_are_in_place_and_never_corrupt_aliases():
    import torchtpu

    n = 1 << 17
    big = torch.zeros(n, device="tpu")
    g = torch.arange(1024.0, device="tpu")
    torchtpu.reset_metrics()
    for i in range(4):
        big[i * 1024:(i + 1) * 1024].copy_(g)  # DDP's bucket copy: the old buffer is handed to XLA
    if torchtpu.get_eager_mode() == "strict":
        assert torchtpu.metrics().get("donated_writes", 0) >= 1
    want = torch.zeros(n)
    want[:4096] = torch.arange(1024.0).repeat(4)
    assert_same(big, want)
    # a buffer another tensor still sees is never overwritten
    a = torch.randn(n, device="tpu")
    b = torch.empty(n, device="tpu")
    b.copy_(a)
    before = a.cpu()
    b[:10].fill_(0.0)
    assert_same(a, before)
    assert (b.cpu()[:10] == 0).all() and torch.equal(b.cpu()[10:], before[10:])
    held = big.detach()  # same storage: sees the write, as on the CPU
    big[5000:5002].fill_(7.0)
    assert held.cpu()[5000].item() == 7.0


def test_as_strided_length_mismatch_raises_as_on_cpu():
    # PyTorch's test_strided_mismatched_stride_shape: tpu made a view from mismatched lists
    for shape, strides in [((1,), ()), ((1, 2), (1,))]:
        for dev in ("cpu", "tpu"):
            with pytest.raises(RuntimeError, match="mismatch in length of strides and shape"):
                torch.tensor(0.42, device=dev).as_strided(shape, strides)
            with pytest.raises(RuntimeError, match="mismatch in length of strides and shape"):
                torch.tensor(0.42, device=dev).as_strided_(shape, strides)
