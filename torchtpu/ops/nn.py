"""Convolution, pooling and normalization layers with their backward ops.

Conventions used here:
* half/bfloat16 inputs are computed in float32 (PyTorch's opmath) and cast back.
* Backward ops that take an `output_mask` return a zero-size placeholder for an
  output that was not asked for; `_masked` declares it (Lowering.output_mask) and the
  eager kernel turns it into None, as PyTorch returns an undefined tensor there.
* The batch-norm overloads that update running_mean/var in place (outside their schema)
  are kernels in eager/composites/batch_norm.py around the functional lowering here.
* Window geometry (kernel sizes, strides, output sizes) is static, so gathers use
  constant index tables built with numpy at trace time.
* `eps`/`momentum` of the normalization ops are runtime scalars (see `_dynamic`),
  so a changing momentum (BatchNorm with momentum=None) never recompiles.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._common import opmath_dtype as _opmath
from .registry import LOWERINGS, lower

_HI = None  # float32 matmul precision: torch's setting, through runtime/precision.py


# --- helpers ----------------------------------------------------------------


def _up(x):
    return None if x is None else x.astype(_opmath(x.dtype))


def _tup(v, n, name="argument"):
    if v is None:
        return None
    v = [int(a) for a in (v if isinstance(v, (list, tuple)) else [v])]
    if len(v) == 1 and n > 1:
        v = v * n
    if len(v) != n:
        raise RuntimeError(f"expected {name} to have {n} elements, got {len(v)}")
    return tuple(v)


def _empty(dt):
    """Placeholder for an output not asked for (see _masked)."""
    return jnp.zeros((0,), dt)


def _dynamic(names, *args):
    """Turn `float` arguments of our own lowerings into runtime scalars (no recompiles)."""
    for name in names:
        low = LOWERINGS[name]
        for a in low.args:
            if a.name in args:
                a.kind = "scalar"


def _masked(name, mask_arg):
    """`name` returns a placeholder (_empty) for each output `mask_arg` masks off: the eager
    kernel returns None there. Its out= twin is not served (it stays on the CPU fallback)."""
    low = LOWERINGS[name]
    low.output_mask = mask_arg
    low.variants = False


def _bcast_c(v, ndim):
    """A per-channel (C,) vector shaped to broadcast against (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


# --- convolution --------------------------------------------------------------


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    nsp = x.ndim - 2
    stride = _tup(stride, nsp, "stride")
    padding = _tup(padding, nsp, "padding")
    dilation = _tup(dilation, nsp, "dilation")
    sp = "DHW"[3 - nsp:] if nsp <= 3 else None
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NC" + sp, "OI" + sp, "NC" + sp))
    if not transposed:
        return lax.conv_general_dilated(
            x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=dn, feature_group_count=groups, precision=_HI,
            preferred_element_type=_opmath(x.dtype),
        )
    output_padding = _tup(output_padding, nsp, "output_padding")
    cin, coutg, ks = w.shape[0], w.shape[1], w.shape[2:]
    w2 = w.reshape((groups, cin // groups, coutg) + ks)
    w2 = jnp.swapaxes(w2, 1, 2).reshape((groups * coutg, cin // groups) + ks)
    w2 = jnp.flip(w2, axis=tuple(range(2, 2 + nsp)))
    dn = lax.conv_dimension_numbers(x.shape, w2.shape, ("NC" + sp, "OI" + sp, "NC" + sp))
    pads, crops = [], []
    for k, d, p, op in zip(ks, dilation, padding, output_padding):
        lo = d * (k - 1) - p
        hi = lo + op
        pads.append((max(lo, 0), max(hi, 0)))
        crops.append((max(-lo, 0), max(-hi, 0)))
    y = lax.conv_general_dilated(
        x, w2, (1,) * nsp, pads, lhs_dilation=stride, rhs_dilation=dilation,
        dimension_numbers=dn, feature_group_count=groups, precision=_HI,
        preferred_element_type=_opmath(x.dtype),
    )
    if any(c != (0, 0) for c in crops):
        y = y[(slice(None), slice(None)) + tuple(slice(a, y.shape[2 + i] - b) for i, (a, b) in enumerate(crops))]
    return y


@lower("convolution", "convolution_overrideable")
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    # CPU's checks (ConvUtils check_shape_forward) that meta kernels skip; JAX would take a
    # negative padding as cropping
    for bad, msg in ((any(p < 0 for p in padding), "negative padding is not supported"),
                     (any(p < 0 for p in output_padding), "negative output_padding is not supported"),
                     (any(s <= 0 for s in stride), "non-positive stride is not supported"),
                     (any(d <= 0 for d in dilation), "dilation should be greater than zero")):
        if bad:
            raise RuntimeError(msg)
    dt = input.dtype
    unbatched = False
    if input.ndim == weight.ndim - 1:  # unbatched input
        input, unbatched = input[None], True
    y = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        y = y + _bcast_c(_up(bias), y.ndim)
    y = y.astype(dt)
    return y[0] if unbatched else y


def _conv_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                   output_padding, groups, output_mask):
    dt, wdt = input.dtype, weight.dtype

    def f(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    g = _up(grad_output)
    gi = gw = gb = None
    if output_mask[0] or output_mask[1]:
        # half/bfloat16 stay in their dtype (MXU-friendly) and accumulate in float32
        _, vjp = jax.vjp(f, input, weight)
        gi, gw = vjp(g)
    if output_mask[2]:
        gb = jnp.sum(g, axis=(0,) + tuple(range(2, g.ndim))).astype(grad_output.dtype)
    return (
        gi.astype(dt) if output_mask[0] else _empty(dt),
        gw.astype(wdt) if output_mask[1] else _empty(wdt),
        gb if output_mask[2] else _empty(grad_output.dtype),
    )


@lower("convolution_backward")
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    return _conv_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask)


@lower("convolution_backward_overrideable")
def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups, output_mask):
    return _conv_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask)


_masked("convolution_backward", "output_mask")
_masked("convolution_backward_overrideable", "output_mask")


# --- max pooling ----------------------------------------------------------------------


def _pool_out(size, k, s, p, d, ceil):
    num = size + 2 * p - d * (k - 1) - 1
    out = (num + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return max(out, 0)


def _adaptive_ranges(size, out):
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    return starts, ends


def _adaptive_table(size, out):
    starts, ends = _adaptive_ranges(size, out)
    k = max([e - s for s, e in zip(starts, ends)] + [1])
    pos = np.array(starts)[:, None] + np.arange(k)[None, :]
    pos = np.minimum(pos, np.array(ends)[:, None] - 1)
    return np.clip(pos, 0, max(size - 1, 0)).reshape(out, k)


def _gather_max(x, tables):
    """Max over windows given per-dim position tables (adaptive pooling: windows differ in
    size, short ones repeat their last element); returns (values, flat plane indices)."""
    nsp = len(tables)
    lead = x.shape[:-nsp]
    sizes = x.shape[-nsp:]
    outs = [t.shape[0] for t in tables]
    ks = [t.shape[1] for t in tables]
    if x.size == 0 or math.prod(outs) == 0:
        shape = lead + tuple(outs)
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    g = x
    for i, t in enumerate(tables):
        g = jnp.take(g, jnp.asarray(t.reshape(-1)), axis=len(lead) + i)
    # (..., o1*k1, o2*k2, ...) -> (..., o1, o2, ..., k1*k2*...)
    g = g.reshape(lead + tuple(itertools.chain.from_iterable(zip(outs, ks))))
    nl = len(lead)
    perm = tuple(range(nl)) + tuple(nl + 2 * i for i in range(nsp)) + tuple(nl + 2 * i + 1 for i in range(nsp))
    g = g.transpose(perm).reshape(lead + tuple(outs) + (math.prod(ks),))
    am = jnp.argmax(g, axis=-1)
    vals = jnp.take_along_axis(g, am[..., None], axis=-1)[..., 0]
    # flat plane index of each (window, element)
    strides = [math.prod(sizes[i + 1:]) for i in range(nsp)]
    flat = np.zeros(tuple(outs) + tuple(ks), np.int64)
    for i, t in enumerate(tables):
        shp = [1] * (2 * nsp)
        shp[i], shp[nsp + i] = outs[i], ks[i]
        flat = flat + (t * strides[i]).reshape(shp)
    flat = jnp.asarray(flat.reshape(tuple(outs) + (math.prod(ks),)))
    idx = jnp.take_along_axis(jnp.broadcast_to(flat, g.shape), am[..., None], axis=-1)[..., 0]
    return vals, idx.astype(jnp.int64)


def _pad_min(dt):
    dt = jnp.dtype(dt)
    if jnp.issubdtype(dt, jnp.floating):
        return np.array(-np.inf, dt)
    if dt == jnp.bool_:
        return np.array(False)
    return np.array(jnp.iinfo(dt).min, dt)


def _max_pool(self, nsp, kernel_size, stride, padding, dilation, ceil_mode):
    """Max pool as K strided slices of the padded input (no gathers), argmax over K.

    A padding element can only win when the window's max is the pad value itself;
    then the first element wins, and its position clamps to the first valid one,
    which is the index PyTorch reports."""
    kernel_size = _tup(kernel_size, nsp, "kernel_size")
    stride = _tup(stride, nsp, "stride") if stride else kernel_size
    padding = _tup(padding, nsp, "padding")
    dilation = _tup(dilation, nsp, "dilation")
    sizes = self.shape[-nsp:]
    nl = self.ndim - nsp
    lead = self.shape[:nl]
    outs = [_pool_out(*a, ceil_mode) for a in zip(sizes, kernel_size, stride, padding, dilation)]
    if self.size == 0 or math.prod(outs) == 0:
        shape = lead + tuple(outs)
        return jnp.zeros(shape, self.dtype), jnp.zeros(shape, jnp.int64)
    cfg = [(0, 0, 0)] * nl + [
        (p, (o - 1) * s + d * (k - 1) + 1 - sz - p, 0)
        for sz, o, k, s, p, d in zip(sizes, outs, kernel_size, stride, padding, dilation)
    ]
    xp = lax.pad(self, _pad_min(self.dtype), cfg)
    wins = []
    for offs in itertools.product(*[range(k) for k in kernel_size]):
        start = [0] * nl + [o * d for o, d in zip(offs, dilation)]
        limit = list(lead) + [st + (o - 1) * s + 1 for st, o, s in zip(start[nl:], outs, stride)]
        wins.append(lax.slice(xp, start, limit, (1,) * nl + stride))
    g = jnp.stack(wins, axis=-1)
    am = jnp.argmax(g, axis=-1)
    vals = jnp.max(g, axis=-1)
    flat = jnp.zeros(am.shape, jnp.int64)
    rem = am
    for i in reversed(range(nsp)):
        koff = rem % kernel_size[i]
        rem = rem // kernel_size[i]
        o = np.arange(outs[i]) * stride[i] - padding[i]
        first = o + (np.maximum(-o, 0) + dilation[i] - 1) // dilation[i] * dilation[i]
        shp = [1] * nsp
        shp[i] = outs[i]
        o = jnp.asarray(o.reshape(shp))
        first = jnp.asarray(first.reshape(shp))
        pos = jnp.maximum(o + koff * dilation[i], first)
        flat = flat + pos * math.prod(sizes[i + 1:])
    return vals, flat


def _scatter_grad(grad_output, self, indices, nsp):
    """Gradient of a max pool: grad_output added at `indices` (flat per plane)."""
    lead = self.shape[:-nsp]
    plane = math.prod(self.shape[-nsp:])
    b = math.prod(lead)
    ct = _opmath(grad_output.dtype)
    g = grad_output.astype(ct).reshape(b, -1)
    idx = indices.reshape(b, -1)
    out = jnp.zeros((b, plane), ct)
    if g.size:
        out = out.at[jnp.arange(b)[:, None], idx].add(g)
    return out.reshape(self.shape).astype(self.dtype)


@lower("max_pool2d_with_indices")
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower("max_pool3d_with_indices")
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lower("max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_grad(grad_output, self, indices, 2)


@lower("max_pool3d_with_indices_backward")
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_grad(grad_output, self, indices, 3)


def _adaptive_max(self, nsp, output_size):
    output_size = _tup(output_size, nsp, "output_size")
    sizes = self.shape[-nsp:]
    return _gather_max(self, [_adaptive_table(s, o) for s, o in zip(sizes, output_size)])


@lower("adaptive_max_pool2d")
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max(self, 2, output_size)


@lower("adaptive_max_pool3d")
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, 3, output_size)


@lower("adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_grad(grad_output, self, indices, 2)


@lower("adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_grad(grad_output, self, indices, 3)


# --- average pooling ----------------------------------------------------------


def _avg_divisor(size, out, k, s, p, count_include_pad):
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    pool = end - start
    if count_include_pad:
        return pool
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(self, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel_size = _tup(kernel_size, nsp, "kernel_size")
    stride = _tup(stride, nsp, "stride") if stride else kernel_size
    padding = _tup(padding, nsp, "padding")
    sizes = self.shape[-nsp:]
    nl = self.ndim - nsp
    outs = [_pool_out(sz, k, s, p, 1, ceil_mode) for sz, k, s, p in zip(sizes, kernel_size, stride, padding)]
    dt = self.dtype
    integral = jnp.issubdtype(dt, jnp.integer)
    ct = dt if integral else _opmath(dt)
    if self.size == 0 or math.prod(outs) == 0:
        return jnp.zeros(self.shape[:nl] + tuple(outs), dt)
    x = self.astype(ct)
    # A window never needs to reach past the data's end: every window starts at or after
    # the left pad, so one of length p + size already covers all the data it can. A kernel
    # bigger than the input (efficientnet's AvgPool2d(hidden_dim=2560, ceil_mode=True) on
    # an 8x8 map) would otherwise pad each plane to 2560x2560 zeros, which a fused program
    # materializes (GBs for a tiny model). The divisor below still uses the true kernel.
    reach = tuple(min(k, p + sz) for k, p, sz in zip(kernel_size, padding, sizes))
    cfg = [(0, 0, 0)] * nl + [
        (p, (o - 1) * s + k - sz - p, 0) for sz, o, k, s, p in zip(sizes, outs, reach, stride, padding)
    ]
    x = lax.pad(x, np.zeros((), ct), cfg)
    summed = lax.reduce_window(x, np.zeros((), ct), lax.add, (1,) * nl + reach, (1,) * nl + stride, "VALID")
    if divisor_override:
        div = np.asarray(divisor_override)
    else:
        div = np.ones(outs, np.int64)
        for i, (sz, o, k, s, p) in enumerate(zip(sizes, outs, kernel_size, stride, padding)):
            shp = [1] * nsp
            shp[i] = o
            div = div * _avg_divisor(sz, o, k, s, p, count_include_pad).reshape(shp)
    if integral:
        return lax.div(summed, jnp.asarray(div, ct) * jnp.ones_like(summed))
    return (summed / jnp.asarray(div, ct)).astype(dt)


def _avg_pool_backward(grad_output, self, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    ct = _opmath(self.dtype)

    def f(x):
        return _avg_pool(x, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    _, vjp = jax.vjp(f, self.astype(ct))
    (gi,) = vjp(grad_output.astype(ct))
    return gi.astype(self.dtype)


@lower("avg_pool2d")
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower("avg_pool3d")
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower("avg_pool2d_backward")
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad_output, self, 2, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


@lower("avg_pool3d_backward")
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad_output, self, 3, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


def _adaptive_matrices(sizes, outs):
    mats, counts = [], []
    for size, out in zip(sizes, outs):
        starts, ends = _adaptive_ranges(size, out)
        m = np.zeros((out, size), np.float64)
        for i, (s, e) in enumerate(zip(starts, ends)):
            m[i, s:e] = 1.0
        mats.append(m)
        counts.append(np.array([e - s for s, e in zip(starts, ends)], np.float64))
    return mats, counts


def _apply_dim(x, m, ax):
    return jnp.moveaxis(jnp.tensordot(x, jnp.asarray(m, x.dtype), axes=[[ax], [1]], precision=_HI), -1, ax)


def _apply_dims(x, mats, nsp):
    """Contract each of the last nsp dims of x with mats[i] (out_i, in_i)."""
    for i, m in enumerate(mats):
        x = _apply_dim(x, m, x.ndim - nsp + i)
    return x


def _div_counts(x, counts, nsp):
    c = np.ones([len(cc) for cc in counts])
    for i, cc in enumerate(counts):
        shp = [1] * nsp
        shp[i] = len(cc)
        c = c * cc.reshape(shp)
    return x / jnp.asarray(c, x.dtype)


def _adaptive_avg(self, nsp, output_size):
    outs = _tup(output_size, nsp, "output_size")
    mats, counts = _adaptive_matrices(self.shape[-nsp:], outs)
    x = _up(self)
    return _div_counts(_apply_dims(x, mats, nsp), counts, nsp).astype(self.dtype)


def _adaptive_avg_backward(grad_output, self, nsp):
    outs = grad_output.shape[-nsp:]
    mats, counts = _adaptive_matrices(self.shape[-nsp:], outs)
    g = _div_counts(_up(grad_output), counts, nsp)
    return _apply_dims(g, [m.T for m in mats], nsp).astype(self.dtype)


@lower("_adaptive_avg_pool2d")
def _adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg(self, 2, output_size)


@lower("_adaptive_avg_pool3d")
def _adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, 3, output_size)


@lower("_adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 2)


@lower("_adaptive_avg_pool3d_backward")
def _adaptive_avg_pool3d_backward(grad_output, self):
    return _adaptive_avg_backward(grad_output, self, 3)


# --- batch norm -----------------------------------------------------------------


def _bn_param_dtype(input, weight, running_mean):
    if weight is not None:
        return weight.dtype
    if running_mean is not None:
        return running_mean.dtype
    return input.dtype


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    pdt = _bn_param_dtype(input, weight, running_mean)
    x = _up(input)
    ct = x.dtype
    axes = _bn_axes(x)
    nd = x.ndim
    new_rm, new_rv = running_mean, running_var
    if training:
        mean = jnp.mean(x, axis=axes)
        xc = x - _bcast_c(mean, nd)
        var = jnp.mean(xc * xc, axis=axes)
        invstd = lax.rsqrt(var + jnp.asarray(eps, ct))
        if running_mean is not None:
            m = jnp.asarray(momentum, ct)
            new_rm = ((1 - m) * _up(running_mean) + m * mean).astype(running_mean.dtype)
        if running_var is not None:
            n = x.size // x.shape[1] if x.shape[1] else 0
            unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.inf
            m = jnp.asarray(momentum, ct)
            new_rv = ((1 - m) * _up(running_var) + m * unbiased).astype(running_var.dtype)
        save_mean, save_invstd = mean.astype(pdt), invstd.astype(pdt)
    else:
        mean = _up(running_mean).astype(ct)
        invstd = lax.rsqrt(_up(running_var).astype(ct) + jnp.asarray(eps, ct))
        xc = x - _bcast_c(mean, nd)
        save_mean, save_invstd = _empty(pdt), _empty(pdt)
    y = xc * _bcast_c(invstd, nd)
    if weight is not None:
        y = y * _bcast_c(_up(weight).astype(ct), nd)
    if bias is not None:
        y = y + _bcast_c(_up(bias).astype(ct), nd)
    return y.astype(input.dtype), save_mean, save_invstd, new_rm, new_rv


@lower("native_batch_norm")
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@lower("_native_batch_norm_legit_functional")
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum,
                                        eps):
    return _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lower("_native_batch_norm_legit.no_stats")
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _bn_forward(input, weight, bias, None, None, True, momentum, eps)[:3]


@lower("_native_batch_norm_legit_no_training")
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_forward(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lower("_batch_norm_with_update_functional")
def _batch_norm_with_update_functional(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, si, rm, rv = _bn_forward(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, sm, si, jnp.zeros((0,), jnp.uint8), rm, rv


@lower("_batch_norm_no_update")
def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None or running_var is None
    out, sm, si, _, _ = _bn_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, sm, si, jnp.zeros((0,), jnp.uint8)


_dynamic(
    ["native_batch_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit.no_stats",
     "_native_batch_norm_legit_no_training", "_batch_norm_with_update_functional", "_batch_norm_no_update"],
    "momentum", "eps",
)


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                 output_mask):
    x = _up(input)
    ct = x.dtype
    nd = x.ndim
    axes = _bn_axes(x)
    g = grad_out.astype(ct)
    wdt = _bn_param_dtype(input, weight, running_mean if running_mean is not None else save_mean)
    if train:
        mean, invstd = save_mean.astype(ct), save_invstd.astype(ct)
    else:
        mean = running_mean.astype(ct)
        invstd = lax.rsqrt(running_var.astype(ct) + jnp.asarray(eps, ct))
    xhat = (x - _bcast_c(mean, nd)) * _bcast_c(invstd, nd)
    w = _up(weight).astype(ct) if weight is not None else jnp.ones((x.shape[1],), ct)
    sum_g = jnp.sum(g, axis=axes)
    sum_gx = jnp.sum(g * xhat, axis=axes)
    gi = _empty(input.dtype)
    if output_mask[0]:
        scale = _bcast_c(w * invstd, nd)
        if train:
            n = x.size // x.shape[1] if x.shape[1] else 1
            gi = scale * (g - _bcast_c(sum_g / n, nd) - xhat * _bcast_c(sum_gx / n, nd))
        else:
            gi = g * scale
        gi = gi.astype(input.dtype)
    gw = sum_gx.astype(wdt) if output_mask[1] else _empty(wdt)
    gb = sum_g.astype(wdt) if output_mask[2] else _empty(wdt)
    return gi, gw, gb


@lower("native_batch_norm_backward")
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                        output_mask)


@lower("batch_norm_backward")
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask)


_dynamic(["native_batch_norm_backward", "batch_norm_backward"], "eps")
_masked("native_batch_norm_backward", "output_mask")
_masked("batch_norm_backward", "output_mask")


# --- layer norm / group norm / rms norm ---------------------------------------------


@lower("native_layer_norm")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    axes = tuple(range(input.ndim - k, input.ndim))
    x = _up(input)
    ct = x.dtype
    mean = jnp.mean(x, axis=axes, keepdims=True)
    xc = x - mean
    var = jnp.mean(xc * xc, axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + jnp.asarray(eps, ct))
    y = xc * rstd
    if weight is not None:
        y = y * _up(weight).astype(ct)
    if bias is not None:
        y = y + _up(bias).astype(ct)
    return y.astype(input.dtype), mean.astype(input.dtype), rstd.astype(input.dtype)


@lower("native_layer_norm_backward")
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = len(normalized_shape)
    nd = input.ndim
    axes = tuple(range(nd - k, nd))
    lead_axes = tuple(range(nd - k))
    x = _up(input)
    ct = x.dtype
    g = grad_out.astype(ct)
    mean, rstd = mean.astype(ct), rstd.astype(ct)
    xhat = (x - mean) * rstd
    gi = _empty(input.dtype)
    if output_mask[0]:
        gw = g * _up(weight).astype(ct) if weight is not None else g
        gi = rstd * (gw - jnp.mean(gw, axis=axes, keepdims=True)
                     - xhat * jnp.mean(gw * xhat, axis=axes, keepdims=True))
        gi = gi.astype(input.dtype)
    wdt = weight.dtype if weight is not None else input.dtype
    bdt = bias.dtype if bias is not None else input.dtype
    gwt = jnp.sum(g * xhat, axis=lead_axes).astype(wdt) if output_mask[1] and weight is not None else _empty(wdt)
    gbt = jnp.sum(g, axis=lead_axes).astype(bdt) if output_mask[2] and bias is not None else _empty(bdt)
    return gi, gwt, gbt


@lower("native_group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = _up(input)
    ct = x.dtype
    xg = x.reshape(N, group, (C // group) * HxW)
    mean = jnp.mean(xg, axis=-1, keepdims=True)
    xc = xg - mean
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + jnp.asarray(eps, ct))
    y = (xc * rstd).reshape(N, C, HxW)
    if weight is not None:
        y = y * _up(weight).astype(ct)[None, :, None]
    if bias is not None:
        y = y + _up(bias).astype(ct)[None, :, None]
    return (y.reshape(input.shape).astype(input.dtype), mean.reshape(N, group).astype(input.dtype),
            rstd.reshape(N, group).astype(input.dtype))


@lower("native_group_norm_backward")
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    x = _up(input)
    ct = x.dtype
    g = grad_out.astype(ct).reshape(N, C, HxW)
    xg = x.reshape(N, group, (C // group) * HxW)
    mean3, rstd3 = mean.astype(ct).reshape(N, group, 1), rstd.astype(ct).reshape(N, group, 1)
    xhat = ((xg - mean3) * rstd3).reshape(N, C, HxW)
    gi = _empty(input.dtype)
    if output_mask[0]:
        gw = g * _up(weight).astype(ct)[None, :, None] if weight is not None else g
        gwg = gw.reshape(N, group, (C // group) * HxW)
        xh = xhat.reshape(N, group, (C // group) * HxW)
        gi = rstd3 * (gwg - jnp.mean(gwg, axis=-1, keepdims=True) - xh * jnp.mean(gwg * xh, axis=-1, keepdims=True))
        gi = gi.reshape(input.shape).astype(input.dtype)
    wdt = weight.dtype if weight is not None else input.dtype
    gwt = jnp.sum(g * xhat, axis=(0, 2)).astype(wdt) if output_mask[1] else _empty(wdt)
    gbt = jnp.sum(g, axis=(0, 2)).astype(wdt) if output_mask[2] else _empty(wdt)
    return gi, gwt, gbt


@lower("_fused_rms_norm")
def _fused_rms_norm(input, normalized_shape, weight, eps):
    k = len(normalized_shape)
    axes = tuple(range(input.ndim - k, input.ndim))
    x = _up(input)
    ct = x.dtype
    if eps is None:  # ATen's default: the epsilon of the type it computes in (float for bf16)
        eps = float(jnp.finfo(ct).eps)
    rstd = lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + jnp.asarray(eps, ct))
    y = x * rstd
    if weight is not None:
        y = y * _up(weight).astype(ct)
    return y.astype(input.dtype), rstd.astype(ct)


@lower("_fused_rms_norm_backward")
def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    k = len(normalized_shape)
    nd = input.ndim
    axes = tuple(range(nd - k, nd))
    x = _up(input)
    ct = x.dtype
    g = grad_out.astype(ct)
    rstd = rstd.astype(ct)
    xhat = x * rstd
    gi = _empty(input.dtype)
    if output_mask[0]:
        gw = g * _up(weight).astype(ct) if weight is not None else g
        gi = (rstd * (gw - xhat * jnp.mean(gw * xhat, axis=axes, keepdims=True))).astype(input.dtype)
    wdt = weight.dtype if weight is not None else input.dtype
    gwt = (jnp.sum(g * xhat, axis=tuple(range(nd - k))).astype(wdt)
           if output_mask[1] and weight is not None else _empty(wdt))
    return gi, gwt


_dynamic(["native_layer_norm", "native_group_norm"], "eps")
_masked("native_layer_norm_backward", "output_mask")
_masked("native_group_norm_backward", "output_mask")
_masked("_fused_rms_norm_backward", "output_mask")


# --- upsampling -----------------------------------------------------------------------


def _scale_value(insz, outsz, scale):
    """PyTorch's compute_scales_value, in float32."""
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(insz) / np.float32(outsz)


def _nearest_index(insz, outsz, scale, exact):
    if exact:
        s = _scale_value(insz, outsz, scale)
        idx = np.floor((np.arange(outsz, dtype=np.float32) + np.float32(0.5)) * s).astype(np.int64)
        return np.minimum(idx, insz - 1)
    if outsz == insz:
        return np.arange(outsz)
    if outsz == 2 * insz:
        return np.arange(outsz) >> 1
    s = _scale_value(insz, outsz, scale)
    idx = np.floor(np.arange(outsz, dtype=np.float32) * s).astype(np.int64)
    return np.minimum(idx, insz - 1)


def _linear_matrix(insz, outsz, align_corners, scale):
    m = np.zeros((outsz, insz), np.float64)
    if align_corners:
        r = np.float32(insz - 1) / np.float32(outsz - 1) if outsz > 1 else np.float32(0)
    else:
        r = _scale_value(insz, outsz, scale)
    for o in range(outsz):
        if align_corners:
            src = np.float32(r * np.float32(o))
        else:
            src = np.float32(r * (np.float32(o) + np.float32(0.5)) - np.float32(0.5))
            src = max(src, np.float32(0))
        i0 = min(int(src), insz - 1)
        i1 = i0 + (1 if i0 < insz - 1 else 0)
        l1 = min(max(float(np.float32(src - np.float32(i0))), 0.0), 1.0)
        m[o, i0] += 1.0 - l1
        m[o, i1] += l1
    return m


def _resample(x, mats):
    dt = x.dtype
    if jnp.issubdtype(dt, jnp.integer):  # uint8 images: each pass rounds and saturates, like PyTorch
        info = jnp.iinfo(dt)
        nsp = len(mats)
        y = x.astype(jnp.float32)
        for i in reversed(range(nsp)):  # last (horizontal) dim first
            y = _apply_dim(y, mats[i], y.ndim - nsp + i)
            y = jnp.clip(jnp.round(y), info.min, info.max)
        return y.astype(dt)
    return _apply_dims(_up(x), mats, len(mats)).astype(dt)


def _nearest_up(self, output_size, scales, exact):
    nsp = len(scales)
    output_size = _tup(output_size, nsp, "output_size")
    y = self
    for i, (o, sc) in enumerate(zip(output_size, scales)):
        ax = self.ndim - nsp + i
        y = jnp.take(y, jnp.asarray(_nearest_index(self.shape[ax], o, sc, exact)), axis=ax)
    return y


def _nearest_up_backward(grad_output, output_size, input_size, scales, exact):
    nsp = len(scales)
    output_size = _tup(output_size, nsp, "output_size")
    mats = []
    for i, (o, sc) in enumerate(zip(output_size, scales)):
        insz = input_size[len(input_size) - nsp + i]
        m = np.zeros((o, insz), np.float64)
        m[np.arange(o), _nearest_index(insz, o, sc, exact)] = 1.0
        mats.append(m.T)
    return _resample(grad_output, mats)


def _linear_up(self, output_size, align_corners, scales):
    nsp = len(scales)
    output_size = _tup(output_size, nsp, "output_size")
    mats = [_linear_matrix(self.shape[self.ndim - nsp + i], o, align_corners, sc)
            for i, (o, sc) in enumerate(zip(output_size, scales))]
    return _resample(self, mats)


def _linear_up_backward(grad_output, output_size, input_size, align_corners, scales):
    nsp = len(scales)
    output_size = _tup(output_size, nsp, "output_size")
    mats = [_linear_matrix(input_size[len(input_size) - nsp + i], o, align_corners, sc).T
            for i, (o, sc) in enumerate(zip(output_size, scales))]
    return _resample(grad_output, mats)


@lower("upsample_nearest1d")
def upsample_nearest1d(self, output_size, scales=None):
    return _nearest_up(self, output_size, (scales,), False)


@lower("upsample_nearest2d")
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    return _nearest_up(self, output_size, (scales_h, scales_w), False)


@lower("upsample_nearest3d")
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _nearest_up(self, output_size, (scales_d, scales_h, scales_w), False)


@lower("_upsample_nearest_exact1d")
def _upsample_nearest_exact1d(self, output_size, scales=None):
    return _nearest_up(self, output_size, (scales,), True)


@lower("_upsample_nearest_exact2d")
def _upsample_nearest_exact2d(self, output_size, scales_h=None, scales_w=None):
    return _nearest_up(self, output_size, (scales_h, scales_w), True)


@lower("_upsample_nearest_exact3d")
def _upsample_nearest_exact3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _nearest_up(self, output_size, (scales_d, scales_h, scales_w), True)


@lower("upsample_nearest1d_backward")
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _nearest_up_backward(grad_output, output_size, input_size, (scales,), False)


@lower("upsample_nearest2d_backward")
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    return _nearest_up_backward(grad_output, output_size, input_size, (scales_h, scales_w), False)


@lower("upsample_nearest3d_backward")
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None, scales_h=None,
                                scales_w=None):
    return _nearest_up_backward(grad_output, output_size, input_size, (scales_d, scales_h, scales_w), False)


@lower("_upsample_nearest_exact1d_backward")
def _upsample_nearest_exact1d_backward(grad_output, output_size, input_size, scales=None):
    return _nearest_up_backward(grad_output, output_size, input_size, (scales,), True)


@lower("_upsample_nearest_exact2d_backward")
def _upsample_nearest_exact2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    return _nearest_up_backward(grad_output, output_size, input_size, (scales_h, scales_w), True)


@lower("_upsample_nearest_exact3d_backward")
def _upsample_nearest_exact3d_backward(grad_output, output_size, input_size, scales_d=None, scales_h=None,
                                       scales_w=None):
    return _nearest_up_backward(grad_output, output_size, input_size, (scales_d, scales_h, scales_w), True)


@lower("upsample_linear1d")
def upsample_linear1d(self, output_size, align_corners, scales=None):
    return _linear_up(self, output_size, align_corners, (scales,))


@lower("upsample_bilinear2d")
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _linear_up(self, output_size, align_corners, (scales_h, scales_w))


@lower("upsample_trilinear3d")
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _linear_up(self, output_size, align_corners, (scales_d, scales_h, scales_w))


@lower("upsample_linear1d_backward")
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
    return _linear_up_backward(grad_output, output_size, input_size, align_corners, (scales,))


@lower("upsample_bilinear2d_backward")
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    return _linear_up_backward(grad_output, output_size, input_size, align_corners, (scales_h, scales_w))


@lower("upsample_trilinear3d_backward")
def upsample_trilinear3d_backward(grad_output, output_size, input_size, align_corners, scales_d=None,
                                  scales_h=None, scales_w=None):
    return _linear_up_backward(grad_output, output_size, input_size, align_corners,
                               (scales_d, scales_h, scales_w))


def _cubic_matrix(insz, outsz, align_corners, scale):
    a = -0.75

    def cc1(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def cc2(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    m = np.zeros((outsz, insz), np.float64)
    if align_corners:
        r = np.float32(insz - 1) / np.float32(outsz - 1) if outsz > 1 else np.float32(0)
    else:
        r = _scale_value(insz, outsz, scale)
    for o in range(outsz):
        if align_corners:
            src = np.float32(r * np.float32(o))
        else:
            src = np.float32(r * (np.float32(o) + np.float32(0.5)) - np.float32(0.5))
        i0 = min(int(np.floor(src)), insz - 1)
        t = min(max(float(np.float32(src - np.float32(i0))), 0.0), 1.0)
        coeffs = (cc2(t + 1), cc1(t), cc1(1 - t), cc2(2 - t))
        for j, c in enumerate(coeffs):
            m[o, min(max(i0 - 1 + j, 0), insz - 1)] += c
    return m


@lower("upsample_bicubic2d")
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    output_size = _tup(output_size, 2, "output_size")
    mats = [_cubic_matrix(self.shape[-2], output_size[0], align_corners, scales_h),
            _cubic_matrix(self.shape[-1], output_size[1], align_corners, scales_w)]
    return _resample(self, mats)


@lower("upsample_bicubic2d_backward")
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                scales_w=None):
    output_size = _tup(output_size, 2, "output_size")
    mats = [_cubic_matrix(input_size[-2], output_size[0], align_corners, scales_h).T,
            _cubic_matrix(input_size[-1], output_size[1], align_corners, scales_w).T]
    return _resample(grad_output, mats)
