"""float16 / bfloat16 forward conformance of the pointwise, reduction and matmul families (issue 3).

Every OpInfo of the three families runs its first samples in float16 and bfloat16 on tpu and on
CPU. Tolerances are PyTorch's: torch.testing.assert_close's defaults for the output dtype, widened
by the toleranceOverride / precisionOverride decorators the OpInfo itself declares for that dtype.
A dtype that CPU PyTorch does not support for an op (op.supported_dtypes("cpu")) is skipped.
"""
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo
from torch.utils._pytree import tree_flatten, tree_map

import torchtpu
from conftest import assert_same
from torchtpu.validate.samples import sample_inputs
from torchtpu.validate.ops import NONDETERMINISTIC

# First samples per OpInfo and dtype: the default run takes the first one in each dtype, the slow
# tier (-m slow) the second. The full six-sample sweep is
# `python -m torchtpu.validate ops --dtypes float16 bfloat16 --no-backward --ops ...`.
SAMPLES = 2
DTYPES = (torch.float16, torch.bfloat16)
# assert_close's defaults (rtol, atol)
from torchtpu.validate.ops import _HALF_TOL as _DEFAULT_TOL, opinfo_tolerance

# Elementwise ops that are plain OpInfos (not Unary/BinaryUfuncInfo).
_POINTWISE = {
    "clamp", "clamp_min", "clamp_max", "where", "lerp", "addcmul", "addcdiv", "masked_fill", "fmod",
    "remainder", "pow", "float_power", "hypot", "atan2", "copysign", "nextafter", "logaddexp",
    "logaddexp2", "xlogy", "heaviside", "maximum", "minimum", "fmax", "fmin", "nan_to_num", "sgn",
    "true_divide", "ldexp", "clip", "frexp", "isclose", "logit", "mvlgamma", "polygamma", "lgamma",
    "digamma", "erfinv", "i0", "sinc", "deg2rad", "rad2deg", "max.binary", "min.binary",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.hardtanh",
    "nn.functional.elu", "nn.functional.leaky_relu", "nn.functional.softplus", "nn.functional.mish",
    "nn.functional.hardswish", "nn.functional.hardsigmoid", "nn.functional.relu6", "nn.functional.celu",
    "nn.functional.selu", "nn.functional.logsigmoid", "nn.functional.tanhshrink",
    "nn.functional.softshrink", "nn.functional.hardshrink", "nn.functional.threshold", "sigmoid",
}
_REDUCTION = {
    "sum", "mean", "prod", "amax", "amin", "std", "var", "norm", "logsumexp", "cumsum", "cumprod",
    "cummax", "cummin", "logcumsumexp", "nansum", "nanmean", "std_mean", "var_mean", "aminmax", "max",
    "min", "argmax", "argmin", "all", "any", "count_nonzero", "linalg.vector_norm", "median",
    "nanmedian", "mode", "_chunk_cat", "sum_to_size", "hash_tensor",
}
_MATMUL = {
    "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "matmul", "dot", "vdot", "mv", "inner", "outer",
    "einsum", "linalg.matmul", "tensordot", "chain_matmul", "addr", "linalg.multi_dot", "__rmatmul__",
}


def _name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def family(op):
    n = _name(op)
    if n in _POINTWISE:
        return "pointwise"
    if op.name in _MATMUL:
        return "matmul"
    if isinstance(op, ReductionOpInfo) or op.name in _REDUCTION or n == "masked.median":
        return "reduction"
    if isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo)) or op.name in _POINTWISE:
        return "pointwise"
    return None


OPS = {_name(o): o for o in op_db if family(o) is not None}

# Known gaps, (OpInfo, dtype, sample index) -> reason; strict xfails. (complex32 was one: it is
# carried as the two float16s' bits since issue 35, eager/carried.py.)
XFAIL: dict = {}


def tolerance(op, dtype):
    return opinfo_tolerance(op, dtype)


def _blank(r):
    """r with each tensor's values zeroed and every other leaf None: what a nondeterministic op
    gives back (tensors, their shapes and dtypes), not its numbers."""
    return tree_map(lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else None, r)


def _cases():
    for index in range(SAMPLES):
        for name in sorted(OPS):
            for dt in DTYPES:
                marks = [pytest.mark.slow] if index else []
                if (name, dt, index) in XFAIL:
                    marks.append(pytest.mark.xfail(reason=XFAIL[(name, dt, index)], strict=True))
                yield pytest.param(name, dt, index, marks=marks,
                                   id=f"{family(OPS[name])}-{name}-{str(dt)[6:]}-{index}")


@pytest.mark.parametrize("name,dtype,index", list(_cases()))
def test_low_precision_forward(name, dtype, index):
    op = OPS[name]
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"CPU PyTorch does not support {name} in {dtype}")
    rtol, atol = tolerance(op, dtype)
    values = name not in NONDETERMINISTIC and op.name not in NONDETERMINISTIC
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(sample_inputs(op, "cpu", dtype, index + 1))[index:index + 1]
    ran = 0
    for sample in samples:
        args = (sample.input, sample.args, sample.kwargs)
        try:
            expected = op(args[0], *args[1], **args[2])
        except Exception:
            continue  # CPU rejects this sample
        tpu = tree_map(lambda x: x.to("tpu") if isinstance(x, torch.Tensor) else x, args)
        torchtpu.reset_metrics()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = op(tpu[0], *tpu[1], **tpu[2])
        fallbacks = torchtpu.metrics()["fallback_ops"]
        assert not fallbacks, f"{name}: fell back to CPU for {sorted(fallbacks)}"
        if not values:
            assert_same(_blank(actual), _blank(expected))
        else:
            a_leaves, e_leaves = tree_flatten(actual)[0], tree_flatten(expected)[0]
            assert len(a_leaves) == len(e_leaves)
            for a, e in zip(a_leaves, e_leaves):
                # the OpInfo's tolerance for a half result, the dtype's default one for any other
                half = isinstance(e, torch.Tensor) and e.dtype in _DEFAULT_TOL
                assert_same(a, e, equal_nan=True, **({"rtol": rtol, "atol": atol} if half else {}))
        ran += 1
    if not ran:
        pytest.skip("no such sample, or CPU PyTorch rejects it")
