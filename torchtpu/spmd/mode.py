"""Where collectives go: inside the compiled SPMD program or the defer_and_fuse region
("in_graph", the default) or one executable each, between them ("skinny"). One switch
for compiled graphs and fused regions, so both read it here."""
from __future__ import annotations

from .. import config

_mode = {"value": None}


def set_collectives(mode: str) -> None:
    """'in_graph' (default): collectives are part of compiled programs and of defer_and_fuse
    regions; 'skinny': one executable per collective, between compiled pieces or regions
    (for comparison)."""
    if mode not in ("in_graph", "skinny"):
        raise ValueError(f"torchtpu: collectives mode must be 'in_graph' or 'skinny', got {mode!r}")
    _mode["value"] = mode


def get_collectives() -> str:
    mode = _mode["value"] or config.read("collectives")
    if mode not in ("in_graph", "skinny"):
        raise ValueError(f"TORCHTPU_COLLECTIVES must be 'in_graph' or 'skinny', got {mode!r}")
    return mode
