"""`import torch` loads torchtpu: the entry point of PyTorch's `torch.backends` group.

PyTorch calls every `torch.backends` entry point at the end of `import torch`
(torch/__init__.py `_import_device_backends`), unless the environment sets
TORCH_DEVICE_BACKEND_AUTOLOAD=0. At that moment `torch` is in sys.modules and
fully defined except for what its __init__ runs after the hook (log settings,
torch._native), so importing torchtpu then is safe: nothing of ours reads those.
"""
from __future__ import annotations


def load() -> None:
    """Import torchtpu (registers the "tpu" device, its kernels and backends)."""
    import torchtpu  # noqa: F401
