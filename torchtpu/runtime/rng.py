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

from . import placement

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
_default: dict[int, torch.Generator] = {}   # device index -> its default generator, made on first use
_seed_all: list[int] = []   # the last manual_seed_all's seed, for generators made after it


def _require_extension() -> None:
    if _missing is not None:
        raise RuntimeError(
            "torchtpu: the device RNG needs the C++ extension torchtpu/runtime/_generator "
            "(csrc/generator.cpp), which is not built; run `make venv` (or `pip install "
            f"--no-build-isolation -e .`) in the torchtpu checkout ({_missing})")


def default_generator(index: int | None = None) -> torch.Generator:
    """tpu:`index`'s default generator (None: the device of the op running now), created on
    first use (the device must be named first): each device has its own, as on CUDA."""
    if index is None:
        index = placement.active_index()
    gen = _default.get(index)
    if gen is None:
        _require_extension()
        with _lock:
            gen = _default.get(index)
            if gen is None:
                gen = torch.Generator(device=f"tpu:{index}")
                if _seed_all:
                    gen.manual_seed(_seed_all[0])
                _default[index] = gen
    return gen


def manual_seed(seed: int, index: int | None = None) -> None:
    """Seed tpu:`index`'s default generator (None: the current device's)."""
    default_generator(placement.current() if index is None else index).manual_seed(int(seed) & 0xFFFFFFFFFFFFFFFF)


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator, those made later included."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    _seed_all[:] = [seed]
    default_generator(0)
    for gen in list(_default.values()):
        gen.manual_seed(seed)


def initial_seed() -> int:
    return default_generator(placement.current()).initial_seed()


def seed() -> int:
    """Seed with a non-deterministic random number (as torch.cuda.seed); returns it."""
    return default_generator(placement.current()).seed()


def get_state(index: int | None = None) -> torch.Tensor:
    return default_generator(placement.current() if index is None else index).get_state()


def set_state(state: torch.Tensor, index: int | None = None) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise TypeError(f"expected a torch.ByteTensor as the RNG state, but got {type(state).__name__}"
                        + (f" of dtype {state.dtype}" if isinstance(state, torch.Tensor) else ""))
    default_generator(placement.current() if index is None else index).set_state(state.detach().cpu().contiguous())


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
        gen = _default.get(placement.active_index()) or default_generator()
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
