"""Bring-up: starting the XLA multi-process runtime for a process group.

The first "tpu" process group (the default group) starts it with
jax.distributed.initialize; rank 0 picks the coordinator address and publishes it
through the c10d store, so torchrun's environment is all that is needed. On XLA:CPU
the cross-process collectives go through gloo. This must happen before JAX starts its
backends, i.e. before the first tpu operation in the process.
"""
from __future__ import annotations

import datetime
import os
import socket

import jax

from .. import config
from ..runtime import chips, jaxenv, placement

_KEY = "torchtpu/jax_coordinator"
_runtime = {"world": None, "rank": None, "devices": {}}


def is_up() -> bool:
    return _runtime["world"] is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _coordinator_host() -> str:
    host = os.environ.get("MASTER_ADDR")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def bring_up(store, rank: int, world: int, timeout: datetime.timedelta) -> None:
    """Start the XLA multi-process runtime for `world` processes (idempotent)."""
    from jax._src import xla_bridge

    if _runtime["world"] is not None:
        if (_runtime["world"], _runtime["rank"]) != (world, rank):
            raise RuntimeError(
                f"torchtpu.distributed: the XLA runtime is already up as rank {_runtime['rank']} of "
                f"{_runtime['world']}; it cannot be restarted as rank {rank} of {world} in this process"
            )
        return
    if world > 1 and not jax.distributed.is_initialized():
        if xla_bridge.backends_are_initialized():
            raise RuntimeError(
                "torchtpu.distributed: init_process_group('tpu') must run before the first tpu "
                "operation in the process: the XLA runtime has already started single-process "
                "(a tensor was moved to or created on 'tpu' earlier). Call "
                "dist.init_process_group('tpu') right after `import torchtpu`."
            )
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if rank == 0:
            addr = config.read("coordinator_address") or f"{_coordinator_host()}:{_free_port()}"
            store.set(_KEY, addr)
        else:
            addr = store.get(_KEY).decode()
        secs = max(1, int(timeout.total_seconds()))
        jax.distributed.initialize(
            coordinator_address=addr,
            num_processes=world,
            process_id=rank,
            initialization_timeout=secs,
            # a dead peer is normally reported at once by the collective itself (closed
            # connection); the heartbeat is the backstop when no collective is running
            heartbeat_timeout_seconds=max(10, min(100, secs)),
        )
    # Each process drives its own local devices (jax.devices()[0] belongs to rank 0); its
    # collectives run on one of them, its home device, and every rank must know every other's
    # to build the same mesh: the choice is published through the c10d store.
    home = _home_index(placement.count())
    dev = placement.jax_device(home)
    jaxenv.set_home(dev)
    placement.set_current(home)
    if world > 1:
        store.set(f"{_KEY}/device/{rank}", str(dev.id))
        by_id = {d.id: d for d in jax.devices()}
        _runtime["devices"] = {r: by_id[int(store.get(f"{_KEY}/device/{r}").decode())] for r in range(world)}
    _runtime["world"], _runtime["rank"] = world, rank


def _home_index(local: int) -> int:
    """The local device a process's collectives run on: the current device if the program set
    one (`torch.tpu.set_device(local_rank)` before init_process_group, as CUDA programs do),
    else, with several local devices under torchrun, its LOCAL_RANK's, else tpu:0."""
    if placement.chosen():
        return placement.current()
    if chips.slot() is not None:  # given its own chip (runtime/chips.py): it is that one
        return chips.slot()[0]
    local_rank = os.environ.get("LOCAL_RANK")
    if local > 1 and local_rank is not None and local_rank.isdigit():
        return int(local_rank) % local
    return 0


def device_of(global_rank: int):
    """The XLA device of a global rank (this process's own in a world of one)."""
    if _runtime["world"] in (None, 1):
        return jaxenv.device()
    found = _runtime["devices"].get(global_rank)
    if found is None:
        raise RuntimeError(f"torchtpu.distributed: no XLA device for rank {global_rank}")
    return found
