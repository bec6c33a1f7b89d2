"""Unit tests of the lowering table (ops/registry.py) and the kernels eager/kernels.py
generates from it: in-place and out= variants, promotion rules (ops/promotion.py), and a
lowering registered after import. CPU PyTorch is the oracle throughout."""
from __future__ import annotations

import itertools
import warnings

import jax.numpy as jnp
import pytest
import torch

import torchtpu
from conftest import assert_same
from torchtpu.ops import promotion
from torchtpu.ops.registry import ALWAYS_BOOL, DEFAULT, INT_TO_FLOAT, LOWERINGS, lower, variants_of
from torchtpu.runtime.jaxenv import to_jax_dtype

# --- variants generated from the schema ----------------------------------------------


def test_variants_of_a_functional_lowering():
    low = LOWERINGS["add.Tensor"]
    found = {v.name: v for v in variants_of(low)}
    # add_.Scalar / add.Scalar_out take a Scalar `other`: another schema, not add.Tensor's twins
    assert set(found) == {"add_.Tensor", "add.out"}
    assert (found["add_.Tensor"].mode, found["add_.Tensor"].mutated) == ("inplace", ("self",))
    assert (found["add.out"].mode, found["add.out"].mutated) == ("out", ("out",))
    for v in found.values():
        assert v.functional is low and v.fn is low.fn
        assert (v.promote, v.promote_args, v.static) == (low.promote, low.promote_args, low.static)
    # several outs: max.dim -> max.dim_max(max, max_values)
    (out,) = variants_of(LOWERINGS["max.dim"])
    assert (out.name, out.mutated) == ("max.dim_max", ("max", "max_values"))


def test_out_only_lowerings_compute_through_a_functional_twin():
    outs = [low for low in LOWERINGS.values() if low.mode == "out"]
    assert outs, "randperm.out and friends are lowered as out= overloads"
    for low in outs:
        f = low.functional
        assert f is not None and f.mode == "functional" and f.fn is low.fn and f.functional is None
        assert low.mutated and all(low.arg_index[n] >= 0 for n in low.mutated)


def _outcome(fn):
    """What a call did: its values and layout, whether CPU's resize warning came, or the
    error's class and first line (ours adds a note naming the op after it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res, out = fn()
        except Exception as err:  # noqa: BLE001  (the verdict is what we compare)
            return ("error", type(err), str(err).splitlines()[0])
    # CPU's resize warning, without the C++ source line CPU appends
    resized = [str(w.message).split(" (Triggered internally")[0] for w in caught
               if "An output with one or more elements was resized" in str(w.message)]
    outs = out if isinstance(out, tuple) else (out,)
    rs = res if isinstance(res, tuple) else (res,)
    return ("ok", [r is o for r, o in zip(rs, outs)], resized,
            [(o, o.dtype, tuple(o.shape), o.stride()) for o in outs])


def _x(dev, *shape, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) / 3 - 1).to(dtype).to(dev)


_OUT_CASES = {
    "exact": lambda d: (torch.add(_x(d, 2, 3), _x(d, 2, 3), out=(o := torch.empty(2, 3, device=d))), o),
    "empty_resized": lambda d: (torch.add(_x(d, 2, 3), 1, out=(o := torch.empty(0, device=d))), o),
    "nonempty_resized_warns": lambda d: (torch.mul(_x(d, 2, 3), 2, out=(o := torch.empty(4, device=d))), o),
    "wider_dtype": lambda d: (torch.add(_x(d, 3), _x(d, 3), out=(o := torch.empty(3, dtype=torch.float64, device=d))), o),
    "int_into_float": lambda d: (torch.add(_x(d, 3, dtype=torch.int64), 2,
                                           out=(o := torch.empty(3, device=d))), o),
    "float_into_int_rejected": lambda d: (torch.add(_x(d, 3), _x(d, 3),
                                                    out=(o := torch.empty(3, dtype=torch.int64, device=d))), o),
    "exact_dtype_op_rejects_wider": lambda d: (torch.neg(_x(d, 3), out=(o := torch.empty(3, dtype=torch.float64,
                                                                                          device=d))), o),
    "reduction_rejects_other_dtype": lambda d: (torch.amax(_x(d, 2, 3), 1, out=(o := torch.empty(
        2, dtype=torch.float64, device=d))), o),
    "aliases_an_input": lambda d: (torch.sub(a := _x(d, 2, 3), _x(d, 2, 3) * 2, out=a), a),
    "transposed_out_keeps_strides": lambda d: (torch.mul(_x(d, 2, 3), 3, out=(o := torch.empty(3, 2, device=d).t())), o),
    "two_outs": lambda d: (torch.max(_x(d, 3, 4), 1, out=(v := torch.empty(3, device=d),
                                                           i := torch.empty(3, dtype=torch.int64, device=d))), (v, i)),
}


@pytest.mark.parametrize("case", sorted(_OUT_CASES))
def test_out_variant_matches_cpu(case):
    want, got = _outcome(lambda: _OUT_CASES[case]("cpu")), _outcome(lambda: _OUT_CASES[case]("tpu"))
    assert got[0] == want[0], (got, want)
    if want[0] == "error":
        assert got == want
        return
    assert got[1] == want[1] and all(got[1]), "out= returns the out tensor itself"
    assert got[2] == want[2], "CPU warns when it resizes an out= that had elements"
    assert_same(got[3], want[3])  # each out's values, dtype, shape and strides


def test_inplace_variant_returns_self_and_writes_through_a_view():
    res = {}
    for dev in ("cpu", "tpu"):
        base = _x(dev, 4, 4)
        col = base.t()[1]  # a strided view: column 1
        r = col.add_(_x(dev, 4), alpha=2)
        assert r is col
        res[dev] = base
    assert_same(res["tpu"], res["cpu"])


@pytest.mark.parametrize("dtype,value", [(torch.int64, 2.5), (torch.float16, 1e5), (torch.bool, 2)])
def test_inplace_variant_dtype_rule_matches_cpu(dtype, value):
    # the result must fit self's dtype: int64 += 2.5 is CPU's error; float16 += 1e5 overflows to inf
    def run(dev):
        t = torch.ones(3, device=dev).to(dtype)
        return t.add_(value), t

    want, got = _outcome(lambda: run("cpu")), _outcome(lambda: run("tpu"))
    assert got[0] == want[0]
    if want[0] == "error":
        assert got == want
    else:
        assert_same(got[3], want[3])


# --- promotion: ops/promotion.py against torch.result_type ------------------------------

_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
_SCALARS = [True, 3, -2.5, 1j]


def _forms():
    """(label, what torch sees, what a lowering sees) for tensors, 0-dim tensors and Python
    scalars: a scalar as Python passes it, and weakly typed as the executor passes it into
    a program (eager/scalars.py; a bool goes strongly typed, its category is the lowest)."""
    for dt in _DTYPES:
        jd = to_jax_dtype(dt)
        yield f"tensor {dt}", torch.ones(2, dtype=dt), jnp.ones((2,), jd)
        yield f"0-dim {dt}", torch.ones((), dtype=dt), jnp.ones((), jd)
    for s in _SCALARS:
        yield f"scalar {s!r}", s, s
        yield f"weak {s!r}", s, jnp.asarray(s)


_FORMS = list(_forms())


def _pairs():
    for (la, ta, ja), (lb, tb, jb) in itertools.product(_FORMS, _FORMS):
        if isinstance(ta, torch.Tensor) or isinstance(tb, torch.Tensor):
            yield f"{la} & {lb}", ta, ja, tb, jb


def test_default_promotion_matches_result_type_over_the_grid():
    bad = []
    for label, ta, ja, tb, jb in _pairs():
        cpu = torch.result_type(ta, tb)
        if cpu == torch.complex32:  # float16 and a complex scalar: eager/carried.py serves it, never a lowering
            with pytest.raises(TypeError, match="complex32 as a promoted result"):
                promotion.result_dtypes(DEFAULT, ja, jb)
            continue
        comp, res = promotion.result_dtypes(DEFAULT, ja, jb)
        want = to_jax_dtype(cpu)
        # float16/bfloat16 compute in float32 (PyTorch's opmath); every other dtype in itself
        want_comp = jnp.dtype(jnp.float32) if want in (jnp.float16, jnp.bfloat16) else want
        if (jnp.dtype(res), jnp.dtype(comp)) != (want, want_comp):
            bad.append((label, res, comp, want))
    assert not bad, bad[:10]


def _cpu_dtype(op, ta, tb):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ComplexHalf is experimental
            dt = op(ta, tb).dtype
    except RuntimeError:
        return None
    return None if dt == torch.complex32 else to_jax_dtype(dt)


@pytest.mark.parametrize("kind,op", [(INT_TO_FLOAT, lambda a, b: torch.true_divide(torch.as_tensor(a), b)),
                                     (ALWAYS_BOOL, lambda a, b: torch.eq(torch.as_tensor(a), b))],
                         ids=["int_to_float", "always_bool"])
def test_other_kinds_match_cpu_ops(kind, op):
    bad = []
    for label, ta, ja, tb, jb in _pairs():
        if not isinstance(ta, torch.Tensor):
            continue  # as_tensor(a) would turn a Python scalar into a tensor of its own dtype
        want = _cpu_dtype(op, ta, tb)
        if want is None:
            continue  # CPU has no kernel for the pair
        _, res = promotion.result_dtypes(kind, ja, jb)
        if jnp.dtype(res) != want:
            bad.append((label, res, want))
    assert not bad, bad[:10]


def test_promote_casts_to_the_computation_dtype():
    vals, res = promotion.promote(DEFAULT, jnp.ones((2,), jnp.float16), jnp.asarray(2.5))
    assert [v.dtype for v in vals] == [jnp.float32, jnp.float32] and res == jnp.float16
    vals, res = promotion.promote(DEFAULT, jnp.ones((2,), jnp.int32), jnp.ones((), jnp.int64), None)
    assert vals[2] is None and vals[0].dtype == vals[1].dtype == res == jnp.int32


# --- promote_args read from the schema --------------------------------------------------


def test_schema_kinds_do_not_depend_on_how_torch_prints_types():
    """registry._kind once compared str(arg.type) with "Tensor?" and "Scalar" while torch prints
    "Optional[Tensor]" and "number": Scalar operands (add.Scalar) and optional tensors
    (clamp.Tensor) fell out of promotion. Every spelling of those types must give the kind."""
    tensor = {"Tensor", "Tensor?", "Optional[Tensor]"}
    scalar = {"Scalar", "Scalar?", "number", "Optional[number]"}
    wrong = []
    for name, low in LOWERINGS.items():
        for a, s in zip(low.args, low.overload._schema.arguments):
            t = str(s.type)
            if (t in tensor and a.kind != "tensor") or (t in scalar and a.kind != "scalar"):
                wrong.append((name, a.name, t, a.kind))
    assert not wrong, wrong[:10]
    assert LOWERINGS["add.Scalar"].promote_args == ("self", "other")
    assert LOWERINGS["clamp.Tensor"].promote_args == ("self", "min", "max")


def test_scalar_and_optional_tensor_operands_promote_like_cpu():
    for fn in (lambda d: torch.add(torch.arange(3, device=d), 2.5),
               lambda d: torch.clamp(torch.arange(4, device=d), min=torch.tensor(1.5, device=d)),
               lambda d: torch.clamp(torch.arange(4, device=d, dtype=torch.int8),
                                     max=torch.full((4,), 2, dtype=torch.int64, device=d))):
        assert_same(fn("tpu"), fn("cpu"))


# --- a lowering registered after import ---------------------------------------------------

_LIB = torch.library.Library("torchtpu_registry_test", "DEF")
_LIB.define("scaled_add(Tensor x, Tensor y, Scalar alpha) -> Tensor")
_LIB.impl("scaled_add", lambda x, y, alpha: x + y * alpha, "CPU")
_OP = "torchtpu_registry_test::scaled_add"


def _late_lowering():
    if _OP not in LOWERINGS:
        @lower(_OP, promote=DEFAULT)
        def scaled_add(x, y, alpha):
            return x + y * alpha


def test_late_lowering_reaches_the_dispatcher():
    op = torch.ops.torchtpu_registry_test.scaled_add.default
    x, y = _x("cpu", 2, 3), _x("cpu", 2, 3, dtype=torch.int32)
    _late_lowering()
    assert torch._C._dispatch_has_kernel_for_dispatch_key(_OP, "PrivateUse1")
    for mode in ("strict", "defer_and_fuse"):
        before = torchtpu.metrics()
        with torchtpu.eager_mode(mode):  # read back in the mode
            assert_same([op(x.to("tpu"), y.to("tpu"), alpha) for alpha in (2, -0.5)],
                        [op(x, y, alpha) for alpha in (2, -0.5)], msg=mode)
        after = torchtpu.metrics()
        assert after["cpu_fallbacks"] == before["cpu_fallbacks"], mode
        if mode == "defer_and_fuse":
            assert after.get("region_ops", 0) > before.get("region_ops", 0)
