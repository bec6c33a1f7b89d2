"""The autoload entry point of installs made before autoload became lazy: `import torchtpu`.

pyproject.toml now names `torchtpu_autoload:load` (outside the package, so that `import
torch` does not import JAX: torchtpu/device/lazy.py). An environment installed earlier
still names this one until it is reinstalled (`make venv`), and it keeps working: it
loads everything at once, as `import torchtpu` does.
"""
from __future__ import annotations


def load() -> None:
    """Import torchtpu (registers the "tpu" device, its kernels and backends)."""
    import torchtpu  # noqa: F401
