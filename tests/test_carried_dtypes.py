"""complex32 and the sub-byte / bits dtypes on tpu against CPU (issue 35).

XLA has no element type for them: their buffers carry a same-size type's bits (runtime/jaxenv.py
CARRIED) and eager/carried.py serves their ops. CPU PyTorch is the oracle for which ops exist
(what it refuses raises its own error on tpu, never a number) and for every bit of what they
give: complex32 results are compared as int32 bits, float16 ones as int16.
"""
import warnings

import pytest
import torch

import torchtpu
from conftest import run_in_mode as run
from torchtpu.runtime.jaxenv import BITS, SUB_BYTE
from conftest import MODES, assert_bits

pytestmark = pytest.mark.usefixtures("no_fallback")

SLOW = pytest.mark.slow


def _modes(first_fast=("strict", "compile")):
    return [pytest.param(m, marks=[] if m in first_fast else [SLOW]) for m in MODES]


def cpu(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def _chalf(n=64, seed=0):
    """complex32 values: random normals of several scales, and parts that are float16's specials
    (inf, NaN, -0, subnormals, the largest finite)."""
    g = torch.Generator().manual_seed(seed)
    parts = torch.cat([torch.randn(2 * n, generator=g) * s for s in (1e-3, 1, 300)]).half()
    spec = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 6e-8, -6e-8, 65504, -65504, 1.0],
                        dtype=torch.float16)
    parts = torch.cat([parts, spec, spec.flip(0)])
    return torch.view_as_complex(parts.view(-1, 2))


# ----------------------------------------------------------------------------- complex32


def test_complex32_transfers_every_bit():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (4096,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.complex32)
    t = x.to("tpu")
    assert t.dtype == torch.complex32 and t.device.type == "tpu"
    assert torch.equal(t.cpu().view(torch.int32), bits)
    assert torch.equal(t[3:9].cpu().view(torch.int32), bits[3:9])
    assert torch.equal(t.view(torch.int32).cpu(), bits)
    assert torch.equal(t.view(torch.float16).cpu().view(torch.int16), x.view(torch.float16).view(torch.int16))
    assert torch.equal(t.clone().cpu().view(torch.int32), bits)  # moves keep NaN payloads
    assert torch.equal(torch.cat([t, t]).cpu().view(torch.int32), torch.cat([bits, bits]))
    assert t[5].item() == x[5].item() or (x[5].item() != x[5].item())


_SRCS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
         torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("mode,src", [pytest.param(m, s, marks=[SLOW] if m == "compile" and s is not torch.float32 else [],
                                                   id=f"{s}-{m}") for s in _SRCS for m in MODES])
def test_complex32_casts_bit_exact(src, mode):
    g = torch.Generator().manual_seed(1)
    if src.is_complex or src.is_floating_point:
        base = torch.cat([torch.randn(256, generator=g) * s for s in (1e-6, 1, 1e3, 1e5)])
        base = torch.cat([base, torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 65504, 65520,
                                              1e-8, 7e4])])
        x = torch.complex(base, base.flip(0)).to(src) if src.is_complex else base.to(src)
    elif src == torch.bool:
        x = torch.randint(0, 2, (64,), generator=g).bool()
    else:
        x = torch.randint(0, 200, (64,), generator=g).to(src)
    assert_bits(run(mode, lambda a: a.to(torch.complex32), x), cpu(lambda a: a.to(torch.complex32), x))
    c = _chalf()
    if not (src.is_floating_point or src.is_complex or src == torch.bool):
        # inf, NaN and values past the integer type are C++'s undefined behaviour in CPU's cast
        # (x86 gives INT_MIN; tpu's float32 -> int casts saturate, complex32 goes through them)
        c = c[(torch.view_as_real(c).abs() < 200).all(-1)]
    assert_bits(run(mode, lambda a: a.to(src), c), cpu(lambda a: a.to(src), c))


_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "neg": lambda a, b: -a,
    "abs": lambda a, b: a.abs(), "conj_physical": lambda a, b: a.conj_physical(),
    "conj_resolve": lambda a, b: a.conj().resolve_conj(), "real": lambda a, b: a.real.clone(),
    "imag": lambda a, b: a.imag.clone(), "eq": lambda a, b: a == b, "ne": lambda a, b: a != a,
    "isnan": lambda a, b: a.isnan(), "isinf": lambda a, b: a.isinf(), "isfinite": lambda a, b: a.isfinite(),
    "sgn": lambda a, b: a.sgn(), "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.3 + 0.2j),
    "mul_scalar": lambda a, b: a * (1.5 - 2j), "add_scalar": lambda a, b: a + 3, "rsub": lambda a, b: 1 - a,
    "mul_half": lambda a, b: a * a.real, "add_cfloat": lambda a, b: a + b.to(torch.complex64),
    "cat": lambda a, b: torch.cat([a, b]), "stack": lambda a, b: torch.stack([a, b]),
    "where": lambda a, b: torch.where(a.real > 0, a, b), "masked_fill": lambda a, b: a.masked_fill(a.real > 0, 2 - 1j),
    "index_select": lambda a, b: a.index_select(0, torch.arange(0, a.shape[0], 3, device=a.device)),
    "flip_via_index": lambda a, b: a[torch.arange(a.shape[0] - 1, -1, -1, device=a.device)],
    "roll": lambda a, b: a.roll(3), "transpose_contiguous": lambda a, b: a.view(-1, 2).t().contiguous(),
    "complex_of_halves": lambda a, b: torch.complex(a.real.clone(), b.imag.clone()),
    "view_as_real": lambda a, b: torch.view_as_real(a).clone(), "zeros_like": lambda a, b: torch.zeros_like(a),
    "full": lambda a, b: torch.full((3,), 1.5 + 2j, dtype=torch.complex32, device=a.device),
    "index_put": lambda a, b: a.index_put((torch.tensor([0, 2], device=a.device),), b[:2]),
    "addcmul_out": lambda a, b: torch.addcmul(a, a, b, value=2, out=torch.empty_like(a)),
    "addcmul_": lambda a, b: a.clone().addcmul_(b, b, value=-1j),
    "inplace_add": lambda a, b: a.clone().add_(b), "copy_from_cfloat": lambda a, b: a.clone().copy_(b.to(torch.complex64) * 3),
    "outer": lambda a, b: torch.outer(a[:8], b[:8]),
}


@pytest.mark.parametrize("mode", _modes())
def test_complex32_ops_bit_exact(mode):
    a, b = _chalf(seed=2), _chalf(seed=3)
    for name, fn in _OPS.items():
        if mode == "compile" and name not in ("add", "mul", "abs", "addcmul", "cat", "where"):
            continue  # compiled graphs run these same kernels (one compile each is enough)
        try:
            assert_bits(run(mode, fn, a, b), cpu(fn, a, b))
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


_REFUSED = {
    "div": lambda a: a / a, "exp": lambda a: a.exp(), "sum": lambda a: a.sum(), "mm": lambda a: a.view(2, -1) @ a.view(-1, 2),
    "flip": lambda a: a.flip(0), "sort": lambda a: a.sort(), "max": lambda a: a.max(), "pow": lambda a: a.pow(2),
    "gather": lambda a: a.gather(0, torch.zeros(2, dtype=torch.int64, device=a.device)), "clamp": lambda a: a.clamp(0, 1),
    "sign": lambda a: a.sign(), "cumsum": lambda a: a.cumsum(0), "sigmoid": lambda a: a.sigmoid(),
    "arange": lambda a: torch.arange(3, dtype=torch.complex32, device=a.device), "take": lambda a: a.take(a.real.long()[:1] * 0),
}


def _refuses_as_cpu(mode, name, fn, x):
    """fn(x) raises on tpu in `mode` the exception CPU raises (its first line)."""
    try:
        cpu(fn, x)
    except Exception as err:  # noqa: BLE001
        want = err
    else:
        raise AssertionError(f"{name}: CPU accepts it")
    with pytest.raises(type(want)) as got:
        run(mode, fn, x)
    assert str(want).splitlines()[0] in str(got.value), (name, str(got.value)[:300])


@pytest.mark.parametrize("mode", MODES)
def test_complex32_refuses_what_cpu_refuses(mode):
    a = _chalf(8)
    for name, fn in _REFUSED.items():
        if mode == "compile" and name not in ("div", "exp", "sum"):
            continue
        _refuses_as_cpu(mode, name, fn, a)


_PROMOTED = {  # float16 with a complex scalar (or 0-d complex tensor): complex32 on CPU
    "add": lambda h: h + (1.1 + 2.3j), "radd": lambda h: 1j + h, "sub_alpha": lambda h: h.sub(0.3 - 1.7j, alpha=3),
    "rsub": lambda h: (0.7 + 1j) - h, "mul": lambda h: h * (0.3 - 0.7j), "mul_0d": lambda h: h * torch.tensor(1j),
    "add_0d_cfloat": lambda h: h + torch.tensor(0.1 + 0.2j, dtype=torch.complex64),
    "where": lambda h: torch.where(h > 0, h, 2.2 - 1j), "sgn": lambda h: (h + 1j).sgn(),
    "eq": lambda h: h == 1j, "half_cfloat": lambda h: h + h.nan_to_num(0, 0, 0).to(torch.complex64) * 1j,  # complex64: no carrier
    "half0d_cdouble": lambda h: h[3] * h.nan_to_num(0, 0, 0).to(torch.complex128), "add_out": lambda h: torch.add(h, 1j, out=torch.empty(h.shape, dtype=torch.chalf, device=h.device)),
}
_PROMOTED_REFUSED = {"div": lambda h: h / 1j, "lt": lambda h: h < 1j, "pow": lambda h: h ** 1j,
                     "mul_": lambda h: h.clone().mul_(1j), "addcmul": lambda h: torch.addcmul(h, h, h, value=1j)}


@pytest.mark.parametrize("mode", MODES)
def test_complex32_as_promoted_result(mode):
    """x_f16 + 1j is complex32 as on CPU (each part rounded once from complex64), also as the
    process's first complex32 (the kernel entries only look for carried dtypes once one has been
    seen: executor.execute hands that first call back to eager/carried.py); what CPU refuses
    raises CPU's error."""
    from torchtpu.runtime.jaxenv import CARRIED_SEEN

    h = _chalf(16, seed=4).real.clone()
    for first in (True, False):
        for name, fn in _PROMOTED.items():
            if mode == "compile" and name not in ("add", "mul_0d", "where"):
                continue
            try:
                CARRIED_SEEN[0] = not first and CARRIED_SEEN[0]
                assert_bits(run(mode, fn, h), cpu(fn, h))
            except AssertionError as err:
                raise AssertionError(f"{name} (first carried call: {first}): {err}") from None
            finally:
                CARRIED_SEEN[0] = True  # tensors of carried dtypes exist: every call is checked
    for name, fn in _PROMOTED_REFUSED.items():
        if mode == "compile" and name != "div":
            continue
        _refuses_as_cpu(mode, name, fn, h)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_complex32_factory_as_first_carried_call(mode):
    """torch.ones(dtype=torch.chalf) as the process's first carried-dtype call is complex32, not
    its uint32 carrier (the lowering ran on the carrier before anything had been seen)."""
    from torchtpu.runtime.jaxenv import CARRIED_SEEN

    for fn in (lambda d: torch.ones(3, dtype=torch.chalf, device=d),
               lambda d: torch.full((2,), 1.5 - 2j, dtype=torch.chalf, device=d),
               lambda d: torch.scalar_tensor(1j, dtype=torch.chalf, device=d)):
        CARRIED_SEEN[0] = False
        try:
            with torchtpu.eager_mode(mode):
                got = fn("tpu").cpu()
        finally:
            CARRIED_SEEN[0] = True
        assert_bits(got, fn("cpu"))


def test_carried_dtypes_empty_tensors():
    """Zero-element complex32 / uint4 tensors through calls CPU decides (eager/carried.py): their
    CPU stand-ins are built from an empty buffer (test_tensor_factories_empty)."""
    for dt in (torch.chalf, torch.uint4):
        for shape in [(5, 0, 1), (0,)]:
            for fn in (lambda d: torch.empty(shape, device=d, dtype=dt)[..., :0].clone(),
                       lambda d: torch.full_like(torch.zeros(shape, device=d, dtype=dt), 3) if dt == torch.chalf
                       else torch.empty(shape, device=d, dtype=dt).clone()):
                got, want = fn("tpu"), cpu(fn, "cpu")
                assert (got.shape, got.dtype) == (want.shape, want.dtype), (dt, shape)


# ----------------------------------------------------------------------------- sub-byte and bits


def _bytes(dt, n=12):
    carrier = torch.uint16 if dt == torch.bits16 else torch.uint8
    return torch.arange(n, dtype=torch.int32).to(carrier).view(dt), carrier


@pytest.mark.parametrize("mode,dt", [pytest.param(m, d, marks=[SLOW] if m != "strict" and d not in (torch.uint4, torch.bits8) else [],
                                                  id=f"{d}-{m}") for d in SUB_BYTE + BITS for m in ("strict", "defer_and_fuse")])
def test_sub_byte_storage(dt, mode):
    """What CPU does with these dtypes (allocation, transfers, views, cat, and for bits dtypes
    clone/copy_), on tpu with the same bytes; what it refuses, refused alike. Not compiled: Dynamo
    cannot trace them on CPU either (its fake tensors' type promotion has no sub-byte type)."""
    x, carrier = _bytes(dt)
    with torchtpu.eager_mode(mode):
        for make in (lambda: torch.empty(3, 4, dtype=dt, device="tpu"), lambda: torch.zeros(5, dtype=dt, device="tpu"),
                     lambda: torch.empty_strided((2, 3), (1, 2), dtype=dt, device="tpu")):
            t = make()
            assert t.dtype == dt and t.device.type == "tpu"
        assert torch.equal(torch.zeros(5, dtype=dt, device="tpu").cpu().view(carrier), torch.zeros(5, dtype=carrier))
        t = x.to("tpu")
        assert t.dtype == dt
        back = t.cpu()
        assert back.dtype == dt and torch.equal(back.view(carrier), x.view(carrier))
        assert torch.equal(x.view(carrier).to("tpu").view(dt).cpu().view(carrier), x.view(carrier))
        assert torch.equal(t[2:7].cpu().view(carrier), x.view(carrier)[2:7])
        assert torch.equal(t.view(3, 4)[:, 1].cpu().view(carrier), x.view(carrier).view(3, 4)[:, 1])
        got = torch.cat([t, t[:3]])
        assert got.dtype == dt and torch.equal(got.cpu().view(carrier), torch.cat([x, x[:3]]).view(carrier))
        for name, fn in {"clone": lambda a: a.clone(), "contiguous": lambda a: a.view(3, 4).t().contiguous(),
                         "copy_": lambda a: torch.empty_like(a).copy_(a), "eq": lambda a: a == a,
                         "to_float": lambda a: a.float(), "fill_": lambda a: a.clone().fill_(1),
                         "add": lambda a: a + a, "item": lambda a: a[0].item(), "sum": lambda a: a.sum(),
                         "from_float": lambda a: torch.ones(2, device=a.device).to(dt)}.items():
            try:
                want = cpu(fn, x)
            except Exception as err:  # noqa: BLE001
                with pytest.raises(type(err)) as got:
                    cpu(fn, t)
                assert str(err).splitlines()[0] in str(got.value), (name, str(got.value)[:300])
                continue
            got = cpu(fn, t)
            assert got.dtype == want.dtype, name
            assert torch.equal(got.cpu().view(carrier), want.view(carrier)), name
