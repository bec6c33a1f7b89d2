"""torch.tpu's submodules, importable as torch.cuda's are: `from torch.tpu.amp import
GradScaler`, `import torch.tpu.memory`, `torch.tpu.random.get_rng_state()`,
`torch.tpu.streams.Stream`. torch.tpu is one module (device/module.py), not a package, so
each submodule is a module object registered in sys.modules under its dotted name (the
import system looks there first) and set as an attribute of torch.tpu."""
from __future__ import annotations

import sys
import types

# torch.cuda.<submodule>'s public names that torch.tpu has, per submodule
_NAMES = {
    "memory": ("empty_cache", "memory_stats", "memory_stats_as_nested_dict", "reset_accumulated_memory_stats",
               "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
               "host_memory_stats", "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
               "reset_peak_host_memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
               "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_summary", "mem_get_info"),
    "random": ("get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
               "manual_seed_all", "seed", "seed_all", "initial_seed"),
    "streams": ("Stream", "Event"),
}


def install(module_name: str) -> None:
    """Make torch.tpu.amp, .memory, .random and .streams from the torch.tpu module named."""
    tpu = sys.modules[module_name]
    from . import amp

    subs = {"amp": amp}
    for sub, names in _NAMES.items():
        m = types.ModuleType(f"torch.tpu.{sub}", f"torch.tpu.{sub}: torch.cuda.{sub}'s names for the tpu device.")
        for n in names:
            setattr(m, n, getattr(tpu, n))
        m.__all__ = list(names)
        subs[sub] = m
    for sub, m in subs.items():
        setattr(tpu, sub, m)
        sys.modules[f"torch.tpu.{sub}"] = m
