import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu  # noqa: E402


@pytest.fixture
def no_fallback():
    """Run the test with the CPU fallback forbidden, so any missing lowering fails loudly."""
    torchtpu.set_fallback(False)
    try:
        yield
    finally:
        torchtpu.set_fallback(True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
