"""Property tests of runtime/geometry.py: reading and writing a strided view of a flat buffer
against numpy's `as_strided` over the same bytes, for many seeded random views.

Each case is (buffer length, shape, strides, offset, view dtype). The views are drawn so
every path of geometry.read/write is hit: contiguous slices, boxes (slices, strided slices,
transposes, splits) with and without an overhanging last row, broadcasts (stride 0),
arbitrary strides (the gather/scatter path), empty views, another dtype over the storage's
bytes, and the offset as a traced runtime value. A seeded numpy generator stands in for
hypothesis (not installed); a failure names the seed and the case.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torchtpu.runtime import geometry

# Two seeds run in the fast suite (about 2 s of CPU); more under -m slow. Compiling dominates,
# so the programs skip XLA's backend optimizations (the values are what is tested).
FAST_SEEDS = [0, 1]
SEEDS = FAST_SEEDS + [pytest.param(s, marks=pytest.mark.slow) for s in range(2, 10)]
CASES = 40  # views per seed and test
_jit = partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def _random_view(rng: np.random.Generator, itemsize_ratio: int = 1):
    """(shape, strides, offset, length): a view and a buffer long enough for it, in elements of
    the view's dtype. `itemsize_ratio` (storage itemsize / view itemsize) keeps the buffer a
    whole number of storage elements."""
    ndim = int(rng.choice(5, p=[0.05, 0.15, 0.3, 0.3, 0.2]))
    shape = [int(rng.integers(1, 5)) for _ in range(ndim)]
    if ndim and rng.random() < 0.05:
        shape[int(rng.integers(ndim))] = 0
    kind = rng.choice(["contiguous", "permuted", "sliced", "arbitrary", "broadcast"], p=[0.1, 0.2, 0.25, 0.3, 0.15])
    base = [n * int(rng.integers(1, 3)) for n in shape]  # a larger tensor the view is cut from
    strides = list(geometry.contiguous_strides(base))
    if kind == "contiguous":
        strides = list(geometry.contiguous_strides(shape))
    elif kind == "permuted" and ndim:
        perm = rng.permutation(ndim)
        dense = geometry.contiguous_strides([shape[d] for d in perm])
        strides = [0] * ndim
        for i, d in enumerate(perm):
            strides[d] = dense[i]
    elif kind == "sliced":
        strides = [s * int(rng.integers(1, 3)) for s in strides]  # step slices of the base
    elif kind == "arbitrary":
        strides = [int(rng.choice(7, p=[0.1] + [0.15] * 6)) for _ in range(ndim)]  # 0: broadcast in a gather
    elif kind == "broadcast" and ndim:
        strides[int(rng.integers(ndim))] = 0
    offset = int(rng.integers(0, 6))
    numel = int(np.prod(shape)) if shape else 1
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if numel else 0
    length = offset + extent + int(rng.choice([0, 0, 1, 5]))  # often ending at the view's last element
    length = max(length, 1)
    length += (-length) % itemsize_ratio
    return tuple(shape), tuple(strides), offset, length


def _numpy_view(flat: np.ndarray, shape, strides, offset) -> np.ndarray:
    if 0 in shape:
        return np.zeros(shape, flat.dtype)
    return np.lib.stride_tricks.as_strided(flat[offset:], shape, [s * flat.itemsize for s in strides],
                                           writeable=True)


def _distinct(shape, strides) -> bool:
    """Every element of the view at its own address (a write is then well defined)."""
    if 0 in shape:
        return True
    idx = np.zeros((), np.int64)
    for n, s in zip(shape, strides):
        idx = np.add.outer(idx, np.arange(n) * s)
    return np.unique(idx).size == idx.size


def _values(rng, n: int, dtype) -> np.ndarray:
    return rng.integers(-100, 100, n).astype(dtype)


# (storage dtype, view dtype): the same dtype, and a view over another dtype's bytes
# (same itemsize, smaller, larger; bool and complex have their own paths in geometry.bitcast)
DTYPES = [(np.float32, np.float32), (np.int64, np.int64), (np.float32, np.int32), (np.int32, np.int16),
          (np.int16, np.int32), (np.uint8, np.bool_), (np.complex64, np.float32), (np.float32, np.complex64)]


def _storage(rng, length: int, storage, view) -> tuple[np.ndarray, np.ndarray]:
    """A storage holding `length` view elements, and the same bytes as the view dtype."""
    nbytes = length * np.dtype(view).itemsize
    n = max(1, nbytes // np.dtype(storage).itemsize)
    if np.dtype(storage).kind == "c":
        flat = (_values(rng, n, np.float32) + 1j * _values(rng, n, np.float32)).astype(storage)
    elif np.dtype(view) == np.bool_:
        flat = rng.integers(0, 2, n).astype(storage)  # only 0/1 bytes are bools
    else:
        flat = _values(rng, n, storage)
    return flat, flat.view(view)


def _length_multiple(storage, view) -> int:
    """View elements per whole storage element (a larger view dtype needs whole elements too)."""
    s, v = np.dtype(storage).itemsize, np.dtype(view).itemsize
    return s // v if s > v else 1


def _cases(seed: int, n: int = CASES):
    """`n` cases: (rng, shape, strides, offset, storage buffer, its bytes as the view dtype)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        storage, view = DTYPES[int(rng.integers(len(DTYPES)))]
        shape, strides, offset, length = _random_view(rng, _length_multiple(storage, view))
        if np.dtype(view).itemsize > np.dtype(storage).itemsize:
            k = np.dtype(view).itemsize // np.dtype(storage).itemsize
            flat = _values(rng, length * k, storage)
            yield shape, strides, offset, flat, flat.view(view)
        else:
            yield (shape, strides, offset, *_storage(rng, length, storage, view))


def _message(seed, i, case) -> str:
    shape, strides, offset, flat, as_view = case
    return f"seed {seed} case {i}: {flat.dtype} storage of {flat.size} as {as_view.dtype} {shape} {strides} +{offset}"


# Every case of a seed is traced into one program (one per case, or eager JAX's compile per
# primitive and shape, takes minutes); the static offsets stay Python ints in it.
@pytest.mark.parametrize("seed", SEEDS)
def test_read_matches_as_strided(seed):
    cases = list(_cases(seed))
    got = _jit(lambda bufs: [geometry.read(b, c[0], c[1], c[2], c[4].dtype) for b, c in zip(bufs, cases)])(
        [c[3] for c in cases])
    for i, (case, g) in enumerate(zip(cases, got)):
        shape, strides, offset, flat, as_view = case
        want = _numpy_view(as_view, shape, strides, offset)
        g = np.asarray(g)
        assert g.dtype == want.dtype and g.shape == want.shape, _message(seed, i, case)
        np.testing.assert_array_equal(g, want, err_msg=_message(seed, i, case))


@pytest.mark.parametrize("seed", SEEDS)
def test_write_matches_as_strided(seed):
    cases = [c for c in _cases(seed) if _distinct(c[0], c[1])]  # else which write wins is not defined
    rng = np.random.default_rng(1000 + seed)
    values = []
    for shape, strides, offset, flat, as_view in cases:
        numel = int(np.prod(shape)) if shape else 1
        v = rng.integers(0, 2, numel) if as_view.dtype == np.bool_ else _values(rng, numel, as_view.dtype)
        values.append(v.astype(as_view.dtype).reshape(shape))
    got = _jit(lambda bufs, vals: [geometry.write(b, v, c[0], c[1], c[2])
                                      for b, v, c in zip(bufs, vals, cases)])([c[3] for c in cases], values)
    for i, (case, value, g) in enumerate(zip(cases, values, got)):
        shape, strides, offset, flat, as_view = case
        want = flat.copy()
        _numpy_view(want.view(as_view.dtype), shape, strides, offset)[...] = value
        g = np.asarray(g)
        assert g.dtype == want.dtype and g.shape == want.shape, _message(seed, i, case)
        np.testing.assert_array_equal(g, want, err_msg=_message(seed, i, case))


@pytest.mark.parametrize("seed", SEEDS)
def test_traced_offset_matches_as_strided(seed):
    """The offset as a runtime value (one program for every offset): dynamic_slice reads and
    dynamic_update_slice writes, with the box's overhang padded for the worst offset."""
    rng = np.random.default_rng(100 + seed)
    views = [v for v in (_random_view(rng)[:2] for _ in range(8)) if 0 not in v[0]]
    extents = [1 + sum((n - 1) * s for n, s in zip(shape, strides)) for shape, strides in views]
    flats = [_values(rng, e + 6, np.float32) for e in extents]
    values = [_values(rng, int(np.prod(shape)) if shape else 1, np.float32).reshape(shape) for shape, _ in views]

    @_jit
    def run(bufs, vals, offsets):
        reads = [geometry.read(b, sh, st, o, jnp.float32) for b, (sh, st), o in zip(bufs, views, offsets)]
        writes = [geometry.write(b, v, sh, st, o) for b, v, (sh, st), o in zip(bufs, vals, views, offsets)]
        return reads, writes

    # the first element, one inside, and the last offset that keeps the view in bounds
    for offsets in ([0] * len(views), [int(rng.integers(1, 7)) for _ in views], [6] * len(views)):
        reads, writes = run(flats, values, [jnp.int64(o) for o in offsets])
        for i, ((shape, strides), flat, value, offset) in enumerate(zip(views, flats, values, offsets)):
            msg = f"seed {seed} case {i}: {shape} {strides} +{offset} of {flat.size}"
            np.testing.assert_array_equal(np.asarray(reads[i]), _numpy_view(flat, shape, strides, offset),
                                          err_msg=msg)
            if _distinct(shape, strides):
                want = flat.copy()
                _numpy_view(want, shape, strides, offset)[...] = value
                np.testing.assert_array_equal(np.asarray(writes[i]), want, err_msg=msg)


def test_cases_cover_every_path():
    """The random views reach each way geometry reads a view (so the tests above cannot pass
    by drawing only contiguous ones)."""
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(CASES * len(FAST_SEEDS)):
        shape, strides, offset, length = _random_view(rng)
        if 0 in shape:
            seen.add("empty")
        elif geometry.is_contiguous(shape, strides):
            seen.add("contiguous")
        elif geometry._box(shape, strides) is None:
            seen.add("gather")
        else:
            box = geometry._box(shape, strides)
            seen.add("box overhang" if offset + box[2] > length else "box")
        if any(s == 0 and n > 1 for n, s in zip(shape, strides)):
            seen.add("broadcast")
    assert seen == {"empty", "contiguous", "gather", "box", "box overhang", "broadcast"}, seen
