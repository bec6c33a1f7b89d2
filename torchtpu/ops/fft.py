"""FFT lowerings: _fft_c2c, _fft_r2c, _fft_c2r.

Every torch.fft.* function (fft, ifft, rfft, irfft, hfft, ihfft and their 2-D / N-D
forms, stft/istft) decomposes into these three ATen primitives, and so do their
derivatives (`_fft_c2c` is its own adjoint with the direction flipped; the backward of
`_fft_r2c` pads the gradient and runs `_fft_c2c`; the backward of `_fft_c2r` runs
`_fft_r2c`).

ATen encodes the scaling as `normalization`: 0 = none, 1 = 1/sqrt(n), 2 = 1/n, applied
whatever the direction. jnp.fft names the scaling after the direction of the transform
("backward" = no scaling on the forward transform, 1/n on the inverse), so the map
depends on the direction.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import lower

# normalization code -> jnp.fft `norm` for a forward transform / for an inverse transform
_NORM_FORWARD = {0: "backward", 1: "ortho", 2: "forward"}
_NORM_INVERSE = {0: "forward", 1: "ortho", 2: "backward"}


def _dims(dim, ndim):
    return tuple(int(d) % ndim if ndim else 0 for d in dim)


def _complex_of(dtype):
    return jnp.complex128 if jnp.dtype(dtype) in (jnp.float64, jnp.complex128) else jnp.complex64


def _real_of(dtype):
    return jnp.float64 if jnp.dtype(dtype) in (jnp.float64, jnp.complex128) else jnp.float32


def _scale(x, dims, normalization, sizes=None):
    """Scale an unnormalized transform by ATen's `normalization` code (no-op for 0)."""
    if normalization == 0:
        return x
    n = 1
    for i, d in enumerate(dims):
        n *= int(sizes[i] if sizes is not None else x.shape[d])
    if n == 0:
        return x
    s = (1.0 / n ** 0.5) if normalization == 1 else (1.0 / n)
    return x * jnp.asarray(s, dtype=_real_of(x.dtype))


@lower("_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    """Complex-to-complex FFT over `dim` (forward or inverse), output dtype = input dtype."""
    x = self
    out_dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.complexfloating) else _complex_of(x.dtype)
    x = x.astype(out_dtype)
    dims = _dims(dim, x.ndim)
    if not dims or x.size == 0:
        return _scale(x, dims, normalization)
    if forward:
        y = jnp.fft.fftn(x, axes=dims, norm=_NORM_FORWARD[normalization])
    else:
        y = jnp.fft.ifftn(x, axes=dims, norm=_NORM_INVERSE[normalization])
    return y.astype(out_dtype)


@lower("_fft_r2c")
def fft_r2c(self, dim, normalization, onesided):
    """Real-to-complex forward FFT over `dim`; `onesided` keeps n//2+1 bins of dim[-1]."""
    x = self
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype in (jnp.float16, jnp.bfloat16):
        x = x.astype(jnp.float32) if x.dtype != jnp.float64 else x
    out_dtype = _complex_of(x.dtype)
    dims = _dims(dim, x.ndim)
    norm = _NORM_FORWARD[normalization]
    if not dims:
        return x.astype(out_dtype)
    if x.size == 0:
        shape = list(x.shape)
        if onesided:
            shape[dims[-1]] = shape[dims[-1]] // 2 + 1
        return jnp.zeros(shape, out_dtype)
    if onesided:
        y = jnp.fft.rfftn(x, axes=dims, norm=norm)
    else:
        y = jnp.fft.fftn(x.astype(out_dtype), axes=dims, norm=norm)
    return y.astype(out_dtype)


@lower("_fft_c2r")
def fft_c2r(self, dim, normalization, last_dim_size):
    """Complex-to-real inverse FFT over `dim` of a onesided (Hermitian) half-spectrum;
    dim[-1] of the output has `last_dim_size` points."""
    x = self
    if not jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = x.astype(_complex_of(x.dtype))
    out_dtype = _real_of(x.dtype)
    dims = _dims(dim, x.ndim)
    last_dim_size = int(last_dim_size)
    if not dims:
        return jnp.real(x).astype(out_dtype)
    sizes = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    if x.size == 0 or last_dim_size == 0:
        shape = list(x.shape)
        shape[dims[-1]] = last_dim_size
        return jnp.zeros(shape, out_dtype)
    # The half-spectrum along dim[-1] must hold last_dim_size//2+1 bins: crop or zero-pad.
    need = last_dim_size // 2 + 1
    have = x.shape[dims[-1]]
    if have > need:
        x = jax.lax.slice_in_dim(x, 0, need, axis=dims[-1])
    elif have < need:
        pad = [(0, 0)] * x.ndim
        pad[dims[-1]] = (0, need - have)
        x = jnp.pad(x, pad)
    y = jnp.fft.irfftn(x, s=sizes, axes=dims, norm=_NORM_INVERSE[normalization])
    return y.astype(out_dtype)
