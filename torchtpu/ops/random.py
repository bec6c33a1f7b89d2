"""Random ops, keyed by torch's seed through runtime.rng.

Every lowering here is `random=True`: it gets a JAX PRNG `key` derived (inside the
compiled program) from torch.manual_seed's seed and a per-op counter, so runs are
reproducible under torch.manual_seed but not bitwise equal to CPU PyTorch.

Explicit generators: `generator=` never reaches a lowering. The eager executor takes it
out of the call (runtime/rng.split_generator: a CPU generator raises CUDA's error) and
passes that generator's seed and offset as the runtime inputs the key is derived from, so
one compiled program serves every generator and every state.

The in-place-only ops (normal_, uniform_, bernoulli_, random_, exponential_,
geometric_, log_normal_, cauchy_) are reached through their functional twins
(uniform, random.from, ...) whose in-place and out= overloads the executor
generates; normal_ has no twin of the same schema and is registered directly.
"""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime.jaxenv import to_jax_dtype
from . import checks
from ._common import is_complex as _is_complex, is_float as _is_float, scalar_type_name
from .registry import LOWERINGS, lower

_LOW_PRECISION = (jnp.float16, jnp.bfloat16)


def _check_generator(generator, name):
    if generator is not None:  # a caller that bypassed the executor: its state would be ignored
        raise RuntimeError(f"{name}: a generator reaches tpu random ops only through eager execution")


def _compute_dtype(dt):
    """The dtype random floats are drawn in for a result of dtype `dt`."""
    dt = jnp.dtype(dt)
    if dt == jnp.float64 or dt == jnp.complex128:
        return jnp.float64
    return jnp.float32


def _uniform01(key, shape, dt):
    return jax.random.uniform(key, shape, _compute_dtype(dt))


def _require_float(x, name):
    if not (_is_float(x.dtype) or _is_complex(x.dtype)):
        raise NotImplementedError(f'"{name}" not implemented for \'{_torch_name(x.dtype)}\'')


_torch_name = scalar_type_name  # PyTorch's name of a dtype in kernel errors ("Long"), not Python's ("int64")


def _standard_normal(key, shape, dt):
    dt = jnp.dtype(dt)
    if _is_complex(dt):
        rdt = _compute_dtype(dt)
        kr, ki = jax.random.split(key)
        s = math.sqrt(0.5)
        return (jax.random.normal(kr, shape, rdt) * s + 1j * jax.random.normal(ki, shape, rdt) * s).astype(dt)
    return jax.random.normal(key, shape, _compute_dtype(dt))


# --- normal ----------------------------------------------------------------


def _check_std(std):
    if isinstance(std, (int, float)) and std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")


@lower("normal_", random=True)
def normal_(self, mean=0.0, std=1.0, generator=None, key=None):
    _check_generator(generator, "normal_")
    _require_float(self, "normal_kernel_cpu")
    _check_std(std)
    return (_standard_normal(key, self.shape, self.dtype) * std + mean).astype(self.dtype)


@lower("normal_functional", random=True)
def normal_functional(self, mean=0.0, std=1.0, generator=None, key=None):
    return normal_(self, mean, std, generator=generator, key=key)


@lower("normal.Tensor_float", random=True)
def normal_tensor_float(mean, std=1.0, generator=None, key=None):
    _check_generator(generator, "normal")
    _require_float(mean, "normal")
    _check_std(std)
    z = _standard_normal(key, mean.shape, mean.dtype)
    return (mean.astype(z.dtype) + z * std).astype(mean.dtype)


@lower("normal.float_Tensor", random=True)
def normal_float_tensor(mean, std, generator=None, key=None):
    _check_generator(generator, "normal")
    _require_float(std, "normal")
    z = _standard_normal(key, std.shape, std.dtype)
    return (z * std.astype(z.dtype) + mean).astype(std.dtype)


@lower("normal.Tensor_Tensor", random=True)
def normal_tensor_tensor(mean, std, generator=None, key=None):
    _check_generator(generator, "normal")
    _require_float(mean, "normal")
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    z = _standard_normal(key, shape, mean.dtype)
    return (mean.astype(z.dtype) + z * std.astype(z.dtype)).astype(mean.dtype)


def _check_std_tensor(mean, std, *args, **kwargs):
    # CPU and CUDA read the std tensor's minimum on the host (a sync) and raise at the call; a
    # device-side check would raise only at the next host read, after the call returned
    if isinstance(std, torch.Tensor) and std.numel() and bool((std < 0).any()):
        raise RuntimeError("normal expects all elements of std >= 0.0")


LOWERINGS["normal.float_Tensor"].check = _check_std_tensor
LOWERINGS["normal.Tensor_Tensor"].check = _check_std_tensor


def _factory_dtype(dtype):
    return to_jax_dtype(dtype if dtype is not None else torch.get_default_dtype())


@lower("normal.float_float", random=True)
def normal_float_float(mean, std, size, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, key=None):
    _check_generator(generator, "normal")
    _check_std(std)
    dt = _factory_dtype(dtype)
    return (_standard_normal(key, tuple(size), dt) * std + mean).astype(dt)


@lower("normal.float_float_out", random=True)
def normal_float_float_out(mean, std, size, generator=None, key=None):
    # the out= kernel casts the result into `out`'s dtype
    return normal_float_float(mean, std, size, generator, torch.float64, key=key)


# --- uniform & friends -----------------------------------------------------


@lower("uniform", random=True)
def uniform(self, from_=0.0, to=1.0, generator=None, key=None):
    _check_generator(generator, "uniform_")
    _require_float(self, "check_uniform_bounds")
    if from_ > to:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}"
        )
    dt = jnp.dtype(self.dtype)
    if _is_complex(dt):
        kr, ki = jax.random.split(key)
        rdt = _compute_dtype(dt)
        re = jax.random.uniform(kr, self.shape, rdt, from_, to)
        im = jax.random.uniform(ki, self.shape, rdt, from_, to)
        return (re + 1j * im).astype(dt)
    u = _uniform01(key, self.shape, dt)
    return (u * (to - from_) + from_).astype(dt)


@lower("exponential", random=True)
def exponential(self, lambd=1.0, generator=None, key=None):
    _check_generator(generator, "exponential_")
    _require_float(self, "exponential_cpu")
    if not lambd > 0.0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    x = jax.random.exponential(key, self.shape, _compute_dtype(self.dtype))
    return (x / lambd).astype(self.dtype)


@lower("geometric", random=True)
def geometric(self, p, generator=None, key=None):
    _check_generator(generator, "geometric_")
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    cdt = _compute_dtype(self.dtype)
    u = jax.random.uniform(key, self.shape, cdt, jnp.finfo(cdt).tiny, 1.0)
    return jnp.ceil(jnp.log(u) / math.log1p(-p)).astype(self.dtype)


@lower("log_normal", random=True)
def log_normal(self, mean=1.0, std=2.0, generator=None, key=None):
    _check_generator(generator, "log_normal_")
    _require_float(self, "log_normal_cpu")
    if not std > 0.0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    z = jax.random.normal(key, self.shape, _compute_dtype(self.dtype))
    return jnp.exp(z * std + mean).astype(self.dtype)


@lower("cauchy", random=True)
def cauchy(self, median=0.0, sigma=1.0, generator=None, key=None):
    _check_generator(generator, "cauchy_")
    _require_float(self, "cauchy_cpu")
    if not sigma > 0.0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    z = jax.random.cauchy(key, self.shape, _compute_dtype(self.dtype))
    return (z * sigma + median).astype(self.dtype)


# --- bernoulli -------------------------------------------------------------


def _check_p(p):
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")


@lower("bernoulli.p", random=True)
def bernoulli_p(self, p=0.5, generator=None, key=None):
    _check_generator(generator, "bernoulli_")
    _check_p(p)
    u = _uniform01(key, self.shape, self.dtype)
    return (u < p).astype(self.dtype)


@lower("bernoulli.Tensor", random=True)
def bernoulli_tensor(self, p, generator=None, key=None):
    _check_generator(generator, "bernoulli_")
    cdt = _compute_dtype(p.dtype) if _is_float(p.dtype) else jnp.float32
    pc = jnp.asarray(p).astype(cdt)
    checks.report(~jnp.all((pc >= 0) & (pc <= 1)),
                  message="Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message "
                          "be improved?  If so, please report an enhancement request to PyTorch.)")
    u = jax.random.uniform(key, self.shape, cdt)
    return (u < jnp.broadcast_to(p, self.shape).astype(cdt)).astype(self.dtype)


@lower("bernoulli", random=True)
def bernoulli(self, generator=None, key=None):
    _check_generator(generator, "bernoulli")
    _require_float(self, "bernoulli_tensor_cpu_p_")  # self is also p: CPU names the check on p
    return bernoulli_tensor(self, self, key=key)


# --- poisson ---------------------------------------------------------------


@lower("poisson", random=True)
def poisson(self, generator=None, key=None):
    _check_generator(generator, "poisson")
    _require_float(self, "poisson_cpu")
    rate = self.astype(_compute_dtype(self.dtype))
    checks.report(~jnp.all(rate >= 0), message="invalid Poisson rate, expected rate to be non-negative")
    draw = jax.random.poisson(key, jnp.maximum(rate, 0), self.shape, dtype=jnp.int64)
    return draw.astype(self.dtype)


# --- random_ (discrete uniform) --------------------------------------------


def _digits(dt) -> int:
    dt = jnp.dtype(dt)
    return {jnp.dtype(jnp.float16): 11, jnp.dtype(jnp.bfloat16): 8, jnp.dtype(jnp.float32): 24,
            jnp.dtype(jnp.float64): 53}[dt]


# c10's names of the C types in random_'s range errors ("to - 1 is out of bounds for int")
_C_NAMES = {"bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short int", "int32": "int",
            "int64": "long int", "uint16": "short unsigned int", "uint32": "unsigned int",
            "uint64": "long unsigned int", "float16": "c10::Half", "bfloat16": "c10::BFloat16", "float32": "float",
            "float64": "double"}


def _check_in_range(dt, from_: int, to_inclusive: int) -> None:
    """PyTorch's check_from_to_in_range: the bounds must fit the result's dtype (else the draw
    would wrap), and a float's beyond 2**digits only warn (not every integer there is a float)."""
    dt = jnp.dtype(dt)
    if dt == jnp.bool_:
        lo, hi = 0, 1
    elif _is_float(dt):
        lo, hi = float(jnp.finfo(dt).min), float(jnp.finfo(dt).max)
    else:
        lo, hi = int(jnp.iinfo(dt).min), int(jnp.iinfo(dt).max)
    for what, v in (("from", from_), ("to - 1", to_inclusive)):
        if not lo <= v <= hi:
            raise RuntimeError(f"{what} is out of bounds for {_C_NAMES.get(dt.name, dt.name)}")
    if _is_float(dt):
        d = _digits(dt)
        for what, v in (("from", from_), ("to - 1", to_inclusive)):
            if not -(2 ** d) <= v <= 2 ** d:
                warnings.warn(f"{what} is out of bounds [-(2^{d}), 2^{d}]. Due to precision limitations "
                              f"{_C_NAMES[dt.name]} can support discrete uniform distribution only within this "
                              "range. This warning will become an error in version 1.7 release, please fix the "
                              "code in advance", UserWarning, stacklevel=2)


def _full_max(dt) -> int:
    dt = jnp.dtype(dt)
    if dt == jnp.bool_:
        return 1
    if _is_float(dt):
        return 2 ** _digits(dt)
    return int(jnp.iinfo(dt).max)


def _draw_int(key, shape, lo: int, span: int):
    """Integers lo + (bits % span) as int64, span in [1, 2**64] (ATen's modulo scheme)."""
    bits = jax.random.bits(key, shape, jnp.uint64)
    if span < 2**64:
        bits = bits % np.uint64(span)
    return jax.lax.bitcast_convert_type(bits + np.uint64(lo % 2**64), jnp.int64)  # two's complement


def _random_range(self, lo: int, hi_inclusive: int, key):
    dt = jnp.dtype(self.dtype)
    if _is_complex(dt):
        raise NotImplementedError(f"\"random_from_to_kernel_cpu\" not implemented for '{_torch_name(dt)}'")
    span = hi_inclusive - lo + 1
    vals = _draw_int(key, self.shape, lo, span)
    if dt == jnp.bool_:
        return vals != 0
    if dt == jnp.uint64:
        return vals.astype(jnp.uint64)
    return vals.astype(dt)


@lower("random", random=True)
def random_default(self, generator=None, key=None):
    _check_generator(generator, "random_")
    return _random_range(self, 0, _full_max(self.dtype), key)


@lower("random.to", random=True)
def random_to(self, to, generator=None, key=None):
    _check_generator(generator, "random_")
    if not to > 0:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from=0 >= to={to}")
    _check_in_range(self.dtype, 0, to - 1)
    return _random_range(self, 0, to - 1, key)


@lower("random.from", random=True)
def random_from(self, from_, to=None, generator=None, key=None):
    _check_generator(generator, "random_")
    if to is None:
        hi = _full_max(self.dtype)
        if from_ > hi:
            raise RuntimeError(f"random_ expects 'from' to be less than or equal to {hi}, got from={from_}")
        return _random_range(self, from_, hi, key)
    if not from_ < to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    _check_in_range(self.dtype, from_, to - 1)
    return _random_range(self, from_, to - 1, key)


# --- randperm --------------------------------------------------------------


def _perm(n, key):
    if n < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    return jax.random.permutation(key, jnp.arange(n, dtype=jnp.int64))


@lower("randperm", "randperm.generator", random=True)
def randperm(n, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key=None):
    _check_generator(generator, "randperm")
    dt = to_jax_dtype(dtype) if dtype is not None else jnp.int64
    return _perm(n, key).astype(dt)


@lower("randperm.out", "randperm.generator_out", random=True)
def randperm_out(n, generator=None, key=None):
    # the out= kernel casts the int64 permutation into `out`'s dtype
    _check_generator(generator, "randperm")
    return _perm(n, key)


# --- multinomial -----------------------------------------------------------


@lower("multinomial", random=True)
def multinomial(self, num_samples, replacement=False, generator=None, key=None):
    _check_generator(generator, "multinomial")
    if self.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not _is_float(self.dtype):
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {_torch_name(self.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    n_cat = self.shape[-1]
    if not replacement and num_samples > n_cat:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    probs = self.reshape(-1, n_cat).astype(_compute_dtype(self.dtype))
    rows = probs.shape[0]
    if rows == 0:
        return jnp.zeros(self.shape[:-1] + (num_samples,), jnp.int64)
    # CPU's checks on the distribution, as device-side flags
    checks.report(~jnp.all(jnp.isfinite(probs) & (probs >= 0)),
                  message="probability tensor contains either `inf`, `nan` or element < 0")
    checks.report(jnp.any(jnp.sum(probs, axis=-1) <= 0),
                  message="invalid multinomial distribution (sum of probabilities <= 0)")
    logp = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1)), -jnp.inf)
    if replacement:
        out = jax.random.categorical(key, logp, axis=-1, shape=(num_samples, rows)).T
    else:
        # Gumbel-top-k: the k largest perturbed log-probabilities, a sample without replacement
        g = jax.random.gumbel(key, logp.shape, logp.dtype)
        _, out = jax.lax.top_k(logp + g, num_samples)
    return out.astype(jnp.int64).reshape(self.shape[:-1] + (num_samples,))


# --- dropout ---------------------------------------------------------------


@lower("native_dropout", random=True)
def native_dropout(input, p, train, key=None):
    dt = jnp.dtype(input.dtype)
    if input.size == 0:
        return input, jnp.zeros(input.shape, dt)
    if train is not None and not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    if not 0 <= p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    p1m = 1.0 - p
    scale = 0.0 if p1m == 0 else 1.0 / p1m
    cdt = _compute_dtype(dt) if not _is_complex(dt) else dt
    mask = jax.random.uniform(key, input.shape, _compute_dtype(dt)) < p1m
    out = input.astype(cdt) * mask.astype(cdt) * scale
    return out.astype(dt), mask


@lower("native_dropout_backward")
def native_dropout_backward(grad_output, mask, scale):
    dt = jnp.dtype(grad_output.dtype)
    if dt.kind not in "fc":
        # integer/bool grads: mask.type_as(grad) * scale is a default-dtype (float32) tensor
        m = mask.astype(dt).astype(jnp.float32) * jnp.asarray(scale, jnp.float32)
        return grad_output.astype(jnp.float32) * m
    cdt = jnp.float32 if dt in _LOW_PRECISION else dt
    m = (mask.astype(cdt) * scale).astype(dt)  # mask.type_as(grad) * scale, in grad's dtype
    return (grad_output.astype(cdt) * m.astype(cdt)).astype(dt)
