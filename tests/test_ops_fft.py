"""FFT family (_fft_c2c, _fft_r2c, _fft_c2r and every torch.fft.* built on them) on tpu vs CPU."""
import pytest
import torch

import conftest
import torchtpu
from conftest import assert_same, check

pytestmark = conftest.IN_EVERY_MODE  # strict here; defer_and_fuse and compile in the slow tier

aten = torch.ops.aten


def rc(*shape, dtype=torch.complex64):
    return torch.randn(*shape, dtype=dtype)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# --- the ATen primitives directly -------------------------------------------------


@pytest.mark.parametrize("norm", [0, 1, 2])
@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("dim", [[1], [0, 1, 2], [2, 0]])
def test_fft_c2c(no_fallback, norm, forward, dim):
    out = check(aten._fft_c2c, rc(3, 4, 5), dim, norm, forward)
    assert out.dtype == torch.complex64


@pytest.mark.parametrize("norm", [0, 1, 2])
@pytest.mark.parametrize("onesided", [True, False])
@pytest.mark.parametrize("dim", [[2], [0, 2], [0, 1, 2]])
def test_fft_r2c(no_fallback, norm, onesided, dim):
    out = check(aten._fft_r2c, r(3, 4, 5), dim, norm, onesided)
    assert out.dtype == torch.complex64


@pytest.mark.parametrize("norm", [0, 1, 2])
@pytest.mark.parametrize("dim,last", [([1], 6), ([1], 7), ([0, 1], 6), ([0, 1], 7), ([1, 2], 9)])
def test_fft_c2r(no_fallback, norm, dim, last):
    x = torch.fft.rfftn(r(3, 10, 10), dim=dim)  # a genuinely Hermitian half-spectrum
    x = x.narrow(dim[-1], 0, last // 2 + 1).contiguous()
    # unnormalized sums of ~50 terms: float32 rounding differs between pocketfft and XLA
    out = check(aten._fft_c2r, x, dim, norm, last, atol=1e-4, rtol=1e-5)
    assert out.dtype == torch.float32 and out.shape[dim[-1]] == last


def test_fft_float64_gives_complex128(no_fallback):
    assert check(aten._fft_r2c, r(6, dtype=torch.float64), [0], 0, True).dtype == torch.complex128
    assert check(aten._fft_c2c, rc(6, dtype=torch.complex128), [0], 2, False).dtype == torch.complex128
    x = torch.fft.rfft(r(6, dtype=torch.float64))
    assert check(aten._fft_c2r, x, [0], 2, 6).dtype == torch.float64


def test_fft_out_variants(no_fallback):
    for fn, x, args in [
        (aten._fft_c2c.out, rc(4, 6), ([1], 1, True)),
        (aten._fft_r2c.out, r(4, 6), ([0, 1], 0, True)),
        (aten._fft_c2r.out, torch.fft.rfft(r(4, 6)), ([1], 2, 6)),
    ]:
        ref = fn.overloadpacket.default(x, *args)
        out = torch.empty(0, dtype=ref.dtype, device="tpu")
        res = fn(x.to("tpu"), *args, out=out)
        assert res is out
        assert_same(out, ref)


# --- the torch.fft API -------------------------------------------------------------


@pytest.mark.parametrize("norm", [None, "backward", "ortho", "forward"])
def test_fft_api_1d(no_fallback, norm):
    x, z = r(5, 8), rc(5, 8)
    check(torch.fft.fft, x, norm=norm)
    check(torch.fft.fft, z, n=11, dim=0, norm=norm)
    check(torch.fft.ifft, z, norm=norm)
    check(torch.fft.rfft, x, n=7, norm=norm)
    check(torch.fft.irfft, z, norm=norm)
    check(torch.fft.irfft, z, n=9, norm=norm)
    check(torch.fft.hfft, z, n=10, norm=norm)
    check(torch.fft.ihfft, x, norm=norm)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft_api_nd(no_fallback, norm):
    x, z = r(2, 3, 4, 6), rc(2, 3, 4, 6)
    check(torch.fft.fft2, z, norm=norm)
    check(torch.fft.ifft2, x, s=(5, 4), norm=norm)
    check(torch.fft.fftn, z, norm=norm)  # 4 transformed dims: more than XLA's 3 at once
    check(torch.fft.ifftn, z, dim=(0, 2), norm=norm)
    check(torch.fft.rfft2, x, norm=norm)
    check(torch.fft.rfftn, x, s=(3, 4, 6), norm=norm)
    check(torch.fft.irfft2, z, s=(3, 7), norm=norm)
    check(torch.fft.irfftn, z, norm=norm)
    check(torch.fft.hfft2, z, norm=norm)
    check(torch.fft.hfftn, z, s=(4, 5), dim=(1, 3), norm=norm)
    check(torch.fft.ihfft2, x, norm=norm)
    check(torch.fft.ihfftn, x, norm=norm)


def test_fft_noncontiguous_and_int(no_fallback):
    x = r(6, 8)
    z = rc(6, 8)
    check(lambda t: torch.fft.fft(t.t()), x)
    check(lambda t: torch.fft.fft2(t[::2, 1::2]), z)
    check(lambda t: torch.fft.rfft(t[:, ::2], dim=0), x)
    check(lambda t: torch.fft.irfft(t.t()), z)
    check(torch.fft.fft, torch.randint(-5, 5, (7,)))  # int64 -> complex64
    check(torch.fft.rfft, torch.randint(-5, 5, (3, 7)))


def test_fft_zero_dim_and_no_dims(no_fallback):
    # (an empty batch, e.g. fft of a (0, 8) tensor, raises in CPU PyTorch's MKL backend)
    check(torch.fft.fft, torch.tensor(2.5).reshape(1))
    check(torch.fft.fftn, r(4), dim=())  # no dims: a cast to complex
    check(torch.fft.fftn, torch.tensor(1.5))  # 0-dim input: no dims


def test_fftshift_roundtrip(no_fallback):
    z = rc(4, 6)
    check(lambda t: torch.fft.ifftshift(torch.fft.ifft(torch.fft.fft(torch.fft.fftshift(t)))), z)


def test_fft_inplace_style_out(no_fallback):
    out = torch.empty(3, 5, dtype=torch.complex64, device="tpu")
    x = r(3, 5)
    torch.fft.fft(x.to("tpu"), out=out)
    assert_same(out, torch.fft.fft(x))


# --- backward ------------------------------------------------------------------------


def test_fft_backward(no_fallback):
    check(lambda t: torch.fft.fft(t), r(4, 6), grad=True)
    check(lambda t: torch.fft.ifft(t, norm="ortho"), rc(4, 6), grad=True)
    check(lambda t: torch.fft.fftn(t, s=(5, 7)), rc(4, 6), grad=True)
    check(lambda t: torch.fft.rfft(t, norm="forward"), r(4, 7), grad=True)
    check(lambda t: torch.fft.rfft2(t), r(4, 6), grad=True)
    check(lambda t: torch.fft.irfft(t, n=9), rc(4, 5), grad=True)
    check(lambda t: torch.fft.irfftn(t, norm="ortho"), rc(3, 4, 5), grad=True)
    check(lambda t: torch.fft.hfft(t), rc(4, 5), grad=True)
    check(lambda t: torch.fft.ihfft2(t), r(4, 6), grad=True)


# --- stft / istft -----------------------------------------------------------------------


def test_stft(no_fallback):
    w = torch.hann_window(8)
    sig = r(2, 40)
    check(lambda s, w: torch.stft(s, 8, hop_length=2, window=w, return_complex=True), sig, w)
    check(lambda s: torch.stft(s, 16, hop_length=4, onesided=False, return_complex=True), sig)
    check(lambda s: torch.stft(s, 8, hop_length=3, window=torch.hann_window(8, device=s.device),
                               return_complex=True), sig, grad=True)


def test_istft_ffts_native():
    # istft also calls aten::equal (a window-envelope check: not this family), so only
    # require that no FFT primitive falls back.
    w = torch.hann_window(8)
    S = torch.stft(r(2, 40), 8, hop_length=2, window=w, return_complex=True)
    torchtpu.reset_metrics()
    check(lambda s, w: torch.istft(s, 8, hop_length=2, window=w), S, w)
    fell = torchtpu.metrics()["fallback_ops"]
    assert not [k for k in fell if "fft" in k], fell
