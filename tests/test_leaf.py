"""runtime/leaf.py: a tensor as a program sees it, read on the host and in a trace,
checked against CPU PyTorch's own views."""
import jax
import numpy as np
import pytest
import torch

from conftest import assert_same

from torchtpu.runtime import leaf, storage, transfer


def _views(base):
    """Views of a (4, 6) tensor: every geometry the leaf must carry."""
    return {
        "whole": base,
        "row": base[2],                      # nonzero offset
        "col": base[:, 3],                   # strided
        "t": base.t(),                       # permuted
        "step": base[1:, ::2],               # offset and step
        "unsq": base[1].unsqueeze(0),        # a size-1 dim
        "expand": base[0:1].expand(3, 6),    # stride 0
    }


def test_leaf_of_carries_geometry_and_normalizes_size_one_strides():
    base = torch.arange(24.0).reshape(4, 6).to("tpu")
    for name, v in _views(base).items():
        lf = leaf.leaf_of(v, 5)
        assert lf.slot == 5 and lf.shape == tuple(v.shape) and lf.offset == v.storage_offset(), name
        assert lf.stride == tuple(0 if n == 1 else s for n, s in zip(v.shape, v.stride())), name
        assert lf.dtype == np.float32 and lf.flags == "", name
    offsets = []
    lf = leaf.leaf_of(base[2], 0, offsets)
    assert lf.offset is None and offsets == [12]  # a runtime value, out of the key
    assert leaf.leaf_of(base, 0, offsets).offset == 0 and offsets == [12]


def test_flags_follow_lazy_conj_and_neg_bits():
    z = torch.complex(torch.randn(3), torch.randn(3)).to("tpu")
    assert leaf.leaf_of(z.conj(), 0).flags == "conj"
    assert leaf.leaf_of(torch.ops.aten._neg_view(z), 0).flags == "neg"
    assert leaf.leaf_of(torch.ops.aten._neg_view(z.conj()), 0).flags == "conjneg"
    assert leaf.leaf_of(z, 0).flags == ""


def test_leaves_keep_one_slot_per_storage():
    a = torch.arange(24.0).reshape(4, 6).to("tpu")
    b = torch.ones(3, device="tpu")
    flat = leaf.Leaves()
    for t in (a[0], b, a.t(), a[1:]):
        flat.add(t)
    assert [lf.slot for lf in flat.leaves] == [0, 1, 0, 0]
    assert flat.entries == [storage.lookup(a), storage.lookup(b)]
    assert flat.specs() == ((24, np.dtype(np.float32)), (3, np.dtype(np.float32)))


@pytest.mark.parametrize("conj", [False, True])
def test_read_in_a_trace_matches_cpu_views(conj):
    cpu = torch.complex(torch.randn(4, 6), torch.randn(4, 6))
    base = cpu.to("tpu")
    for name, v in _views(base).items():
        want = _views(cpu)[name]
        if conj:
            v, want = v.conj(), want.conj()
        flat = leaf.Leaves()
        flat.add(v)
        lf = flat.leaves[0]
        got = jax.jit(lambda b: leaf.read([b], lf))(transfer.buffer(flat.entries[0]))
        np.testing.assert_array_equal(np.asarray(got), want.resolve_conj().numpy(), err_msg=name)
        assert_same(v, want.resolve_conj())  # transfer.value, the host read


def test_write_in_a_trace_matches_cpu_in_place_copy():
    for name in ("row", "col", "t", "step", "unsq"):
        cpu = torch.arange(24.0).reshape(4, 6)
        dev = cpu.to("tpu")
        v, want_v = _views(dev)[name], _views(cpu)[name]
        value = torch.randn(want_v.shape)
        want_v.copy_(value)
        lf = leaf.leaf_of(v, 0)
        bufs = [transfer.buffer(storage.lookup(dev))]
        new = jax.jit(lambda b, x: (leaf.write(b, lf, x), b[0])[1])(bufs, value.numpy().astype(np.float64))
        leaf.commit([storage.lookup(dev)], {0: new})
        assert_same(dev, cpu, msg=name)
