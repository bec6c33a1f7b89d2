"""The persistent compilation cache: XLA executables kept on disk across processes."""
from __future__ import annotations

import os


def compile_cache_dir(path: str | os.PathLike | None) -> None:
    """Keep XLA executables in `path` so a later process skips XLA compilation
    (None turns the persistent cache off). Env: TORCHTPU_CACHE_DIR."""
    import jax

    if path is None:
        jax.config.update("jax_compilation_cache_dir", None)
        return
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # cache every executable, however quick to compile: small graphs are many
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        from jax._src import compilation_cache

        compilation_cache.reset_cache()
    except Exception:  # older/newer JAX without the hook: the config alone applies to new compiles
        pass


_EVENTS = {
    "/jax/core/compile/backend_compile_duration": "xla_compile_ms",  # or a cache load, when warm
    "/jax/core/compile/jaxpr_trace_duration": "trace_ms",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_ms",
}


def count_compile_time() -> None:
    """Add JAX's own compile timings to torchtpu.metrics(): xla_compile_ms (XLA
    compilation, or loading from the persistent cache), trace_ms and lower_ms."""
    from jax import monitoring

    from ..metrics import bump

    def listener(event: str, duration_secs: float, **kwargs) -> None:
        name = _EVENTS.get(event)
        if name is not None:
            bump(name, int(round(duration_secs * 1000)))

    monitoring.register_event_duration_secs_listener(listener)
