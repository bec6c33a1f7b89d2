"""Device RNG state: torch.Generator objects for the "tpu" device, one seed and one
counter (offset) each.

`torch.Generator(device="tpu")` is a real torch.Generator: its C++ class (a seed and an
offset, csrc/generator.cpp) is registered with PyTorch by importing `_generator`, the
extension `make venv` / `pip install -e .` builds. The default generator
(`torch.tpu.default_generators[0]`) is one such object too, so an op given
`generator=torch.tpu.default_generators[0]` draws exactly what it would draw without one.

Each random op takes (seed, counter) as runtime inputs and derives its key with fold_in
inside the compiled program, so drawing random numbers costs no extra dispatch and never
recompiles; the op advances its generator's offset by one. Backward runs on the autograd
engine's thread, hence the lock around read-and-advance.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np
import torch

try:
    from . import _generator  # noqa: F401  (importing it registers the generator factory)
except ImportError as err:  # not built: every RNG call raises, naming the fix
    _missing: ImportError | None = err
else:
    _missing = None

# Each torch.Generator(device="tpu") reaches the factory through PyTorch's deprecated (but
# only, for a Python backend) route, which warns on every construction.
warnings.filterwarnings("ignore", message=r"GetGeneratorForPrivateuse1\(\) is deprecated")

_lock = threading.Lock()
_default: list[torch.Generator] = []


def _require_extension() -> None:
    if _missing is not None:
        raise RuntimeError(
            "torchtpu: the device RNG needs the C++ extension torchtpu/runtime/_generator "
            "(csrc/generator.cpp), which is not built; run `make venv` (or `pip install "
            f"--no-build-isolation -e .`) in the torchtpu checkout ({_missing})")


def default_generator() -> torch.Generator:
    """The device's default generator (created on first use: the device must be named first)."""
    if not _default:
        _require_extension()
        with _lock:
            if not _default:
                _default.append(torch.Generator(device="tpu"))
    return _default[0]


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed) & 0xFFFFFFFFFFFFFFFF)


def initial_seed() -> int:
    return default_generator().initial_seed()


def seed() -> int:
    """Seed with a non-deterministic random number (as torch.cuda.seed); returns it."""
    return default_generator().seed()


def get_state() -> torch.Tensor:
    return default_generator().get_state()


def set_state(state: torch.Tensor) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise TypeError(f"expected a torch.ByteTensor as the RNG state, but got {type(state).__name__}"
                        + (f" of dtype {state.dtype}" if isinstance(state, torch.Tensor) else ""))
    default_generator().set_state(state.detach().cpu().contiguous())


def check_generator(gen: torch.Generator) -> torch.Generator:
    """A generator given to a tpu op must be a tpu generator (CUDA's rule and message)."""
    if gen.device.type != "tpu":
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{gen.device.type}'")
    return gen


def _check_host_tensors(args, kwargs) -> None:
    # a tpu generator routes even a CPU tensor's op here (the generator's dispatch key):
    # CPU's error, as CUDA gives for a CUDA generator and a CPU tensor
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, torch.Tensor) and a.device.type == "cpu":
            raise RuntimeError("Expected a 'cpu' device type for generator but found 'tpu'")


def split_generator(args, kwargs):
    """(args, kwargs, generator): a random op's call with its torch.Generator argument
    replaced by None (the lowering never sees it: its seed and offset are runtime inputs,
    not part of the compiled program) and that generator, checked, or None."""
    gen = kwargs.get("generator") if kwargs else None
    if gen is not None:
        check_generator(gen)
        _check_host_tensors(args, kwargs)
        kwargs = dict(kwargs)
        kwargs["generator"] = None
        return args, kwargs, gen
    for i, a in enumerate(args):
        if isinstance(a, torch.Generator):
            check_generator(a)
            _check_host_tensors(args, kwargs)
            return args[:i] + (None,) + args[i + 1:], kwargs, a
    return args, kwargs, None


def next_key_data(gen: torch.Generator | None = None) -> tuple:
    """(seed low word, seed high word, counter) for one random op; advances `gen` (the
    default generator when None) by one."""
    if gen is None:
        gen = _default[0] if _default else default_generator()
    with _lock:
        off = gen.get_offset()
        gen.set_offset(off + 1)
        seed = gen.initial_seed()
    return np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32), np.uint32(off & 0xFFFFFFFF)


def host_generator(gen: torch.Generator) -> torch.Generator:
    """A CPU generator for a random op that runs on the host (the CPU fallback), seeded
    from `gen`'s seed and offset and advancing it, so it repeats under the same state."""
    lo, hi, off = next_key_data(check_generator(gen))
    host = torch.Generator()
    host.manual_seed(((int(hi) << 32 | int(lo)) * 0x9E3779B97F4A7C15 + int(off)) & 0xFFFFFFFFFFFFFFFF)
    return host


def key(lo, hi, counter):
    """The JAX key for one random op; call inside a trace."""
    import jax

    k = jax.random.fold_in(jax.random.key(lo), hi)
    return jax.random.fold_in(k, counter)
