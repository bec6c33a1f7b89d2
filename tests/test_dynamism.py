"""torchtpu.mark_dynamic: a dim of varying size compiles once per bucket, not once per size.

Each op family runs over sizes in three buckets (16, 32, 64) against CPU; the second size of
a bucket must compile nothing new, the results must equal CPU's and PyTorch must see the true
sizes."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same

SIZES = (3, 9, 17, 30, 40)  # buckets 16, 16, 32, 32, 64
AGAIN = (9, 30)  # a bucket already compiled for


def _compiles():
    return torchtpu.metrics()["compiles"]


def _check(fn, make, dyn, mode="strict", static_ok=False, **tol):
    """fn over make(n)'s tensors on CPU and on tpu with the dims `dyn` ({input: dim}) marked:
    assert_same, and no compile for a size of a bucket already compiled for."""
    with torchtpu.eager_mode(mode):
        for n in SIZES:
            xs = make(n)
            ts = [x.to("tpu") for x in xs]
            for i, d in dyn.items():
                torchtpu.mark_dynamic(ts[i], d, 1, 64)
            before = _compiles()
            assert_same(fn(*ts), fn(*xs), **tol)  # (its read of the result is counted, as before)
            new = _compiles() - before
            if n in AGAIN and not static_ok:
                assert new == 0, (n, new)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_mark_dynamic_keeps_true_sizes():
    x = torch.randn(2, 5, 3, generator=_g(0))
    t = torchtpu.mark_dynamic(x.to("tpu"), -2, 2, 100)
    assert t.shape == x.shape and torchtpu.get_dynamism(t) == {1: (2, 100)}
    assert torch.equal(t.cpu(), x)
    y = t * 2
    assert y.shape == x.shape and torchtpu.get_dynamism(y) == {1: (2, 100)}
    assert torchtpu.get_dynamism(y[:, 1:3]) == {} and torchtpu.get_dynamism(y.sum(1)) == {}
    assert torchtpu.get_dynamism(y.transpose(0, 1)) == {0: (2, 100)}
    c = y.contiguous()  # CPU's contiguous strides, still dynamic (packed at its storage's start)
    assert c.stride() == (x * 2).stride() and torchtpu.get_dynamism(c) == {1: (2, 100)}
    assert torch.equal(c.cpu(), x * 2)
    flat = c.view(-1)  # a view merging the dim, as CPU's contiguous tensor allows: true sizes
    assert torchtpu.get_dynamism(flat) == {} and torch.equal(flat.cpu(), (x * 2).view(-1))
    with pytest.raises(ValueError, match="bounds"):
        torchtpu.mark_dynamic(torch.zeros(2, 5, device="tpu"), 1, 6, 10)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_elementwise(mode):
    def make(n):
        return [torch.randn(2, n, 4, generator=_g(n)), torch.randn(2, n, 4, generator=_g(n + 1)),
                torch.randn(4, generator=_g(1))]

    def fn(x, y, b):
        z = torch.where(x > 0, x * y + b, y.sigmoid() - 1)
        z.mul_(2).add_(x)
        return z, (x.to(torch.float64) ** 2).exp(), x.unsqueeze(0) + y.unsqueeze(0)

    _check(fn, make, {0: 1, 1: 1}, mode)


def test_elementwise_with_a_static_tensor_of_the_true_size():
    # correct, though such a tensor's own size keys the program
    _check(lambda x, y: x - y, lambda n: [torch.randn(3, n, generator=_g(n)), torch.randn(3, n, generator=_g(7))],
           {0: 1}, static_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_reductions(mode):
    def make(n):
        return [torch.randn(3, n, 2, generator=_g(n)) - 0.5]

    def fn(x):
        return (x.sum(1), x.mean(1), x.amax(1), x.min(1).values, x.min(1).indices, x.argmax(1),
                x.logsumexp(1), x.var(1), x.std(1, correction=0), x.sum(), x.mean(), x.prod(1),
                (x > 0).any(1), (x > -2).all(1), x.sum(-1, keepdim=True).amin(1), x.mean((0, 1)))

    _check(fn, make, {0: 1}, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_softmax_and_attention(mode):
    def make(n):
        return [torch.randn(1, 2, n, 8, generator=_g(n)), torch.randn(1, 2, n, 8, generator=_g(n + 1)),
                torch.randn(1, 2, n, 8, generator=_g(n + 2)), torch.randn(1, 2, 1, 8, generator=_g(3))]

    def fn(q, k, v, q1):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v),
                F.scaled_dot_product_attention(q1, k, v),  # one decode step over a cache of n
                torch.softmax(q, 2), torch.log_softmax(k, 2), torch.softmax(v, -1))

    _check(fn, make, {0: 2, 1: 2, 2: 2}, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_matmul(mode):
    w = torch.randn(8, 5, generator=_g(1))
    b = torch.randn(5, generator=_g(2))
    w4 = torch.randn(2, 4, 3, generator=_g(3))

    def make(n):
        return [torch.randn(n, 8, generator=_g(n)), torch.randn(3, n, generator=_g(n + 1)),
                torch.randn(2, n, 4, generator=_g(n + 2)), torch.randn(1, n, 8, generator=_g(n + 3))]

    def fn(x, a, bx, x3):
        wt, bt = w.to(x.device), b.to(x.device)
        return (x @ wt, a @ x, torch.bmm(bx, w4.to(x.device)), torch.bmm(bx.transpose(1, 2), bx),
                F.linear(x3, wt.t(), bt), torch.addmm(bt, x, wt))

    _check(fn, make, {0: 0, 1: 1, 2: 1, 3: 1}, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_cat_along_and_across_the_dim(mode):
    def make(n):
        return [torch.randn(2, n, 3, generator=_g(n)), torch.randn(2, 1, 3, generator=_g(5))]

    def fn(x, new):
        grown = torch.cat([x, new], 1)
        return grown, torch.cat([x, x * 2], 0), torch.cat([new, x, new], 1).sum(1)

    _check(fn, make, {0: 1}, mode)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_constant_pad_along_and_across_the_dim(mode, dtype):
    # a loss's labels padded by one ignore_index before the shift, padding on both sides,
    # and across the dim: the result stays dynamic, its padded positions hold the value
    def make(n):
        x = torch.randn(2, n, 3, generator=_g(n)) * 4
        return [x > 0 if dtype == torch.bool else x.to(dtype)]

    def fn(x):
        a = F.pad(x, (0, 0, 0, 1), value=-100 if dtype != torch.bool else 1)
        b = F.pad(x, (1, 2, 1, 0, 1, 0), value=1)
        return a, b, b.sum(1), a[:, 1:]

    _check(fn, make, {0: 1}, mode)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_slice_backward_across_the_dim(mode):
    # rotate_half's backward: the gradient of slices of the features of a tensor whose
    # length varies, as one program per bucket (PyTorch's composite compiled a zeros and a
    # copy_ per length)
    def make(n):
        return [torch.randn(1, 2, n, 8, generator=_g(n)), torch.randn(1, 2, n, 8, generator=_g(n + 1))]

    def fn(x, w):
        x = x.detach().requires_grad_()
        y = torch.cat((-x[..., 4:], x[..., :4]), -1) * 3
        (g,) = torch.autograd.grad(y, x, w)  # the gradient arrives dynamic, as a loss's does
        return g, torch.ops.aten.slice_backward(x.detach()[..., :3], list(x.shape), 3, 1, 4, 1)

    _check(fn, make, {0: 2, 1: 2}, mode)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_cat_with_a_legacy_empty_input(mode):
    """DynamicCache's first update, torch.cat([tensor([]), keys], -2): cat skips the empty 1-D
    input, and the result stays dynamic (it fell back to the true sizes before)."""
    def make(n):
        return [torch.randn(1, 2, n, 4, generator=_g(n)), torch.tensor([])]

    def fn(x, empty):
        return torch.cat([empty, x], -2), torch.cat([empty, x, x[:, :, :1] * 2], -2), torch.cat([x, empty, x], -1)

    _check(fn, make, {0: 2}, mode)
    x = torchtpu.mark_dynamic(torch.randn(1, 2, 9, 4).to("tpu"), 2, 1, 64)
    assert torchtpu.get_dynamism(torch.cat([torch.tensor([], device="tpu"), x], -2)) == {2: (1, 64)}


def test_cat_grows_a_cache_within_buckets():
    rows = torch.randn(40, 2, 1, 3, generator=_g(0))
    ref = rows[0]
    t = torchtpu.mark_dynamic(ref.to("tpu"), 1, 1, 64)
    counts = []
    for i in range(1, 40):
        ref = torch.cat([ref, rows[i]], 1)
        t = torch.cat([t, rows[i].to("tpu")], 1)
        counts.append(_compiles())
    assert torch.equal(t.cpu(), ref) and torchtpu.get_dynamism(t) == {1: (1, 64)}
    assert counts[1] == counts[-1]  # a cat growing a bounded dim pads to the bound: one bucket
    with pytest.raises(RuntimeError, match=r"aten\.cat .*dim 1.*outside the bounds"):
        torch.cat([t, torch.zeros(2, 30, 3, device="tpu")], 1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_indexing_along_the_dim(mode):
    table = torch.randn(50, 4, generator=_g(1))
    idx = torch.tensor([0, 2, 1])

    def make(n):
        return [torch.randn(3, n, generator=_g(n)), torch.randint(0, 50, (1, n), generator=_g(n + 1))]

    def fn(x, ids):
        i = idx.to(x.device)
        return (x[:, 2], x[:, -1], x[:, 1:3], x.index_select(1, i), x.index_select(0, i),
                F.embedding(ids, table.to(x.device)), table.to(x.device).index_select(0, ids[0]))

    _check(fn, make, {0: 1, 1: 1}, mode)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_index_copy_of_a_varying_number_of_rows_into_a_static_tensor(mode):
    """A paged KV cache's writes: index_copy_ of n rows into a static cache, index and source
    dynamic. The padded rows write nothing, whether a true row writes row 0 or not."""
    def make(n):
        idx = torch.randperm(63, generator=_g(n))[:n] + 1
        if n % 2:
            idx[n // 2] = 0  # a true write to row 0, where the padding points
        return [torch.randn(64, 2, 4, generator=_g(1)), idx, torch.randn(n, 2, 4, generator=_g(n + 1))]

    def fn(cache, idx, src):
        cache = cache.clone()
        cache.index_copy_(0, idx, src)
        along1 = cache.transpose(0, 1).clone().index_copy_(1, idx, src.transpose(0, 1))
        return cache, along1

    _check(fn, make, {1: 0, 2: 0}, mode)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_indexing_the_dynamic_dim_checks_the_true_size(mode):
    """x[:, idx] and index_select over the dynamic dim: a static result, indices wrapped and
    checked by the true size (the bucket's padding is never read), CPU's errors."""
    idx = torch.tensor([0, 2, -1, -3])

    def make(n):
        return [torch.randn(3, n, 5, generator=_g(n))]

    def fn(x):
        i = idx.to(x.device)
        return x[:, i] * 2, x.index_select(1, i.abs() % 3)

    _check(fn, make, {0: 1}, mode)
    with torchtpu.eager_mode(mode):
        x = torchtpu.mark_dynamic(torch.randn(3, 9, 5).to("tpu"), 1, 1, 64)
        for bad in (9, -10):
            with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 0 with size 9"):
                x[:, torch.tensor([1, bad], device="tpu")].cpu()
        with pytest.raises(IndexError, match="index out of range in self"):
            x.index_select(1, torch.tensor([9], device="tpu")).cpu()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_prefill_attention_under_a_mask_over_queries_and_keys(mode):
    """A prefill's attention: queries and keys of one varying length, the causal mask a slice
    of a preallocated buffer over both (read as a bucket-square window of it)."""
    buf = torch.full((1, 1, 64, 96), float("-inf")).triu(1)

    def make(n):
        return [torch.randn(1, 2, n, 8, generator=_g(n + k)) for k in range(3)] + [buf]

    def fn(q, k, v, b):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=b[:, :, :q.shape[2], :q.shape[2]])

    _check(fn, make, {0: 2, 1: 2, 2: 2}, mode, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_decode_attention_with_queries_and_keys_of_two_sizes(mode):
    """A serving step: a few query rows (the requests decoding now, a count that varies) over
    many keys, the mask a slice of a preallocated buffer over both. The queries run padded
    to their bucket beside the keys' and the result comes back dynamic along them; a second
    pair of sizes in the same buckets compiles nothing."""
    buf = torch.randn(1, 1, 16, 96)
    out = {}
    for dev in ("cpu", "tpu"):
        with torchtpu.eager_mode(mode):
            b, res, counts = buf.to(dev), [], []
            for q, k in ((5, 40), (7, 50), (6, 45), (3, 33)):
                qs = torch.randn(1, 2, q, 8, generator=_g(q)).to(dev)
                ks = torch.randn(1, 2, k, 8, generator=_g(k)).to(dev)
                if dev == "tpu":
                    qs = torchtpu.mark_dynamic(qs, 2)
                    ks = torchtpu.mark_dynamic(ks, 2)
                before = _compiles()
                o = F.scaled_dot_product_attention(qs * 1, ks * 1, ks * 2, attn_mask=b[:, :, :q, :k])
                res.append((o * 3).sum(-1))
                if dev == "tpu":
                    assert torchtpu.get_dynamism(o) == {2: (0, None)}, torchtpu.get_dynamism(o)
                    counts.append(_compiles() - before)
            out[dev] = res
    assert_same(out["tpu"], out["cpu"], atol=1e-5, rtol=1e-5)
    assert counts[2] == 0, counts  # (6, 45): buckets (16, 64) again


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_picking_a_varying_number_of_positions(mode):
    """x[:, idx_buf[:q]] (a serving step's last position of each of its q requests): the index a
    window of its buffer, the result dynamic along the picked dim; another q of the bucket
    compiles nothing."""
    x, idx_buf = torch.randn(1, 30, 8), torch.randint(0, 30, (64,))
    out = {}
    for dev in ("cpu", "tpu"):
        with torchtpu.eager_mode(mode):
            xs, ib, res, counts = x.to(dev), idx_buf.to(dev), [], []
            for q in (5, 9, 7, 12, 3):
                before = _compiles()
                res.append((xs[:, ib[:q]] * 2).sum(-1))
                counts.append(_compiles() - before)
            out[dev] = res
    assert_same(out["tpu"], out["cpu"])
    assert counts[2:] == [0, 0, 0], counts


def test_an_op_without_a_rule_names_the_op_and_the_dim():
    t = torchtpu.mark_dynamic(torch.randn(2, 7, device="tpu"), 1, 1, 64)
    with pytest.raises(RuntimeError, match=r"aten\.flip cannot keep dim 1 of its argument 'self' dynamic"):
        torch.flip(t, [1])
    with pytest.raises(RuntimeError, match=r"aten\.cumsum cannot keep dim 1"):
        t.cumsum(0)
