"""How the OpInfo sweeps name an OpInfo: shared by the sweep (validate/ops.py) and the
error-input sweep (validate/error_inputs.py), which neither imports the other for it."""
from __future__ import annotations


def opinfo_name(op) -> str:
    """`name.variant` as PyTorch's OpInfo test ids spell it ("max.binary"), or `name`."""
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")
