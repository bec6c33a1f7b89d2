"""torchtpu: a native PyTorch backend for XLA devices.

    import torch, torchtpu
    model = model.to("tpu")

Device tensors are plain torch.Tensors; JAX (through PJRT) runs them on a TPU
where one exists, else a GPU, else the host CPU.
"""
from __future__ import annotations

from . import config  # every TORCHTPU_* environment variable, read once here
from .runtime import jaxenv as _jaxenv  # configures JAX first (x64)
from .device import registration as _registration

_registration.register()

from . import ops as _ops  # noqa: E402
from .eager import fallback as _fallback  # noqa: E402
from .eager import kernels as _kernels  # noqa: E402
from . import metrics as _metrics  # noqa: E402

from .eager import deferred as _deferred  # noqa: E402
from .eager import modes as _modes  # noqa: E402

_kernels.register_runtime()
_kernels.register_kernels()
_kernels.register_lowerings()

from .runtime import precision as _precision  # noqa: E402

_precision.sync()  # JAX's matmul precision follows torch's from the first program on

_deferred.install_hooks()
from .eager import control_flow as _control_flow  # noqa: E402
from .eager import dynamism as _dynamism  # noqa: E402,F401 - growing KV caches become dynamic (eager/growth.py)

_control_flow.register()  # torch.cond, while_loop, scan, ... on tpu tensors
from .compile import flex_attention as _flex_attention  # noqa: E402

_flex_attention.allow_tpu()  # torch.nn.attention.flex_attention takes tpu tensors
from . import distributed as _distributed  # noqa: E402,F401 - registers the c10d backend "tpu"
from . import kernels as _user_kernels  # noqa: E402,F401 - jax_op, JAX interop, DLPack routing

__version__ = "0.1.0"

import os as _os  # noqa: E402
import typing as _typing  # noqa: E402


def compile_cache_dir(path: "str | _os.PathLike | None") -> None:
    """Keep compiled XLA executables in `path`: a later process running the same
    programs (torch.compile graphs and eager ops alike) skips XLA compilation.
    None turns the cache off. The environment variable TORCHTPU_CACHE_DIR sets it at import."""
    from .runtime.cache import compile_cache_dir as _set

    _set(path)


def dump_stablehlo(fn, *args, path: "str | _os.PathLike | None" = None, **kwargs) -> list[str]:
    """Compile `fn` with torch.compile(backend="tpu"), run it once on `args`, and return the
    StableHLO text of each graph that call compiled (also written under `path` if given).
    The environment variable TORCHTPU_DUMP_STABLEHLO=dir writes every compiled graph."""
    from .compile import dump_stablehlo as _dump

    return _dump(fn, *args, path=path, **kwargs)


def set_collectives(mode: str) -> None:
    """Where torch.compile puts the collectives of a graph (DDP's python reducer, DTensor,
    FSDP2, dist.* calls): "in_graph" (default) makes them part of the compiled program;
    "skinny" cuts the graph at each one and runs it as its own executable, for comparison.
    The environment variable TORCHTPU_COLLECTIVES sets the default. Affects graphs
    compiled after the call."""
    from .compile.collectives import set_collectives as _set

    _set(mode)


def get_collectives() -> str:
    """The collectives placement torch.compile uses now: "in_graph" or "skinny"."""
    from .compile.collectives import get_collectives as _get

    return _get()


from .runtime import cache as _cache  # noqa: E402

_cache.count_compile_time()

if config.startup.cache_dir:
    compile_cache_dir(config.startup.cache_dir)


def set_eager_mode(mode: str) -> None:
    """Select how eager ops run: "strict" (default; each op is its own compiled
    executable, asynchronous), "debug" (strict, synchronous, errors name the op and
    the user's line; TORCHTPU_DEBUG_NANS=1 adds a NaN/Inf check per op) or
    "defer_and_fuse" (ops are recorded and run as one fused executable per region).
    Process-wide; the environment variable TORCHTPU_EAGER_MODE sets it at import."""
    _modes.set(mode)


def get_eager_mode() -> str:
    """The current eager mode."""
    return _modes.get()


def eager_mode(mode: str):
    """Context manager: run the block in `mode`, then restore the previous mode."""
    return _modes.mode(mode)


def set_debug_nans(enabled: bool) -> None:
    """In debug mode, check every op's float outputs for NaN/Inf (TORCHTPU_DEBUG_NANS=1)."""
    _modes.set_debug_nans(enabled)


def set_checks(enabled: bool) -> None:
    """Turn device-side checks on (default) or off. On, an out-of-range index (gather,
    scatter, index_select, embedding, advanced indexing, take/put, nll_loss targets), an
    integer division by zero or an invalid probability raises CPU PyTorch's error at the
    next host read; off, programs keep XLA's semantics (clamped gathers, dropped scatters)
    and carry no flag. The environment variable TORCHTPU_CHECKS=0 turns them off at import."""
    from .eager import checks as _checks

    _checks.set_checks(enabled)


def checks_enabled() -> bool:
    """Whether device-side checks are on."""
    from .ops import checks as _checks

    return _checks.enabled()


def set_executable_limit(total: "int | None" = None, per_op: "int | None" = None,
                         regions: "int | None" = None, total_bytes: "int | None" = None) -> None:
    """Bound the compiled executables kept in memory (least recently used are evicted and
    their compiled code released; counted in metrics()["executables_evicted"]): `total`
    eager-op executables (env TORCHTPU_MAX_EXECUTABLES, default 4096), `per_op` per ATen op
    and per compiled graph (TORCHTPU_MAX_EXECUTABLES_PER_OP, 1024), `regions` fused
    defer_and_fuse regions (TORCHTPU_MAX_REGIONS, 512), `total_bytes` the host memory all
    kept executables hold together, each measured when it was compiled
    (TORCHTPU_MAX_EXECUTABLE_MB, 2048 MB; metrics()["executables_evicted_for_bytes"])."""
    from .runtime.cache import set_executable_limit as _set

    _set(total, per_op, regions, total_bytes)


def executable_limit() -> dict:
    """The bounds set_executable_limit() sets: {"total", "per_op", "regions", "total_bytes"}."""
    from .runtime.cache import executable_limit as _get

    return _get()


def executable_memory() -> int:
    """Host bytes the kept compiled executables hold (eager ops, fused regions, compiled
    graphs), each as measured when it was compiled: what set_executable_limit(total_bytes=)
    bounds."""
    from .runtime.executables import held_bytes as _held

    return _held()


def clear_caches() -> None:
    """Drop every cached executable (eager ops, fused regions, control flow) and every other
    module-level cache torchtpu keeps (runtime/cache.sizes() lists them), JAX's own compile
    caches, and give the freed memory back; later calls compile again."""
    from .eager import deferred as _d
    from .eager import executor as _e
    from .runtime import cache as _c
    import jax as _jax

    _d.flush("clear_caches")
    _e.clear_cache()
    _c.clear_registered()  # every module-level cache (runtime/cache.register)
    _jax.clear_caches()
    _c.evict({}, ())
    _c.trim_heap()


def metrics() -> dict:
    """Counters since start (or the last reset_metrics()).

    Keys: compiles, cache_hits, executions, transfers_to_device / bytes_to_device,
    transfers_to_host / bytes_to_host, cpu_fallbacks, and fallback_ops
    (a dict: ATen overload name -> number of CPU fallbacks).
    """
    return _metrics.snapshot()


def reset_metrics() -> None:
    """Zero every counter in metrics()."""
    _metrics.reset()


def set_fallback(enabled: bool) -> None:
    """Allow (True, the default) or forbid the CPU fallback for ops with no tpu lowering.

    Forbidden, such an op raises NotImplementedError naming the overload.
    The environment variable TORCHTPU_FALLBACK=0 sets the same at import.
    """
    _fallback.set_enabled(enabled)


def fallback_enabled() -> bool:
    return _fallback.enabled()


def platform() -> str:
    """The XLA platform behind "tpu": 'tpu', 'gpu' or 'cpu'."""
    return _jaxenv.platform()


def jax_op(name: str, fn=None, *, num_outputs: "int | None" = None, interpret=None, probe: bool = True):
    """Register the jittable JAX function `fn` as the torch.library custom op `name`
    ("namespace::op"); returns the op (callable; also torch.ops.namespace.op). Tensor
    arguments arrive as JAX arrays, numbers/bools/strings/tuples as static values; one array
    or a tuple comes back. Gradients are the JAX vjp of `fn`. On XLA:CPU Pallas kernels run
    in interpret mode (interpret=None); pass interpret=False/True to choose. Without `fn`,
    a decorator. See README "Custom kernels"."""
    from .kernels import jax_op as _register

    if fn is None:
        return lambda f: _register(name, f, num_outputs=num_outputs, interpret=interpret, probe=probe)
    return _register(name, fn, num_outputs=num_outputs, interpret=interpret, probe=probe)


def to_jax(t: "torch.Tensor") -> "jax.Array":
    """The JAX array behind tpu tensor `t` (its view geometry applied), without a host copy."""
    from .kernels import to_jax as _to_jax

    return _to_jax(t)


def from_jax(a: "jax.Array") -> "torch.Tensor":
    """A tpu tensor over JAX array `a`'s buffer, without a copy."""
    from .kernels import from_jax as _from_jax

    return _from_jax(a)


def mark_dynamic(t: "torch.Tensor", dim: int, lower: int = 0, upper: "int | None" = None) -> "torch.Tensor":
    """Declare that dim `dim` of tpu tensor `t` varies in size within [lower, upper]
    (upper None: unbounded). Ops over it, and over the results that inherit the dim, compile
    once per bucket of sizes (powers of two, capped at `upper`) instead of once per size;
    results and the sizes PyTorch sees are the true ones. `t` moves in place into a
    bucket-sized buffer (views taken before no longer alias it). An op that cannot keep the
    dim dynamic raises an error naming the op and the dim. Returns `t`."""
    from .eager import dynamism as _dynamism

    return _dynamism.mark_dynamic(t, dim, lower, upper)


def growth_bound(upper: "int | None") -> "_typing.ContextManager[None]":
    """A context manager: tensors that start growing by torch.cat inside it (greedy
    decoding's token ids and attention mask, a DynamicCache's K/V, a hand-written cache)
    stay within `upper` positions along the growing dim and pad to it at once, so a run
    within the bound compiles its programs at the first steps and nothing per bucket after
    (`with torchtpu.growth_bound(prompt_len + max_new_tokens): model.generate(...)`). A
    growth past `upper` raises. Process-wide, as the eager mode."""
    from .eager import growth as _growth

    return _growth.growth_bound(upper)


def get_dynamism(t: "torch.Tensor") -> "dict[int, tuple[int, int | None]]":
    """{dim: (lower, upper)} for the dynamic dim of `t` (marked, or inherited from an op
    over a marked tensor); {} for a static tensor."""
    from .eager import dynamism as _dynamism

    return _dynamism.get_dynamism(t)


def lowered_ops() -> list[str]:
    """ATen overloads with a native tpu kernel (lowerings and their generated variants)."""
    return sorted(_kernels.SERVED)


__all__ = [
    "config",
    "set_eager_mode",
    "get_eager_mode",
    "eager_mode",
    "set_debug_nans",
    "set_checks",
    "set_executable_limit",
    "executable_limit",
    "executable_memory",
    "clear_caches",
    "checks_enabled",
    "metrics",
    "reset_metrics",
    "set_fallback",
    "fallback_enabled",
    "platform",
    "lowered_ops",
    "mark_dynamic",
    "get_dynamism",
    "growth_bound",
    "jax_op",
    "to_jax",
    "from_jax",
    "compile_cache_dir",
    "dump_stablehlo",
    "set_collectives",
    "get_collectives",
]
