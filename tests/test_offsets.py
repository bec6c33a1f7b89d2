"""A view's storage offset is a runtime value: reading or writing many offsets of one
tensor compiles a handful of programs, not one per offset, and every value equals CPU."""
import pytest
import torch

import torchtpu
from conftest import assert_same


def _compiles():
    return torchtpu.metrics()["compiles"]


@torchtpu.eager_mode("strict")  # op by op: the executor's own key (regions are tested below)
def test_thousand_row_writes_and_reads_compile_a_handful():
    n = 1000
    src = torch.randn(3)
    out = {}
    for dev in ("cpu", "tpu"):
        x = torch.zeros(n, 3, device=dev)
        y = torch.zeros(n, 3, device=dev)
        t = src.to(dev)
        before = _compiles()
        for i in range(n):
            x[i] = t * i
        for i in range(n):
            y[i] = x[i] + 1
        out[dev] = (x, y)
        if dev == "tpu":
            # mul, add, and copy_ into a view at offset 0 or at a runtime offset
            assert _compiles() - before <= 8
    assert_same(out["tpu"], out["cpu"], rtol=0, atol=0)


def test_row_loop_and_unbind():
    x = torch.randn(64, 5)
    xt = x.to("tpu")
    before = _compiles()
    rows = [r.abs() for r in xt]
    parts = xt.unbind(0)
    summed = torch.stack([p * 2 for p in parts])
    assert _compiles() - before <= 6
    assert_same(torch.stack(rows), torch.stack([r.abs() for r in x]))
    assert_same(summed, x * 2)


# views of one (8, 12) float64 base at a moving position i (each keeps its own path in
# runtime/geometry.py: contiguous slice, strided box with an overhanging last row, a
# transposed box, a gather, a view of another dtype)
VIEWS = {
    "row": lambda x, i: x[i % 8],
    "col": lambda x, i: x[:, i % 12],
    "window": lambda x, i: x.view(-1)[i: i + 7: 3],
    "block_t": lambda x, i: x[i % 5: i % 5 + 3, 2:6].t(),
    "overlap": lambda x, i: x.view(-1).as_strided((3, 4), (2, 1), i),
    "int32_row": lambda x, i: x.view(torch.int32)[i % 8, 1:9],
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_moving_view_read_write(name):
    view = VIEWS[name]
    base = torch.arange(96, dtype=torch.float64).reshape(8, 12)
    offsets = list(range(1, 40, 3))
    results = {}
    for dev in ("cpu", "tpu"):
        x = base.clone().to(dev)
        reads = []
        counts = []
        before = _compiles()
        for i in offsets:
            v = view(x, i)
            reads.append(v * 2)
            if name != "overlap":  # writes through overlapping views are undefined on CPU too
                v.add_(1)
            if dev == "tpu":
                counts.append(_compiles() - before)
        results[dev] = (x, reads)
        if dev == "tpu":
            # the last five offsets are new ones (none is 0, which is keyed apart): they
            # compile nothing
            assert counts[-1] == counts[-6], f"{name}: compiles grew with the offset: {counts}"
    assert_same(results["tpu"], results["cpu"], rtol=0, atol=0)


def test_kv_cache_write_at_moving_position():
    """A decode loop's cache write: cache[:, :, pos] = new, a strided view per position."""
    torch.manual_seed(1)
    steps = [torch.randn(2, 3, 4) for _ in range(10)]
    out = {}
    for dev in ("cpu", "tpu"):
        cache = torch.zeros(2, 3, 16, 4, device=dev)
        counts = []
        for pos, new in enumerate(steps):
            cache[:, :, pos] = new.to(dev)
            counts.append(_compiles())
        out[dev] = cache
        if dev == "tpu":
            assert counts[-1] == counts[1], counts
    assert_same(out["tpu"], out["cpu"], rtol=0, atol=0)


def test_defer_and_fuse_region_keeps_its_fingerprint():
    """An offset that changes every step is a runtime input of the fused region."""
    src = torch.randn(6)
    out = {}
    for dev in ("cpu", "tpu"):
        x = torch.zeros(20, 6, device=dev)
        t = src.to(dev)
        acc = []
        with torchtpu.eager_mode("defer_and_fuse"):
            for i in range(1, 19):
                x[i] = t * i
                acc.append((x[i - 1] + x[i + 1]).sum())
                acc[-1].cpu()  # a host read: each step a region
                if i == 3 and dev == "tpu":
                    before = torchtpu.metrics()["region_compiles"]
            if dev == "tpu":
                assert torchtpu.metrics()["region_compiles"] == before
        out[dev] = (x, torch.stack(acc))
    assert_same(out["tpu"], out["cpu"])  # a fused sum may add in another order


def test_out_of_range_view_still_raises():
    x = torch.zeros(4, 3, device="tpu")
    with pytest.raises(RuntimeError):
        x.view(-1).as_strided((3,), (1,), 11)
