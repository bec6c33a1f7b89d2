"""torch.distributed on "tpu": the c10d backend "tpu".

    import torch.distributed as dist, torchtpu
    dist.init_process_group("tpu")        # under torchrun (env://), before the first tpu op
    model = DDP(model.to("tpu"))

Each process drives one XLA device. `init_process_group("tpu")` brings up the XLA
multi-process runtime (jax.distributed) itself; rank 0 publishes the coordinator
address through the c10d store, so no extra environment variables are needed.
Every collective runs as one compiled XLA program over the group's devices
("skinny" collectives: one executable per collective signature, cached).

This module only registers the backend (cheap, done at `import torchtpu`); the
implementation in `.backend` is imported when a "tpu" process group is created.
"""
from __future__ import annotations

import torch.distributed as _dist

BACKEND = "tpu"


def _create(backend_opts, pg_options):
    from .backend import create

    return create(backend_opts, pg_options)


def register() -> None:
    """Register the c10d backend "tpu" (idempotent)."""
    if not _dist.is_available():
        return
    if BACKEND in _dist.Backend.backend_list and BACKEND.upper() in _dist.Backend._plugins:
        return
    _dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[BACKEND])


register()
