"""`import torch` loads torchtpu through PyTorch's `torch.backends` entry point (issue 15)."""
import os
import subprocess
import sys

PROGRAM = (
    "import sys, torch\n"
    "torch.manual_seed(0)\n"
    "x = torch.randn(2, 3, device='tpu')\n"
    "print(x.device, 'torchtpu' in sys.modules)\n"
    "print(torch.equal((x * 2).cpu(), x.cpu() * 2))\n"
)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, JAX_PLATFORMS="cpu", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_import_torch_autoloads_the_tpu_device():
    r = _run(PROGRAM)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["tpu:0", "True", "True"]


def test_autoload_can_be_disabled_like_any_backend():
    r = _run(PROGRAM, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "tpu" in r.stderr
    assert "torchtpu" not in r.stdout
