"""PyTorch's autoload entry point for torchtpu (`torch.backends` group, pyproject.toml).

PyTorch calls it at the end of every `import torch` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0.
It lives outside the torchtpu package because importing anything inside that package runs
torchtpu/__init__.py, which imports JAX; it loads torchtpu/device/lazy.py from its file
instead, and that names the "tpu" device and loads the rest on first use (see there).
An explicit `import torchtpu` still loads everything at once.
"""
from __future__ import annotations

import importlib.util
import os
import sys


def load() -> None:
    """Bind the "tpu" device into torch without importing JAX (torchtpu.device.lazy.bind)."""
    if "torchtpu" in sys.modules:  # imported already: it bound the device itself
        return
    lazy = sys.modules.get("torchtpu.device.lazy")
    if lazy is None:
        spec = importlib.util.find_spec("torchtpu")  # finds the package without running it
        path = os.path.join(spec.submodule_search_locations[0], "device", "lazy.py")
        lazy_spec = importlib.util.spec_from_file_location("torchtpu.device.lazy", path)
        lazy = importlib.util.module_from_spec(lazy_spec)
        sys.modules["torchtpu.device.lazy"] = lazy
        try:
            lazy_spec.loader.exec_module(lazy)
        except BaseException:
            del sys.modules["torchtpu.device.lazy"]
            raise
    lazy.bind()
