"""JAX's lowerings of programs already compiled, given back.

A `jax.jit` call that compiles leaves two things behind: the executable, in the jit's C++
dispatch cache (what every later call with the same argument types runs), and the lowering it
was compiled from, in JAX's Python cache `_pjit_lower` (the MLIR module and HLO of the
program, kept for a call that misses the C++ cache). The second is the larger: 1.2 of the 1.55
MB of host memory a one-op program costs on XLA:CPU (`x[:n] * 2`, measured by RSS over 300
sizes), and it stays as long as the jit function lives, so the executables torchtpu caches cost
four times what they need to.

A call reaches the Python path again only where JAX gave the program no C++ fast path: a
program with effects (an ordered host callback: a compiled graph that runs an op on the CPU).
Such a lowering is kept; any other is evicted once its first call has compiled it. A call that
did miss would lower again and compile again: correct, only slower.
"""
from __future__ import annotations

from .. import metrics

try:  # JAX internals (pinned jax==0.10.2); without them nothing is given back
    from jax._src import core as _core
    from jax._src import dtypes as _dtypes
    from jax._src.interpreters.pxla import _cached_lowering_to_hlo
    from jax._src.pjit import _pjit_lower
    _CACHES = (_pjit_lower, _cached_lowering_to_hlo)  # each keyed weakly on a jaxpr
except ImportError:  # pragma: no cover
    _CACHES = ()


def _fast_path(jaxpr) -> bool:
    """Whether JAX dispatches this program from C++ (pjit._get_fastpath_data's test that
    the jaxpr decides: no effects, plain array results)."""
    if jaxpr.effects:
        return False
    return all(type(a) is _core.ShapedArray and not _dtypes.issubdtype(a.dtype, _dtypes.extended)
               for a in jaxpr.out_avals)


def shed() -> int:
    """Evict the cached lowerings of programs JAX now dispatches from C++; how many."""
    n = 0
    for cache in _CACHES:
        for key in cache.cache_keys():
            jaxpr = key[0]() if callable(key[0]) else None
            if jaxpr is None or not _fast_path(jaxpr):
                continue
            cache.evict_weakref(jaxpr)
            n += cache is _CACHES[0]
    if n:
        metrics.bump("lowerings_shed", n)
    return n
