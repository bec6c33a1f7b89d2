"""Less common nn ops: grid sampling, unpooling, embedding bags, CTC, distances, margin losses.

Conventions (as in nn.py):
* half/bfloat16 inputs are computed in float32 (PyTorch's opmath) and cast back.
* Geometry (kernel sizes, output sizes) is static; index tables are built with numpy at trace time.
* Backward ops whose PyTorch formula is the true gradient of the forward are written as the
  vjp of our own forward (grid sampling, anti-aliased upsampling, im2col/col2im); the others
  (CTC, cdist/pdist at zero distance, segment max/min ties) follow PyTorch's formulas.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._common import opmath_dtype as _opmath
from .nn import _HI, _up  # shared with the core nn family
from .registry import kernel, lower


# --- channel_shuffle ----------------------------------------------------------


@lower("channel_shuffle", "native_channel_shuffle")
def channel_shuffle(self, groups):
    n, c = self.shape[0], self.shape[1]
    rest = self.shape[2:]
    g = int(groups)
    x = self.reshape((n, g, c // g) + rest)
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)


# --- im2col / col2im / unfold_backward ------------------------------------------


def _im2col_geom(h, w, kernel_size, dilation, padding, stride):
    kh, kw = kernel_size
    dh, dw = dilation
    ph, pw = padding
    sh, sw = stride
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    return kh, kw, dh, dw, ph, pw, sh, sw, oh, ow


@lower("im2col")
def im2col(self, kernel_size, dilation, padding, stride):
    batched = self.ndim == 4
    x = self if batched else self[None]
    n, c, h, w = x.shape
    kh, kw, dh, dw, ph, pw, sh, sw, oh, ow = _im2col_geom(h, w, kernel_size, dilation, padding, stride)
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = []
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dh, j * dw
            sl = xp[:, :, r0:r0 + sh * (oh - 1) + 1:sh, c0:c0 + sw * (ow - 1) + 1:sw]
            cols.append(sl.reshape(n, c, oh * ow))
    out = jnp.stack(cols, axis=2).reshape(n, c * kh * kw, oh * ow)
    return out if batched else out[0]


_COL2IM_UNROLL = 64  # kernel taps up to which col2im adds one strided slice per tap (cheap, no scatter)


@lower("col2im")
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    batched = self.ndim == 3
    x = self if batched else self[None]
    h, w = output_size
    kh, kw, dh, dw, ph, pw, sh, sw, oh, ow = _im2col_geom(h, w, kernel_size, dilation, padding, stride)
    n = x.shape[0]
    c = x.shape[1] // (kh * kw)
    cols = x.reshape(n, c, kh, kw, oh, ow)
    out = jnp.zeros((n, c, h + 2 * ph, w + 2 * pw), _opmath(x.dtype))
    cols = cols.astype(out.dtype)
    if kh * kw > _COL2IM_UNROLL:
        # a long kernel (an ISTFT's overlap-add folds n_fft = 1920 taps): one scatter-add over every
        # (tap, position) pair; one strided add per tap unrolls into a program XLA compiles for minutes
        hp, wp = out.shape[2:]
        i, j, a, b = np.ix_(np.arange(kh), np.arange(kw), np.arange(oh), np.arange(ow))
        idx = ((i * dh + a * sh) * wp + (j * dw + b * sw)).reshape(-1)
        out = out.reshape(n, c, hp * wp).at[:, :, idx].add(cols.reshape(n, c, -1)).reshape(n, c, hp, wp)
    else:
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dh, j * dw
                out = out.at[:, :, r0:r0 + sh * (oh - 1) + 1:sh, c0:c0 + sw * (ow - 1) + 1:sw].add(cols[:, :, i, j])
    out = out[:, :, ph:ph + h, pw:pw + w].astype(self.dtype)
    return out if batched else out[0]


@lower("unfold_backward")
def unfold_backward(grad_in, input_sizes, dim, size, step):
    input_sizes = tuple(int(s) for s in input_sizes)
    if len(input_sizes) == 0:
        return grad_in.reshape(())
    nd = len(input_sizes)
    dim = dim % nd
    g = _up(grad_in)
    nwin = g.shape[dim]
    out = jnp.zeros(input_sizes, g.dtype)
    # grad_in: input_sizes with dim -> nwin, plus a trailing window axis of `size`
    for k in range(size):
        piece = g[..., k]
        idx = [slice(None)] * nd
        idx[dim] = slice(k, k + step * (nwin - 1) + 1, step)
        if nwin > 0:
            out = out.at[tuple(idx)].add(piece)
    return out.astype(grad_in.dtype)


# --- max_unpool -------------------------------------------------------------------


def _max_unpool(self, indices, output_size, nsp):
    batched = self.ndim == nsp + 2
    x = self if batched else self[None]
    ind = indices if batched else indices[None]
    n, c = x.shape[:2]
    total = int(np.prod(output_size))
    flat = x.reshape(n, c, -1)
    fi = ind.reshape(n, c, -1)
    out = jnp.zeros((n, c, total), x.dtype)
    ni = jnp.arange(n)[:, None, None]
    ci = jnp.arange(c)[None, :, None]
    out = out.at[ni, ci, fi].set(flat, mode="drop")
    out = out.reshape((n, c) + tuple(int(s) for s in output_size))
    return out if batched else out[0]


@lower("max_unpool2d")
def max_unpool2d(self, indices, output_size):
    return _max_unpool(self, indices, output_size, 2)


@lower("max_unpool3d")
def max_unpool3d(self, indices, output_size, stride, padding):
    return _max_unpool(self, indices, output_size, 3)


# --- distances ----------------------------------------------------------------------


def _pnorm(diff, p):
    """Distance from per-coordinate differences (last axis) for a static p."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if math.isinf(p):
        return jnp.max(a, axis=-1, initial=0.0) if a.shape[-1] else jnp.zeros(a.shape[:-1], a.dtype)
    return jnp.power(jnp.sum(jnp.power(a, p), axis=-1), 1.0 / p)


def _pnorm_grad(diff, dist, p):
    """d dist / d diff (PyTorch's formulas: 0 where the distance is 0)."""
    dist = dist[..., None]
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if p == 2:
        return jnp.where(dist == 0, 0.0, diff / jnp.where(dist == 0, 1.0, dist))
    if math.isinf(p):
        return jnp.sign(diff) * (jnp.abs(diff) == dist).astype(diff.dtype)
    safe = jnp.where(dist == 0, 1.0, dist)
    if p < 2:
        val = jnp.sign(diff) * jnp.power(jnp.abs(diff), p - 1) / jnp.power(safe, p - 1)
        val = jnp.where(diff == 0, 0.0, val)
    else:
        val = diff * jnp.power(jnp.abs(diff), p - 2) / jnp.power(safe, p - 1)
    return jnp.where(dist == 0, 0.0, val)


def _bcast_batch(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (jnp.broadcast_to(x1, batch + x1.shape[-2:]), jnp.broadcast_to(x2, batch + x2.shape[-2:]))


@lower("_cdist_forward")
def _cdist_forward(x1, x2, p, compute_mode):
    a, b = _bcast_batch(_up(x1), _up(x2))
    diff = a[..., :, None, :] - b[..., None, :, :]
    return _pnorm(diff, float(p)).astype(x1.dtype)


@lower("_cdist_backward")
def _cdist_backward(grad, x1, x2, p, cdist):
    a, b = _bcast_batch(_up(x1), _up(x2))
    diff = a[..., :, None, :] - b[..., None, :, :]
    g = _pnorm_grad(diff, _up(cdist), float(p)) * _up(grad)[..., None]
    # x1 broadcast to the common batch, as ATen's kernel returns it: autograd (eager) or the
    # backward graph (compiled: a sum over the batch, then a view) reduces it to x1's shape
    return g.sum(axis=-2).astype(x1.dtype)


@lower("_pdist_forward")
def _pdist_forward(self, p=2.0):
    n = self.shape[0]
    i, j = np.triu_indices(n, 1)
    x = _up(self)
    return _pnorm(x[i] - x[j], float(p)).astype(self.dtype)


@lower("_pdist_backward")
def _pdist_backward(grad, self, p, pdist):
    n = self.shape[0]
    i, j = np.triu_indices(n, 1)
    x = _up(self)
    g = _pnorm_grad(x[i] - x[j], _up(pdist), float(p)) * _up(grad)[:, None]
    out = jnp.zeros_like(x).at[i].add(g).at[j].add(-g)
    return out.astype(self.dtype)


# --- margin losses ------------------------------------------------------------------


def _cotangent(grad_output, shape):
    """The loss's gradient in the loss's shape: a compiled graph's fake loss of a 1-D input with
    reduction='none' is shaped [1] (PyTorch's shape function) where the kernel's is [], so its
    gradient can arrive as [1]."""
    g = _up(grad_output)
    if g.shape != shape and g.size == math.prod(shape):
        return g.reshape(shape)
    return jnp.broadcast_to(g, shape)


def _reduce(loss, reduction):
    if reduction == 1:
        return loss.mean()
    if reduction == 2:
        return loss.sum()
    return loss


def _multi_margin(x, target, p, margin, weight, reduction):
    batched = x.ndim == 2
    xx = x if batched else x.reshape(1, -1)
    t = target.reshape(-1)
    c = xx.shape[1]
    xy = jnp.take_along_axis(xx, t[:, None], axis=1)
    z = margin - xy + xx
    z = jnp.where(z > 0, z, 0.0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight[t][:, None]
    z = jnp.where(jnp.arange(c)[None, :] == t[:, None], 0.0, z)
    loss = z.sum(axis=1) / c
    if reduction == 0:
        return loss if (batched or target.ndim > 0) else loss.reshape(())
    return _reduce(loss, reduction)


@lower("multi_margin_loss", static=("p",))
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=1):
    x = _up(self)
    return _multi_margin(x, target, int(p), jnp.asarray(margin, x.dtype), _up(weight), reduction).astype(self.dtype)


@lower("multi_margin_loss_backward", static=("p",))
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    x = _up(self)
    f = lambda v: _multi_margin(v, target, int(p), jnp.asarray(margin, x.dtype), _up(weight), reduction)
    out, vjp = jax.vjp(f, x)
    return vjp(_cotangent(grad_output, out.shape))[0].astype(self.dtype)


def _multilabel(x, target, reduction):
    batched = x.ndim == 2
    xx = x if batched else x.reshape(1, -1)
    t = target.reshape(xx.shape)
    c = xx.shape[1]
    valid = jnp.cumprod((t >= 0).astype(jnp.int32), axis=1).astype(bool)  # targets up to the first -1
    tc = jnp.where(valid, t, 0)
    is_target = jnp.any(valid[:, :, None] & (tc[:, :, None] == jnp.arange(c)[None, None, :]), axis=1)
    xt = jnp.take_along_axis(xx, tc, axis=1)  # (N, K)
    z = 1.0 - xt[:, :, None] + xx[:, None, :]  # (N, K, C)
    z = jnp.where(z > 0, z, 0.0)
    z = jnp.where(valid[:, :, None] & ~is_target[:, None, :], z, 0.0)
    loss = z.sum(axis=(1, 2)) / c
    if reduction == 0:
        loss = loss if batched else loss.reshape(())
    else:
        loss = _reduce(loss, reduction)
    return loss, is_target.reshape(x.shape).astype(x.dtype)


@lower("multilabel_margin_loss_forward")
def multilabel_margin_loss_forward(self, target, reduction):
    loss, is_target = _multilabel(_up(self), target, reduction)
    return loss.astype(self.dtype), is_target.astype(self.dtype)


@lower("multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    x = _up(self)
    out, vjp = jax.vjp(lambda v: _multilabel(v, target, reduction)[0], x)
    return vjp(_cotangent(grad_output, out.shape))[0].astype(self.dtype)


# --- grid sampling --------------------------------------------------------------------


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(x, size):
    # gradient 0 at and beyond the bounds, as PyTorch's clip_coordinates_set_grad
    return jnp.where(x <= 0, 0.0, jnp.where(x >= size - 1, float(size - 1), x)).astype(x.dtype)


def _reflect(x, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = x - lo
    x = jnp.where(x < 0, -x, x)
    extra = jnp.fmod(x, span)
    flips = jnp.floor(x / span)
    even = jnp.fmod(flips, 2) == 0
    return jnp.where(even, extra + lo, span - extra + lo)


def _pad_coord(x, size, padding_mode, align_corners):
    if padding_mode == 1:
        return _clip(x, size)
    if padding_mode == 2:
        if align_corners:
            x = _reflect(x, 0, 2 * (size - 1))
        else:
            x = _reflect(x, -1, 2 * size - 1)
        return _clip(x, size)
    return x


def _gather(inp, idx):
    """inp (N, C, *S), idx: list of integer arrays (N, *O) per spatial dim -> (N, C, *O)."""
    n, c = inp.shape[:2]
    sp = inp.shape[2:]
    flat = idx[0]
    for i, s in zip(idx[1:], sp[1:]):
        flat = flat * s + i
    out_sp = flat.shape[1:]
    res = jax.vmap(lambda img, f: img[:, f])(inp.reshape(n, c, -1), flat.reshape(n, -1))
    return res.reshape((n, c) + out_sp)


def _tap(inp, coords, sizes):
    """Values at integer-valued float coords; zero outside the input (and for NaN)."""
    ok = None
    idx = []
    for x, s in zip(coords, sizes):
        v = (x >= 0) & (x <= s - 1)
        ok = v if ok is None else ok & v
        idx.append(jnp.where(v, x, 0).astype(jnp.int32))
    vals = _gather(inp, idx)
    return jnp.where(ok[:, None], vals, 0)


def _cubic_coeffs(t):
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_sample(inp, grid, interpolation_mode, padding_mode, align_corners):
    nsp = inp.ndim - 2
    sizes = inp.shape[2:]
    # grid's last axis is (x, y[, z]) = reversed spatial order
    coords = [grid[..., nsp - 1 - d] for d in range(nsp)]
    if interpolation_mode == 2:  # bicubic (2-D only): pad each tap's integer coordinate
        ys, xs = [_unnormalize(c, s, align_corners) for c, s in zip(coords, sizes)]
        y0, x0 = jnp.floor(ys), jnp.floor(xs)
        cy, cx = _cubic_coeffs(ys - y0), _cubic_coeffs(xs - x0)
        out = 0
        for i in range(4):
            yy = _pad_coord(y0 - 1 + i, sizes[0], padding_mode, align_corners)
            row = 0
            for j in range(4):
                xx = _pad_coord(x0 - 1 + j, sizes[1], padding_mode, align_corners)
                row = row + _tap(inp, [yy, xx], sizes) * cx[j][:, None]
            out = out + row * cy[i][:, None]
        return out
    src = [_pad_coord(_unnormalize(c, s, align_corners), s, padding_mode, align_corners)
           for c, s in zip(coords, sizes)]
    if interpolation_mode == 1:  # nearest, ties to even like nearbyint
        return _tap(inp, [jnp.round(x) for x in src], sizes)
    lo = [jnp.floor(x) for x in src]
    frac = [x - l for x, l in zip(src, lo)]
    out = 0
    for corner in range(2 ** nsp):
        bits = [(corner >> (nsp - 1 - d)) & 1 for d in range(nsp)]
        w = 1
        pos = []
        for d, b in enumerate(bits):
            w = w * (frac[d] if b else 1 - frac[d])
            pos.append(lo[d] + b)
        out = out + _tap(inp, pos, sizes) * w[:, None]
    return out


def _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(_up(input), _up(grid), interpolation_mode, padding_mode, align_corners).astype(input.dtype)


def _grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    f = lambda a, g: _grid_sample(a, g, interpolation_mode, padding_mode, align_corners)
    _, vjp = jax.vjp(f, _up(input), _up(grid))
    gi, gg = vjp(_up(grad_output))
    return (gi.astype(input.dtype) if output_mask[0] else None,
            gg.astype(grid.dtype) if output_mask[1] else None)


@lower("grid_sampler_2d")
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)


@lower("grid_sampler_3d")
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)


@lower("grid_sampler_2d_backward")
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask)


@lower("grid_sampler_3d_backward")
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask)


# --- anti-aliased bilinear upsampling -----------------------------------------------------


def _aa_weights(in_size, out_size, align_corners, scale):
    """(out, in) interpolation matrix of PyTorch's separable anti-aliased bilinear filter,
    computed in float32 arithmetic as PyTorch's CPU kernel does for float inputs."""
    f = np.float32
    if align_corners:
        s = f(in_size - 1) / f(out_size - 1) if out_size > 1 else f(0)
    else:
        s = f(1.0 / scale) if (scale is not None and scale > 0) else f(in_size) / f(out_size)
    support = s if s >= 1.0 else f(1.0)
    invscale = f(1.0) / s if s >= 1.0 else f(1.0)
    mat = np.zeros((out_size, in_size), np.float32)
    for i in range(out_size):
        center = s * (f(i) + f(0.5))
        xmin = max(int(center - support + f(0.5)), 0)
        xmax = min(int(center + support + f(0.5)), in_size)
        ws = []
        for j in range(xmin, xmax):
            t = abs((f(j) - center + f(0.5)) * invscale)
            ws.append(f(1.0) - t if t < 1.0 else f(0.0))
        tot = f(0.0)
        for w in ws:
            tot = f(tot + w)
        if tot != 0:
            for j, w in zip(range(xmin, xmax), ws):
                mat[i, j] = w / tot
    return mat


def _aa_apply(x, output_size, align_corners, scales_h, scales_w):
    h, w = x.shape[-2:]
    oh, ow = (int(s) for s in output_size)
    mh = jnp.asarray(_aa_weights(h, oh, align_corners, scales_h), x.dtype)
    mw = jnp.asarray(_aa_weights(w, ow, align_corners, scales_w), x.dtype)
    y = jnp.einsum("...hw,ow->...ho", x, mw, precision=_HI)
    return jnp.einsum("...hw,oh->...ow", y, mh, precision=_HI)


def _aa_apply_int(x, output_size, align_corners, scales_h, scales_w):
    """uint8 images: both passes in float32, rounded half up and saturated once. CPU's fixed-point
    kernel rounds after each pass; this stays within 1 of it (and of CPU's float path rounded),
    which is what PyTorch's own consistency test asks (float weights cast to uint8 made every
    pixel 0)."""
    info = jnp.iinfo(x.dtype)
    y = _aa_apply(x.astype(jnp.float32), output_size, align_corners, scales_h, scales_w)
    return jnp.clip(jnp.floor(y + 0.5), info.min, info.max).astype(x.dtype)


@lower("_upsample_bilinear2d_aa")
def _upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    if jnp.issubdtype(self.dtype, jnp.integer):
        return _aa_apply_int(self, output_size, align_corners, scales_h, scales_w)
    return _aa_apply(_up(self), output_size, align_corners, scales_h, scales_w).astype(self.dtype)


@lower("_upsample_bilinear2d_aa_backward")
def _upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    g = _up(grad_output)
    zero = jnp.zeros(tuple(int(s) for s in input_size), g.dtype)
    _, vjp = jax.vjp(lambda x: _aa_apply(x, output_size, align_corners, scales_h, scales_w), zero)
    return vjp(g)[0].astype(grad_output.dtype)


# --- embedding_bag ------------------------------------------------------------------------


def _bags(offsets, n_idx, include_last_offset):
    off = offsets[:-1] if include_last_offset else offsets
    nb = off.shape[0]
    pos = jnp.arange(n_idx, dtype=offsets.dtype)
    bag = jnp.searchsorted(off, pos, side="right") - 1
    return off, nb, jnp.clip(bag, 0, max(nb - 1, 0))


def _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    from . import checks

    n = indices.shape[0]
    d = weight.shape[1]
    nw = weight.shape[0]
    bad = (indices < 0) | (indices >= nw)
    checks.report(bad, jnp.argmax(bad.reshape(-1)) if n else 0, checks.first(bad, indices),
                  message=lambda i, v: f"Index {i} of input takes value {v} which is not in the valid range [0, {nw})")
    if offsets.shape[0]:  # CPU's checks of the bag boundaries
        checks.report(offsets[0] != 0, offsets[0], message=lambda v, _: (
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
            f"However, got {v}"))
        checks.report(offsets[-1] > n, offsets[-1], message=lambda v, _: (
            f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {v}"))
    _, nb, bag = _bags(offsets, n, include_last_offset)
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), bool)
    if include_last_offset:
        keep = keep & (jnp.arange(n) < offsets[-1])
    w = _up(weight)
    rows = w[indices]
    counts = jax.ops.segment_sum(keep.astype(jnp.int64), bag, nb)
    if mode == 2:
        vals = jnp.where(keep[:, None], rows, -jnp.inf)
        mx = jax.ops.segment_max(vals, bag, nb)
        # first position reaching the max, per (bag, column)
        hit = keep[:, None] & (rows == mx[bag])
        first = jax.ops.segment_min(jnp.where(hit, jnp.arange(n)[:, None], n), bag, nb)
        max_idx = jnp.where(counts[:, None] > 0, indices[jnp.clip(first, 0, max(n - 1, 0))], 0) if n else \
            jnp.zeros((nb, d), jnp.int64)
        out = jnp.where(counts[:, None] > 0, mx, 0.0)
        return out.astype(weight.dtype), bag, counts, max_idx.astype(jnp.int64)
    if per_sample_weights is not None:
        rows = rows * _up(per_sample_weights)[:, None]
    rows = jnp.where(keep[:, None], rows, 0.0)
    out = jax.ops.segment_sum(rows, bag, nb)
    if mode == 1:
        out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
        size = counts
    else:
        size = jnp.zeros((nb,), jnp.int64)
    return out.astype(weight.dtype), bag, size, jnp.zeros((nb,), jnp.int64)


@lower("_embedding_bag", "_embedding_bag_forward_only")
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)


def _embedding_bag_grad(grad, indices, bag, maximum_indices, num_weights, scale_grad_by_freq, mode,
                        per_sample_weights, padding_idx, offsets=None, include_last_offset=False):
    n = indices.shape[0]
    g = _up(grad)
    nb, d = g.shape
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), bool)
    if offsets is not None and include_last_offset:
        keep = keep & (jnp.arange(n) < offsets[-1])
    out = jnp.zeros((int(num_weights), d), g.dtype)
    if mode == 2:
        counts = jax.ops.segment_sum(keep.astype(jnp.int64), bag, nb) if n else jnp.zeros((nb,), jnp.int64)
        contrib = jnp.where(counts[:, None] > 0, g, 0.0)
        return out.at[maximum_indices, jnp.arange(d)[None, :]].add(contrib, mode="drop")
    rows = g[bag]
    if mode == 1:
        counts = jax.ops.segment_sum(keep.astype(jnp.int64), bag, nb)
        rows = rows / jnp.maximum(counts, 1)[bag][:, None].astype(g.dtype)
    if per_sample_weights is not None:
        rows = rows * _up(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        freq = jnp.zeros((int(num_weights),), g.dtype).at[indices].add(1.0)
        rows = rows / freq[indices][:, None]
    rows = jnp.where(keep[:, None], rows, 0.0)
    return out.at[indices].add(rows)


@lower("_embedding_bag_backward")
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotImplementedError("_embedding_bag_backward: sparse gradients are not supported on tpu")
    nb = grad.shape[0]
    include_last = offsets.shape[0] == nb + 1
    _, _, bag = _bags(offsets, indices.shape[0], include_last)
    out = _embedding_bag_grad(grad, indices, bag, maximum_indices, num_weights, scale_grad_by_freq, mode,
                              per_sample_weights, padding_idx, offsets, include_last)
    return out.astype(grad.dtype)


@lower("_embedding_bag_dense_backward")
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                  scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    out = _embedding_bag_grad(grad, indices, offset2bag, maximum_indices, num_weights, scale_grad_by_freq,
                              mode, per_sample_weights, padding_idx)
    return out.astype(grad.dtype)


@lower("_embedding_bag_per_sample_weights_backward")
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    n = indices.shape[0]
    nb = grad.shape[0]
    include_last = offsets.shape[0] == nb + 1
    _, _, bag = _bags(offsets, n, include_last)
    g = _up(grad)
    val = jnp.sum(g[bag] * _up(weight)[indices], axis=1)
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), bool)
    return jnp.where(keep, val, 0.0).astype(grad.dtype)


# --- segment_reduce -------------------------------------------------------------------------


def _segments(data, lengths, offsets, axis):
    """Move `axis` last; return (data (..., L), seg ids (..., L), lengths (..., S))."""
    if offsets is not None:
        lengths = offsets[..., 1:] - offsets[..., :-1]
    x = jnp.moveaxis(data, axis, -1)
    nlead = lengths.ndim - 1  # lengths' batch dims match data's leading dims
    ends = jnp.cumsum(lengths, axis=-1)
    pos = jnp.arange(x.shape[-1], dtype=lengths.dtype)
    seg = jax.vmap(lambda e: jnp.searchsorted(e, pos, side="right"))(ends.reshape(-1, ends.shape[-1]))
    seg = seg.reshape(lengths.shape[:-1] + (x.shape[-1],))
    # broadcast seg over the data dims between the batch dims and the axis
    mid = x.ndim - 1 - nlead
    seg = seg.reshape(seg.shape[:-1] + (1,) * mid + seg.shape[-1:])
    seg = jnp.broadcast_to(seg, x.shape)
    lens = lengths.reshape(lengths.shape[:-1] + (1,) * mid + lengths.shape[-1:])
    return x, seg, lens


def _seg_apply(x, seg, nseg, op):
    """Segment-reduce the last axis of x with per-row segment ids."""
    lead = x.shape[:-1]
    xf = x.reshape(-1, x.shape[-1])
    sf = seg.reshape(-1, seg.shape[-1])
    out = jax.vmap(lambda v, s: op(v, s, num_segments=nseg))(xf, sf)
    return out.reshape(lead + (nseg,))


def _segment_reduce_impl(data, reduce, lengths, offsets, axis, initial):
    axis = axis % data.ndim
    x, seg, lens = _segments(_up(data), lengths, offsets, axis)
    nseg = lens.shape[-1]
    dt = x.dtype
    lens = jnp.broadcast_to(lens, x.shape[:-1] + (nseg,))
    empty = lens == 0
    if reduce in ("sum", "mean"):
        out = _seg_apply(x, seg, nseg, jax.ops.segment_sum)
        if initial is not None:
            out = out + initial
        if reduce == "mean":
            out = out / lens.astype(dt)
            if initial is not None:
                out = jnp.where(empty, jnp.asarray(initial, dt), out)
    elif reduce == "prod":
        out = _seg_apply(x, seg, nseg, jax.ops.segment_prod)
        if initial is not None:
            out = out * initial
    elif reduce in ("max", "min"):
        op = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        out = _seg_apply(x, seg, nseg, op)
        nan = _seg_apply(jnp.isnan(x).astype(jnp.int32), seg, nseg, jax.ops.segment_max) > 0
        out = jnp.where(nan, jnp.nan, out)
        if initial is not None:
            f = jnp.maximum if reduce == "max" else jnp.minimum
            out = f(out, jnp.asarray(initial, dt))
    else:
        raise RuntimeError(f"segment_reduce: unsupported reduction {reduce!r}")
    return jnp.moveaxis(out, -1, axis).astype(data.dtype)


@lower("segment_reduce")
def segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    return _segment_reduce_impl(data, reduce, lengths, offsets, axis, initial)


@lower("_segment_reduce_backward")
def _segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    axis = axis % data.ndim
    x, seg, lens = _segments(_up(data), lengths, offsets, axis)
    nseg = lens.shape[-1]
    g = jnp.moveaxis(_up(grad), axis, -1)
    out = jnp.moveaxis(_up(output), axis, -1)
    take = lambda v: jnp.take_along_axis(v, jnp.clip(seg, 0, max(nseg - 1, 0)), axis=-1)
    gs = take(g)
    if reduce == "sum":
        res = gs
    elif reduce == "mean":
        lb = jnp.broadcast_to(lens, g.shape).astype(g.dtype)
        res = gs / take(lb)
    elif reduce in ("max", "min"):
        hit = (x == take(out)) | (jnp.isnan(x) & jnp.isnan(take(out)))
        cnt = _seg_apply(hit.astype(g.dtype), seg, nseg, jax.ops.segment_sum)
        res = jnp.where(hit, gs / take(jnp.maximum(cnt, 1)), 0.0)
    elif reduce == "prod":
        zero = x == 0
        nz = _seg_apply(zero.astype(jnp.int32), seg, nseg, jax.ops.segment_sum)
        pnz = _seg_apply(jnp.where(zero, 1.0, x).astype(g.dtype), seg, nseg, jax.ops.segment_prod)
        if initial is not None:
            pnz = pnz * initial
        nz_e, pnz_e = take(nz), take(pnz)
        res = jnp.where(zero, jnp.where(nz_e == 1, pnz_e, 0.0), take(out) / jnp.where(zero, 1.0, x))
        res = res * gs
    else:
        raise RuntimeError(f"_segment_reduce_backward: unsupported reduction {reduce!r}")
    res = jnp.where(seg < nseg, res, 0.0)
    return jnp.moveaxis(res, -1, axis).astype(data.dtype)


# --- fractional max pooling ----------------------------------------------------------------


def _frac_starts(sample, in_size, out_size, pool, rnd):
    """PyTorch's generate_intervals: window starts (..., out_size) from samples (...). CPU
    computes in the input's dtype, so a bfloat16 or half sum and product round each time
    (`rnd`); the sample arrives widened."""
    if out_size == 1:
        return jnp.full(sample.shape + (1,), in_size - pool, jnp.int32)
    alpha = rnd(jnp.asarray(in_size - pool, sample.dtype) / jnp.asarray(out_size - 1, sample.dtype))
    i = jnp.arange(out_size - 1, dtype=sample.dtype)
    s = sample[..., None]
    starts = (jnp.trunc(rnd(rnd(i + s) * alpha)).astype(jnp.int32)
              - jnp.trunc(rnd(s * alpha)).astype(jnp.int32))
    last = jnp.full(sample.shape + (1,), in_size - pool, jnp.int32)
    return jnp.concatenate([starts, last], axis=-1)


def _rounder(dtype):
    """Rounds a widened value to `dtype`'s precision, for arithmetic CPU does in a narrow
    float dtype (an explicit reduce_precision: XLA may drop a convert pair)."""
    info = {jnp.dtype(jnp.bfloat16): (8, 7), jnp.dtype(jnp.float16): (5, 10)}.get(jnp.dtype(dtype))
    if info is None:
        return lambda v: v
    return lambda v: jax.lax.reduce_precision(v, exponent_bits=info[0], mantissa_bits=info[1])


def _fractional_max_pool(self, kernel_size, output_size, random_samples, nsp):
    batched = self.ndim == nsp + 2
    x = self if batched else self[None]
    n, c = x.shape[:2]
    rs = random_samples[:n]  # CPU reads the first N rows of samples (N = 1 for an unbatched input)
    sizes = x.shape[2:]
    samples = _up(rs).astype(_opmath(x.dtype))
    # 2-d: samples[..., 0] drives W and [..., 1] H; 3-d: [..., 0] T, [..., 1] H, [..., 2] W
    order = [1, 0] if nsp == 2 else [0, 1, 2]
    rnd = _rounder(x.dtype)
    starts = [
        _frac_starts(samples[..., order[d]], sizes[d], int(output_size[d]), int(kernel_size[d]), rnd)
        for d in range(nsp)
    ]
    # full index per spatial dim: (N, C, out_d, k_d)
    pos = [st[..., None] + jnp.arange(int(kernel_size[d]), dtype=jnp.int32) for d, st in enumerate(starts)]
    # combine into flat indices (N, C, o1, k1, o2, k2, ...)
    flat = None
    for d in range(nsp):
        shape = [n, c] + [1] * (2 * nsp)
        shape[2 + 2 * d] = int(output_size[d])
        shape[3 + 2 * d] = int(kernel_size[d])
        p = pos[d].reshape(shape)
        flat = p if flat is None else flat * sizes[d] + p
    full = (n, c) + tuple(v for d in range(nsp) for v in (int(output_size[d]), int(kernel_size[d])))
    flat = jnp.broadcast_to(flat, full)
    perm = [0, 1] + [2 + 2 * d for d in range(nsp)] + [3 + 2 * d for d in range(nsp)]
    flat = flat.transpose(perm).reshape((n, c) + tuple(int(o) for o in output_size) + (-1,))
    vals = jnp.take_along_axis(x.reshape(n, c, -1), flat.reshape(n, c, -1), axis=2).reshape(flat.shape)
    arg = jnp.argmax(vals, axis=-1)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    ind = jnp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0].astype(jnp.int64)
    if not batched:
        out, ind = out[0], ind[0]
    return out, ind


@lower("fractional_max_pool2d")
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 2)


@lower("fractional_max_pool3d")
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 3)


def _scatter_pool_grad(grad_output, self, indices, nsp):
    planes = self.shape[: self.ndim - nsp]
    np_ = int(np.prod(planes)) if planes else 1
    g = _up(grad_output).reshape(np_, -1)
    ind = indices.reshape(np_, -1)
    out = jnp.zeros((np_, int(np.prod(self.shape[self.ndim - nsp:]))), g.dtype)
    out = out.at[jnp.arange(np_)[:, None], ind].add(g, mode="drop")
    return out.reshape(self.shape).astype(self.dtype)


@lower("fractional_max_pool2d_backward")
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_pool_grad(grad_output, self, indices, 2)


@lower("fractional_max_pool3d_backward")
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_pool_grad(grad_output, self, indices, 3)


# --- CTC loss ---------------------------------------------------------------------------------


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    t_max, b, _ = log_probs.shape
    tl = [int(v) for v in target_lengths]
    lmax = max(tl) if tl else 0
    s = 2 * lmax + 1
    if targets.ndim == 1:  # concatenated targets
        starts = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64) if tl else np.zeros((0,), np.int64)
        pos = starts[:, None] + np.minimum(np.arange(max(lmax, 1))[None, :], np.maximum(np.array(tl)[:, None] - 1, 0))
        tg = targets[jnp.asarray(pos)] if targets.shape[0] else jnp.zeros(pos.shape, targets.dtype)
    else:
        tg = targets[:, :max(lmax, 1)] if targets.shape[1] else jnp.zeros((b, 1), targets.dtype)
    tg = tg[:, :max(lmax, 1)].astype(jnp.int32)
    sidx = np.arange(s)
    ext = jnp.where(jnp.asarray(sidx % 2 == 0)[None, :], blank, tg[:, np.minimum((sidx - 1) // 2, max(lmax - 1, 0))])
    tlj = jnp.asarray(np.array(tl, np.int32)).reshape(b)
    valid_s = jnp.asarray(sidx)[None, :] < (2 * tlj[:, None] + 1)
    # skip transition s-2 -> s allowed when ext[s] != blank and ext[s] != ext[s-2]
    prev2 = jnp.concatenate([jnp.full((b, 2), -1, jnp.int32), ext[:, :-2].astype(jnp.int32)], axis=1)
    skip = (ext != blank) & (ext != prev2)
    il = jnp.asarray(np.array([int(v) for v in input_lengths], np.int32)).reshape(b)
    return ext.astype(jnp.int32), valid_s, skip, il, tlj, s


def _lse3(a, b, c):
    m = jnp.maximum(jnp.maximum(a, b), c)
    m0 = jnp.where(jnp.isinf(m), 0.0, m)
    return jnp.log(jnp.exp(a - m0) + jnp.exp(b - m0) + jnp.exp(c - m0)) + m0


def _ctc_alpha(lp, ext, valid_s, skip, il, tl):
    """lp (T, B, C) -> log_alpha (B, T, S), nll (B,)."""
    t_max, b, _ = lp.shape
    s = ext.shape[1]
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (t_max, b, s)), axis=2)  # (T, B, S)
    a0 = jnp.where((jnp.arange(s)[None, :] < 2) & valid_s, emit[0], neg)

    def step(prev, e):
        p1 = jnp.concatenate([jnp.full((b, 1), neg), prev[:, :-1]], axis=1)
        p2 = jnp.concatenate([jnp.full((b, 2), neg), prev[:, :-2]], axis=1)
        p2 = jnp.where(skip, p2, neg)
        new = jnp.where(valid_s, _lse3(prev, p1, p2) + e, neg)
        return new, new

    if t_max > 1:
        _, rest = lax.scan(step, a0, emit[1:])
        alpha = jnp.concatenate([a0[None], rest], axis=0)  # (T, B, S)
    else:
        alpha = a0[None]
    last = alpha[jnp.clip(il - 1, 0, t_max - 1), jnp.arange(b)]  # (B, S)
    end1 = jnp.take_along_axis(last, (2 * tl)[:, None], axis=1)[:, 0]
    end2 = jnp.take_along_axis(last, jnp.maximum(2 * tl - 1, 0)[:, None], axis=1)[:, 0]
    end2 = jnp.where(tl > 0, end2, neg)
    m = jnp.maximum(end1, end2)
    m0 = jnp.where(jnp.isinf(m), 0.0, m)
    nll = -(jnp.log(jnp.exp(end1 - m0) + jnp.exp(end2 - m0)) + m0)
    return jnp.transpose(alpha, (1, 0, 2)), nll


def _ctc_loss_impl(log_probs, targets, input_lengths, target_lengths, blank):
    lp = _up(log_probs)
    ext, valid_s, skip, il, tl, _ = _ctc_setup(lp, targets, input_lengths, target_lengths, blank)
    alpha, nll = _ctc_alpha(lp, ext, valid_s, skip, il, tl)
    return nll.astype(log_probs.dtype), alpha.astype(log_probs.dtype)


@lower("_ctc_loss")
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc_loss_impl(log_probs, targets, input_lengths, target_lengths, blank)


@lower("_ctc_loss_backward")
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    lp = _up(log_probs)
    t_max, b, c = lp.shape
    ext, valid_s, skip, il, tl, s = _ctc_setup(lp, targets, input_lengths, target_lengths, blank)
    alpha, nll = _ctc_alpha(lp, ext, valid_s, skip, il, tl)  # alpha (B, T, S)
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (t_max, b, s)), axis=2)  # (T, B, S)
    send = jnp.arange(s)[None, :]
    is_end = ((send == 2 * tl[:, None]) | ((send == 2 * tl[:, None] - 1) & (tl[:, None] > 0))) & valid_s
    # skip into s+2 from s allowed when ext[s+2] != ext[s] and ext[s+2] != blank (= skip[s+2])
    skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((b, 2), bool)], axis=1)
    tt = jnp.arange(t_max)

    def step(nxt, inp):
        t, e = inp
        n1 = jnp.concatenate([nxt[:, 1:], jnp.full((b, 1), neg)], axis=1)
        n2 = jnp.concatenate([nxt[:, 2:], jnp.full((b, 2), neg)], axis=1)
        n2 = jnp.where(skip_next, n2, neg)
        rec = _lse3(nxt, n1, n2) + e
        init = jnp.where(is_end, e, neg)
        new = jnp.where((t == il - 1)[:, None], init, jnp.where((t < il - 1)[:, None], rec, neg))
        new = jnp.where(valid_s, new, neg)
        return new, new

    _, beta = lax.scan(step, jnp.full((b, s), neg), (tt, emit), reverse=True)  # (T, B, S)
    ab = jnp.transpose(alpha, (1, 0, 2)) + beta  # (T, B, S)
    # log-sum-exp of alpha+beta per (t, b, class): scatter-max then scatter-add
    bi = jnp.arange(b)[None, :, None]
    ti = tt[:, None, None]
    ci = jnp.broadcast_to(ext[None], ab.shape)
    mx = jnp.full((t_max, b, c), neg).at[ti, bi, ci].max(ab)
    mx0 = jnp.where(jnp.isinf(mx), 0.0, mx)
    ssum = jnp.zeros((t_max, b, c), lp.dtype).at[ti, bi, ci].add(jnp.exp(ab - mx0[ti, bi, ci]))
    lcab = jnp.log(ssum) + mx0
    nll_in = _up(neg_log_likelihood)
    g = _up(grad)
    res = (jnp.exp(lp) - jnp.exp(lcab + nll_in[None, :, None] - lp)) * g[None, :, None]
    res = jnp.where((tt[:, None] < il[None, :])[:, :, None], res, 0.0)
    if zero_infinity:
        res = jnp.where(jnp.isinf(nll_in)[None, :, None], 0.0, res)
    return res.astype(log_probs.dtype)


# --- rrelu_with_noise (random; writes `noise` in place when training) -----------------------


def _rrelu_values(self, lower, upper, training, generator=None):
    import torch

    if not training:
        slope = (float(lower) + float(upper)) / 2
        return torch.nn.functional.leaky_relu(self, slope), None
    # functional (no in-place draw), so torch.compile decomposes rrelu to this function too
    r = torch.ops.aten.uniform(torch.empty_like(self), float(lower), float(upper), generator=generator)
    noise = torch.where(self <= 0, r, torch.ones_like(r))
    return self * noise, noise


@kernel("rrelu_with_noise")
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, nz = _rrelu_values(self, lower, upper, training, generator)
    if nz is not None:
        noise.copy_(nz)
    return out


@kernel("rrelu_with_noise_")
def rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, nz = _rrelu_values(self, lower, upper, training, generator)
    if nz is not None:
        noise.copy_(nz)
    return self.copy_(out)


@kernel("rrelu_with_noise_functional")
def rrelu_with_noise_functional(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, nz = _rrelu_values(self, lower, upper, training, generator)
    return out, (noise.clone() if nz is None else nz)


@kernel("_ctc_loss.Tensor")
def _ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    import torch

    return torch.ops.aten._ctc_loss.default(
        log_probs, targets, input_lengths.cpu().tolist(), target_lengths.cpu().tolist(), blank, zero_infinity
    )


@kernel("_ctc_loss_backward.Tensor")
def _ctc_loss_backward_tensor(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood,
                              log_alpha, blank, zero_infinity=False):
    import torch

    return torch.ops.aten._ctc_loss_backward.default(
        grad, log_probs, targets, input_lengths.cpu().tolist(), target_lengths.cpu().tolist(),
        neg_log_likelihood, log_alpha, blank, zero_infinity,
    )


# --- weight norm -----------------------------------------------------------------


def _norm_except(v, dim):
    """||v|| over every dim but `dim`, kept as size-1 dims (the shape of g)."""
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    return jnp.sqrt(jnp.sum(jnp.square(v), axis=axes, keepdims=True))


@lower("_weight_norm_interface")
def _weight_norm_interface(v, g, dim=0):
    acc = _opmath(v.dtype)
    norm = _norm_except(v.astype(acc), dim)
    w = v.astype(acc) * (g.astype(acc) / norm)
    return w.astype(v.dtype), norm.astype(acc)


@lower("_weight_norm_interface_backward")
def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    acc = saved_norms.dtype
    v, g, n, gw = (x.astype(acc) for x in (saved_v, saved_g, saved_norms, grad_w))
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    dot = jnp.sum(gw * v, axis=axes, keepdims=True)
    grad_g = dot / n
    grad_v = (g / n) * (gw - v * (dot / (n * n)))
    return grad_v.astype(saved_v.dtype), grad_g.astype(saved_g.dtype)


# --- fused RNN cells ------------------------------------------------------------------------
# nn.LSTM / nn.GRU (aten::lstm / gru, CompositeImplicit) use these fused cells on every device but
# CPU (RNN.cpp: input.is_privateuseone()); they have no CPU kernel, so a CPU fallback cannot serve
# them. Gate order as PyTorch's: LSTM (input, forget, cell, output), GRU (reset, update, new).
# The workspace is ours (only our backward reads it): LSTM the four activated gates (N, 4H); GRU
# r, z, n, hx and the hidden new-gate pre-activation (N, 5H), as CUDA keeps them.


@lower("_thnn_fused_lstm_cell")
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    dt = cx.dtype
    gates = _up(input_gates) + _up(hidden_gates)
    if input_bias is not None:
        gates = gates + _up(input_bias)
    if hidden_bias is not None:
        gates = gates + _up(hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _up(cx) + i * g
    hy = o * jnp.tanh(cy)
    workspace = jnp.concatenate([i, f, g, o], axis=-1)
    return hy.astype(dt), cy.astype(dt), workspace.astype(dt)


@lower("_thnn_fused_lstm_cell_backward_impl")
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    dt = cx.dtype
    ws = _up(workspace)
    i, f, g, o = jnp.split(ws, 4, axis=-1)
    cx, cy = _up(cx), _up(cy)
    gh = jnp.zeros_like(cy) if grad_hy is None else _up(grad_hy)
    gc = jnp.zeros_like(cy) if grad_cy is None else _up(grad_cy)
    tcy = jnp.tanh(cy)
    gcx = gh * o * (1 - tcy * tcy) + gc
    gi = gcx * g * i * (1 - i)
    gf = gcx * cx * f * (1 - f)
    gg = gcx * i * (1 - g * g)
    go = gh * tcy * o * (1 - o)
    grad_gates = jnp.concatenate([gi, gf, gg, go], axis=-1)
    grad_bias = grad_gates.sum(0) if has_bias else jnp.zeros(grad_gates.shape[-1:], grad_gates.dtype)
    return grad_gates.astype(dt), (gcx * f).astype(dt), grad_bias.astype(dt)


@lower("_thnn_fused_gru_cell")
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    dt = hx.dtype
    ig, hg = _up(input_gates), _up(hidden_gates)
    if input_bias is not None:
        ig = ig + _up(input_bias)
    if hidden_bias is not None:
        hg = hg + _up(hidden_bias)
    ir, iz, in_ = jnp.split(ig, 3, axis=-1)
    hr, hz, hn = jnp.split(hg, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    h = _up(hx)
    hy = n + z * (h - n)
    workspace = jnp.concatenate([r, z, n, h, hn], axis=-1)
    return hy.astype(dt), workspace.astype(dt)


@lower("_thnn_fused_gru_cell_backward")
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dt = workspace.dtype
    r, z, n, h, hn = jnp.split(_up(workspace), 5, axis=-1)
    gh = _up(grad_hy)
    gz = gh * (h - n) * z * (1 - z)
    gn = gh * (1 - z) * (1 - n * n)
    gr = gn * hn * r * (1 - r)
    grad_input = jnp.concatenate([gr, gz, gn], axis=-1)
    grad_hidden = jnp.concatenate([gr, gz, gn * r], axis=-1)
    zeros = jnp.zeros(grad_input.shape[-1:], grad_input.dtype)
    bi = grad_input.sum(0) if has_bias else zeros
    bh = grad_hidden.sum(0) if has_bias else zeros
    return (grad_input.astype(dt), grad_hidden.astype(dt), (gh * z).astype(dt), bi.astype(dt),
            bh.astype(dt))
