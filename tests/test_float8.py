"""float8 / float4 storage, casts, scaled and integer matmuls, out_dtype and torchao on tpu (issue 35).

Every test runs in strict, defer_and_fuse and compile (torch.compile(backend="tpu")) with the CPU
fallback off, against CPU PyTorch: casts and exact ops bit for bit (float8 results compared as
bytes), `_scaled_mm` against a float64 reference within CPU's own error, torchao's quantized
models against the same quantized model on CPU.
"""
import copy
import re
import warnings

import pytest
import torch

import torchtpu
from conftest import run_in_mode as run
from conftest import MODES, assert_bits, assert_values

pytestmark = pytest.mark.usefixtures("no_fallback")

F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
      torch.float8_e8m0fnu]


def _modes_by_dtype(dtypes):
    """(mode, dtype) pairs; compiled ones past the first dtype are slow (each compile costs a
    Dynamo trace, and one dtype compiled shows the graph path; the eager modes cover every one)."""
    return [pytest.param(m, d, marks=[pytest.mark.slow] if m == "compile" and d is not dtypes[0] else [],
                         id=f"{d}-{m}") for d in dtypes for m in MODES]


def _sources():
    """float32 values that probe every float8 rounding: each float8 value of every kind, the
    midpoints between neighbours and one float32 ulp either side, specials (inf, NaN of both
    signs, float32 subnormals, past each type's range) and random bit patterns."""
    vals = torch.cat([torch.arange(256, dtype=torch.uint8).view(dt).float() for dt in F8])
    s = vals[~vals.isnan()].unique().sort().values
    mid = (s[1:] + s[:-1]) / 2
    u = mid.view(torch.int32)
    near = torch.cat([mid, (u + 1).view(torch.float32), (u - 1).view(torch.float32)])
    spec = torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan"), 0.0, -0.0, 1e-45,
                         -1e-45, 1e-40, 3.4e38, -3.4e38, 448, 449, 464, 465, 480, 57344, 61440, 61439,
                         1e30, -1e30, 500.0, -500.0])
    g = torch.Generator().manual_seed(0)
    rnd = torch.randint(-2**31, 2**31 - 1, (4000,), generator=g, dtype=torch.int64).to(torch.int32)
    return torch.cat([s, -s, near, -near, spec, rnd.view(torch.float32)])


SOURCES = _sources()


@pytest.mark.parametrize("mode,dt", _modes_by_dtype(F8))
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_cast_into_float8_bit_exact(dt, src, mode):
    x = SOURCES.to(src)
    if src == torch.float64:  # double rounding through float32, as c10 does, and float32 subnormals
        x = torch.cat([x, torch.randn(2000, dtype=torch.float64) * 1000,
                       torch.linspace(2.0 ** -128, 2.0 ** -125, 1000, dtype=torch.float64)])
    assert_bits(run(mode, lambda t: t.to(dt), x), x.to(dt))


def test_e4m3fn_saturates_like_cpu():
    x = torch.tensor([500.0, -500.0, float("inf"), 1e6, float("nan")])
    got = x.to("tpu").to(torch.float8_e4m3fn).cpu()
    assert got.float()[:4].tolist() == [448.0, -448.0, 448.0, 448.0] and got.float()[4].isnan()
    assert_bits(got, x.to(torch.float8_e4m3fn))


_OUT = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int16, torch.uint16,
        torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool, torch.complex64] + F8


@pytest.mark.parametrize("mode,dt", _modes_by_dtype(F8))
def test_cast_from_float8_every_value(dt, mode):
    """Each of the 256 codes to every dtype (integers: where C's conversion is defined)."""
    x = torch.arange(256, dtype=torch.uint8).view(dt)
    f = x.float()
    finite = ~(f.isnan() | f.isinf())
    for odt in _OUT:
        if odt == dt:
            continue
        got, want = run(mode, lambda t: t.to(odt), x), x.to(odt)
        if odt.is_floating_point or odt.is_complex:
            nan = want.isnan()
            assert torch.equal(got.isnan(), nan), odt
            keep = ~nan
            if odt == torch.complex64:
                assert torch.equal(got[keep], want[keep]), odt
            else:
                assert_bits(got[keep], want[keep], msg=str(odt))
        elif odt == torch.bool:
            assert torch.equal(got, want)
        else:
            keep = finite & (f.abs() < 2.0 ** 31)
            assert torch.equal(got[keep], want[keep]), odt


@pytest.mark.parametrize("mode,dt", _modes_by_dtype(F8))
def test_cast_integers_into_float8(dt, mode):
    for src in (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool):
        x = torch.randint(-300000, 300000, (2000,)).to(src) if src != torch.bool \
            else torch.tensor([True, False])
        assert_bits(run(mode, lambda t: t.to(dt), x), x.to(dt))


@pytest.mark.parametrize("mode", MODES)
def test_float_to_narrow_ints_wraps_like_cpu(mode):
    """CPU converts float -> (u)int8/16 through int32 and wraps (-1.5 -> 255); XLA saturates."""
    x = torch.tensor([-1.5, -3.0, -200.0, 300.0, 70000.0, -40000.0, 3e9, -3e9, 1e20, float("inf"),
                      float("nan"), 2.0 ** 31 - 128, -2.0 ** 31])
    for src in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for dt in (torch.uint8, torch.int8, torch.int16, torch.uint16):
            xs = x.to(src)
            assert torch.equal(run(mode, lambda t: t.to(dt), xs), xs.to(dt)), (src, dt)


@pytest.mark.parametrize("dt", F8 + [torch.float4_e2m1fn_x2], ids=str)
def test_transfers_bit_exact(dt):
    x = torch.arange(256, dtype=torch.uint8).view(dt).reshape(16, 16)
    t = x.to("tpu")
    assert t.dtype == dt and t.device.type == "tpu"
    assert_bits(t.cpu(), x)
    assert_bits(t.t().cpu(), x.t())  # a strided view read back
    host = torch.empty_like(x)
    host.copy_(t)
    assert_bits(host, x)
    assert_bits(t.view(torch.uint8).cpu(), x.view(torch.uint8))
    assert_bits(torch.arange(256, dtype=torch.uint8, device="tpu").view(dt).cpu(), x.flatten())


@pytest.mark.parametrize("mode,dt", _modes_by_dtype(F8 + [torch.float4_e2m1fn_x2]))
def test_factories(dt, mode):
    assert_bits(run(mode, lambda: torch.zeros(3, 4, dtype=dt, device="tpu")), torch.zeros(3, 4, dtype=dt))
    e = run(mode, lambda: torch.empty(5, dtype=dt, device="tpu"))
    assert e.dtype == dt and e.shape == (5,)
    if dt != torch.float4_e2m1fn_x2:  # CPU has no float4 fill
        for v in (2.0, 500.0, -1e6, 0.3):
            if dt == torch.float8_e8m0fnu and v < 0:
                continue  # CPU: "value cannot be converted ... without overflow"
            # (CPU's vectorized fill raises "cannot be converted ... without overflow" for 500.0
            # into e4m3fn, while its one-element fill saturates to 448: tpu saturates always)
            assert_bits(run(mode, lambda: torch.full((3,), v, dtype=dt, device="tpu")),
                        torch.full((1,), v, dtype=dt).expand(3).contiguous())
        assert_bits(run(mode, lambda: torch.ones(2, dtype=dt, device="tpu")), torch.ones(2, dtype=dt))


def _byte_ops():
    """Ops CPU PyTorch runs on every float8 dtype and float4_e2m1fn_x2 (byte moves, equality)."""
    return {
        "cat": lambda a, b: torch.cat([a, b]),
        "stack": lambda a, b: torch.stack([a, b]),
        "eq": lambda a, b: a == b,
        "ne": lambda a, b: a != b,
        "isnan": lambda a, b: a.isnan(),
        "where": lambda a, b: torch.where(torch.arange(a.numel(), device=a.device).reshape(a.shape) % 3 == 0, a, b),
        "clone": lambda a, b: a.clone(),
        "t_contiguous": lambda a, b: a.reshape(16, 16).t().contiguous(),
        "repeat": lambda a, b: a.repeat(2),
        "narrow_copy": lambda a, b: a.narrow_copy(0, 3, 100),
        "split": lambda a, b: a.split(100)[1].clone(),
        "expand": lambda a, b: a[:8].reshape(8, 1).expand(8, 4).contiguous(),
        "view_uint8": lambda a, b: (a.view(torch.uint8) + 0),
    }


def _operands(dt):
    a = torch.arange(256, dtype=torch.uint8).view(dt)
    b = torch.arange(256, dtype=torch.uint8).flip(0).view(dt).clone()
    return a, b


@pytest.mark.parametrize("mode,dt", _modes_by_dtype(F8 + [torch.float4_e2m1fn_x2]))
def test_byte_ops(dt, mode):
    a, b = _operands(dt)
    for name, fn in _byte_ops().items():
        got = run(mode, fn, a, b)
        assert_bits(got, fn(a, b))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
def test_float4_indexing_refused_as_cpu_refuses(mode):
    """CPU's index kernels have no float4 case; tpu's indexing kernels gather any bytes, so they
    must ask (they computed a result)."""
    a = torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    for fn in (lambda a: a[torch.tensor([0, 3], device=a.device)],
               lambda a: a[torch.arange(8, device=a.device) % 2 == 0],
               lambda a: a.clone().index_put_((torch.tensor([1], device=a.device),), a[:1])):
        with pytest.raises(NotImplementedError, match="not implemented for 'Float4_e2m1fn_x2'"):
            fn(a)
        with pytest.raises(NotImplementedError, match="not implemented for 'Float4_e2m1fn_x2'"):
            run(mode, fn, a)


def _value_ops(dt):
    ops = {
        "mul": lambda a, b: a * b,
        "index": lambda a, b: a[torch.tensor([0, 5, 200], device=a.device)],
        "index_select": lambda a, b: a.index_select(0, torch.tensor([1, 7], device=a.device)),
        "eq_scalar": lambda a, b: a == 1.0,
        "to_other_float8": lambda a, b: a.to(torch.float8_e5m2 if dt != torch.float8_e5m2 else torch.float8_e4m3fn),
        "copy_": lambda a, b: a.clone().copy_(b.float()),
        "fill_": lambda a, b: a.clone().fill_(96.0),
    }
    if dt != torch.float8_e8m0fnu:  # CPU has these for the other four
        ops.update({
            "abs": lambda a, b: a.abs(),
            "mm": lambda a, b: a.reshape(16, 16)[:4, :4] @ b.reshape(16, 16)[:4, :4],
            "pad": lambda a, b: torch.nn.functional.pad(a, (1, 2)),
            "index_put": lambda a, b: a.clone().index_put_((torch.tensor([0, 3], device=a.device),), b[:2]),
        })
    return ops


@pytest.mark.parametrize("mode,dt", _modes_by_dtype(F8))
def test_value_ops(dt, mode):
    """Arithmetic CPU PyTorch runs on float8: computed in float32, rounded once as CPU rounds."""
    a, b = _operands(dt)
    for name, fn in _value_ops(dt).items():
        want = fn(a, b)
        got = run(mode, fn, a, b)
        if want.dtype in F8:
            # NaN where CPU has NaN (a NaN's payload bits may differ: e5m2 has six NaNs and
            # XLA:CPU's float8 arithmetic and pads write one), every other value bit for bit
            # (abs: by value; CPU's own abs gives -0 or 0 for -0 by tensor size)
            nan = want.float().isnan()
            assert torch.equal(got.float().isnan(), nan), name
            if name == "abs":
                assert torch.equal(got.float()[~nan], want.float()[~nan]), name
            else:
                assert_bits(got[~nan], want[~nan], msg=name)
        elif want.dtype == torch.bool:
            assert_bits(got, want)
        else:
            assert_values(got, want, equal_nan=True)  # run() read it back
    assert torch.equal(a.to("tpu"), a.to("tpu").clone()) == torch.equal(a, a.clone())
    assert a.to("tpu")[1].item() == a[1].item()


def _refused_ops():
    """Ops CPU PyTorch refuses on (most) float8 dtypes ("... not implemented for 'Float8_e4m3fn'"):
    tpu must raise too, never compute (XLA would)."""
    return {
        "add": lambda a: a + a, "sub_": lambda a: a.clone().sub_(a), "add_out": lambda a: torch.add(a, a, out=a.clone()),
        "neg": lambda a: -a, "exp": lambda a: a.exp(), "sign": lambda a: a.sign(), "lt": lambda a: a < a,
        "maximum": lambda a: torch.maximum(a, a), "clamp": lambda a: a.clamp(0, 1), "relu": torch.relu,
        "sum": lambda a: a.sum(), "mean": lambda a: a.mean(), "max": lambda a: a.max(), "argmax": lambda a: a.argmax(),
        "sort": lambda a: a.sort(), "flip": lambda a: a.flip(0), "isinf": lambda a: a.isinf(),
        "masked_fill": lambda a: a.masked_fill(torch.ones(a.shape, dtype=torch.bool, device=a.device), 0.0),
        "gather": lambda a: a.gather(0, torch.tensor([1], device=a.device)), "nonzero": lambda a: a.nonzero(),
        "equal": lambda a: torch.equal(a, a),
        "arange": lambda a: torch.arange(3, dtype=a.dtype, device=a.device),
        "randn": lambda a: torch.randn(2, dtype=a.dtype, device=a.device),
    }


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
@pytest.mark.parametrize("dt", F8, ids=str)
def test_ops_cpu_refuses_raise_on_tpu(dt, mode):
    a = torch.tensor([1.0, 2.0, 4.0]).to(dt)
    refused = 0
    for name, fn in _refused_ops().items():
        try:
            want = fn(a)
        except NotImplementedError as cpu:
            refused += 1
            with pytest.raises(type(cpu), match="not implemented for"):
                run(mode, fn, a)
            continue
        got = run(mode, fn, a)  # CPU runs it for this dtype (e5m2 has a few more): so must tpu
        if isinstance(want, torch.Tensor):
            assert_bits(got, want)
        else:
            assert got == want, name
    assert refused >= 15
    # what CPU runs still runs, with CPU's values
    for name, fn in {"mul": lambda a: a * a, "eq": lambda a: a == a, "cat": lambda a: torch.cat([a, a]),
                     "isnan": lambda a: a.isnan(), "where": lambda a: torch.where(a.float() > 1, a, a)}.items():
        assert_bits(run(mode, fn, a), fn(a))


# ---- _scaled_mm, _int_mm, _weight_int8pack_mm -----------------------------------------------

M, K, N = 16, 48, 24
_EPS = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10,
        torch.float8_e4m3fn: 2.0 ** -3, torch.float8_e5m2: 2.0 ** -2}


def _scaled_cases():
    g = torch.Generator().manual_seed(1)
    e4 = lambda *s: (torch.randn(*s, generator=g) * 4).to(torch.float8_e4m3fn)  # noqa: E731
    e5 = lambda *s: (torch.randn(*s, generator=g) * 4).to(torch.float8_e5m2)  # noqa: E731
    a, b = e4(M, K), e4(N, K).t()  # b column-major, as the CUDA kernels want it
    sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    ra, rb = torch.rand(M, 1, generator=g) + 0.5, torch.rand(1, N, generator=g) + 0.5
    bias16, bias32 = torch.randn(N, generator=g).bfloat16(), torch.randn(N, generator=g)
    return {
        "tensorwise_f32": (a, b, sa, sb, {"out_dtype": torch.float32}),
        "tensorwise_bf16": (a, b, sa, sb, {"out_dtype": torch.bfloat16}),
        "tensorwise_f16": (a, b, sa, sb, {"out_dtype": torch.float16}),
        "tensorwise_default_e4m3": (a, b, sa, sb, {}),
        "e5m2_out": (a, b, sa, sb, {"out_dtype": torch.float8_e5m2}),
        "scale_result": (a, b, sa, sb, {"out_dtype": torch.float8_e4m3fn, "scale_result": torch.tensor(3.0)}),
        "rowwise_bf16": (a, b, ra, rb, {"out_dtype": torch.bfloat16}),
        "rowwise_f32": (a, b, ra, rb, {"out_dtype": torch.float32}),
        "bias_bf16": (a, b, sa, sb, {"out_dtype": torch.bfloat16, "bias": bias16}),
        "bias_f32": (a, b, sa, sb, {"out_dtype": torch.float32, "bias": bias32}),
        "rowwise_bias": (a, b, ra, rb, {"out_dtype": torch.bfloat16, "bias": bias16}),
        "fast_accum": (a, b, sa, sb, {"out_dtype": torch.float32, "use_fast_accum": True}),
        "e5m2_x_e4m3": (e5(M, K), b, sa, sb, {"out_dtype": torch.float32}),
        "e4m3_x_e5m2": (a, e5(N, K).t(), sa, sb, {"out_dtype": torch.bfloat16}),
        "row_major_b": (a, b.contiguous(), sa, sb, {"out_dtype": torch.float32}),
        "odd_sizes": (e4(5, 20), e4(20, 7), sa, sb, {"out_dtype": torch.float32}),
    }


SCALED = _scaled_cases()


def _reference(a, b, sa, sb, kw):
    """The float64 value of what _scaled_mm computes (before its final rounding)."""
    r = (a.double() * sa.double()) @ (b.double() * sb.double())
    if kw.get("bias") is not None:
        r = r + kw["bias"].double()
    if kw.get("scale_result") is not None and kw.get("out_dtype") in (torch.float8_e4m3fn, torch.float8_e5m2):
        r = r / kw["scale_result"].double()
    return r


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(SCALED))
def test_scaled_mm(case, mode):
    a, b, sa, sb, kw = SCALED[case]
    want = torch._scaled_mm(a, b, sa, sb, **kw)
    kwt = {k: (v.to("tpu") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    got = run(mode, lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, **kwt), a, b, sa, sb)
    assert got.dtype == want.dtype and got.shape == want.shape
    ref = _reference(a, b, sa, sb, kw)
    err_cpu = (want.double() - ref).abs().max().item()
    err_tpu = (got.double() - ref).abs().max().item()
    ulp = _EPS[want.dtype] * ref.abs().max().item()
    assert err_tpu <= max(2 * err_cpu, ulp), (err_tpu, err_cpu, ulp)


def test_scaled_mm_rejects_what_cpu_rejects():
    # CPU's verdict depends on the host: with AMX tiles, ATen takes oneDNN's float8 matmul,
    # whose checks differ (float32 operands: "Expected mat1 to be Float8 matrix"; float64
    # scales accepted). tpu raises what CPU raises on this host, and rejects what ATen's
    # reference checks (and CUDA's) reject where oneDNN lets it through.
    a, b, sa, sb, _ = SCALED["tensorwise_f32"]
    for bad in [(a.float(), b.float(), sa, sb), (a, b, torch.ones(2), sb), (a, b, sa.double(), sb.double()),
                (a, b, torch.ones(M), torch.ones(N))]:
        try:
            torch._scaled_mm(*bad, out_dtype=torch.float32)
            cpu = None
        except (RuntimeError, ValueError) as err:
            cpu = err
        if cpu is None:
            assert torch.cpu._is_amx_tile_supported()  # only oneDNN's path lets one through
        kind, head = (ValueError, "Invalid scaling configuration") if cpu is None else \
            (type(cpu), re.escape(str(cpu).splitlines()[0][:40]))
        with pytest.raises(kind, match=head):
            torch._scaled_mm(*[t.to("tpu") for t in bad], out_dtype=torch.float32)


@pytest.mark.parametrize("mode", MODES)
def test_int_mm_exact(mode):
    a = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 48), dtype=torch.int8)
    want = torch._int_mm(a, b)
    got = run(mode, torch._int_mm, a, b)
    assert got.dtype == torch.int32 and torch.equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_weight_int8pack_mm(dt, mode):
    x = torch.randn(8, 64).to(dt)
    w = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    s = (torch.rand(32) / 64).to(dt)
    op = torch.ops.aten._weight_int8pack_mm
    want = op(x, w, s)
    got = run(mode, op, x, w, s)
    ref = (x.double() @ w.double().t()) * s.double()
    err_cpu = (want.double() - ref).abs().max().item()
    err_tpu = (got.double() - ref).abs().max().item()
    assert got.dtype == dt and err_tpu <= max(2 * err_cpu, _EPS.get(dt, 2 ** -10) * ref.abs().max().item())


# ---- out_dtype higher-order op --------------------------------------------------------------

def test_out_dtype_in_compiled_graph():
    from torch._higher_order_ops.out_dtype import out_dtype

    a = torch.randint(-128, 128, (16, 32), dtype=torch.int8)
    b = torch.randint(-128, 128, (32, 8), dtype=torch.int8)
    x = torch.randn(16, 8)

    def f(a, b, x):
        return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b), \
            out_dtype(torch.ops.aten.mul.Tensor, torch.float32, a[:, :8], x.bfloat16())

    want = f(a, b, x)
    torch._dynamo.reset()
    got = torch.compile(f, backend="tpu")(a.to("tpu"), b.to("tpu"), x.to("tpu"))
    assert torch.equal(got[0].cpu(), want[0]) and got[0].dtype == torch.int32
    assert torch.equal(got[1].cpu(), want[1]) and got[1].dtype == torch.float32


# ---- torchao ----------------------------------------------------------------------------------

def _torchao_configs():
    q = pytest.importorskip("torchao.quantization")
    return {
        "int8_weight_only": q.Int8WeightOnlyConfig,
        "int8_dynamic": q.Int8DynamicActivationInt8WeightConfig,
        "float8_weight_only": q.Float8WeightOnlyConfig,
        "float8_dynamic_tensorwise": lambda: q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerTensor()),
        "float8_dynamic_rowwise": lambda: q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow()),
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", ["int8_weight_only", "int8_dynamic", "float8_weight_only",
                                    "float8_dynamic_tensorwise", "float8_dynamic_rowwise"])
def test_torchao_quantized_linear(config, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization import quantize_

        make = _torchao_configs()[config]
        base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 32)).to(torch.bfloat16)
        x = torch.randn(8, 64, dtype=torch.bfloat16)
        cpu = copy.deepcopy(base)
        quantize_(cpu, make())
        tpu = copy.deepcopy(base).to("tpu")
        quantize_(tpu, make())
        with torch.no_grad():  # (a compiled float8 model needs it on CPU too: _scaled_mm has no derivative)
            want = cpu(x)
            got = run(mode, tpu, x)
    # the same quantized weights and scales: equal up to the rounding of the bfloat16 output
    assert_values(got, want, rtol=1.6e-2, atol=1e-2)  # run() read it back
    assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()


def test_torchao_float8_hardware_check_accepts_tpu():
    pytest.importorskip("torchao")
    from torchao.float8 import inference
    from torchao.quantization import PerRow, PerTensor, quant_api

    for mod in (inference, quant_api):
        assert getattr(mod._check_hardware_support, "_torchtpu", False)
        mod._check_hardware_support((PerTensor(), PerTensor()))
        mod._check_hardware_support((PerRow(), PerRow()))
    with pytest.raises(ValueError):
        quant_api._check_hardware_support((PerTensor(), PerRow()))


@pytest.mark.parametrize("mode", MODES)
def test_torchao_float8_training_losses(mode):
    """convert_to_float8_training: ten SGD steps, losses within 1e-2 relative of CPU's."""
    pytest.importorskip("torchao.float8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.float8 import convert_to_float8_training

        base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
        data = [(torch.randn(32, 64), torch.randn(32, 32)) for _ in range(10)]

        def train(dev):
            m = copy.deepcopy(base).to(dev)
            convert_to_float8_training(m)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            f = m
            if dev == "tpu" and mode == "compile":
                torch._dynamo.reset()
                f = torch.compile(m, backend="tpu")
            losses = []
            with torchtpu.eager_mode("defer_and_fuse" if mode == "defer_and_fuse" else "strict"):
                for x, y in data:
                    loss = torch.nn.functional.mse_loss(f(x.to(dev)), y.to(dev))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
            return losses

        cpu, tpu = train("cpu"), train("tpu")
    for c, t in zip(cpu, tpu):
        assert abs(c - t) <= 1e-2 * abs(c), (cpu, tpu)
