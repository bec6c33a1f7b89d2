"""One chip per process under torchrun on TPU and GPU hosts, set up before JAX starts.

`torchrun --nproc-per-node N` starts N processes on a host, each meant to drive the chip of
its LOCAL_RANK (the CUDA idiom: `torch.tpu.set_device(local_rank)`). Left alone, each process's
XLA runtime would open every chip of the host: on TPU, libtpu lets one process hold a chip, so
the second process fails to start; on GPU, JAX preallocates most of every visible GPU's memory
in each process. So, before JAX's backend starts, a process of such a launch is given only its
own chip, with the settings JAX's own multi-process tests use for one chip per process
(jax/_src/test_multiprocess.py) and PyTorch/XLA sets in `configure_topology`:

- TPU: `TPU_VISIBLE_CHIPS=<local rank>`, `TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1`,
  `TPU_PROCESS_BOUNDS` (the host's chip grid: 2,2,1 for 4 chips, 4,2,1 for 8),
  `TPU_PROCESS_ADDRESSES` (one localhost port per local process), `TPU_PROCESS_PORT`,
  `CLOUD_TPU_TASK_ID=<local rank>`, `ALLOW_MULTIPLE_LIBTPU_LOAD=1`. Only for one host: a
  multi-host TPU job with several processes per host needs the other hosts' addresses, which
  the TPU VM's metadata holds; run one process per host there (`--nproc-per-node 1`, every
  chip a device of it), which JAX's distributed runtime configures itself.
- GPU: JAX's `jax_cuda_visible_devices=<local rank>` (the process's runtime opens that GPU only).

The process then sees one XLA device, and torchtpu numbers it as CUDA would: it is
`tpu:<local rank>` of `device_count() == LOCAL_WORLD_SIZE` devices, the others being its
neighbours' (runtime/placement.py). Nothing is set when the user set any of these variables,
on XLA:CPU (whose forced devices every process may share), for one process per host, or with
TORCHTPU_CHIP_PER_PROCESS=0. TORCHTPU_HOST_CHIPS ("tpu:4", "gpu:8") states the host's chips
where its device files (/dev/accel*, /dev/vfio/*, /dev/nvidia*) do not show them.
"""
from __future__ import annotations

import glob
import os

from .. import config

# a host's chip count -> its grid, as libtpu takes TPU_PROCESS_BOUNDS with one chip per process
_TPU_GRID = {1: "1,1,1", 2: "2,1,1", 4: "2,2,1", 8: "4,2,1"}
_TPU_BASE_PORT = 8476
_TPU_VARS = ("TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_ADDRESSES")

_slot: list = []   # (local rank, local world size) when this process was given one chip


def host_chips() -> tuple[str, int]:
    """("tpu" | "gpu" | "", how many) on this host, from its device files, or as
    TORCHTPU_HOST_CHIPS says ("tpu:4", "gpu:8": a container may show them under other names)."""
    said = config.read("host_chips")
    if said:
        kind, _, n = said.partition(":")
        return kind, int(n or 0)
    tpus = glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")
    if tpus:
        return "tpu", len(tpus)
    gpus = glob.glob("/dev/nvidia[0-9]*")
    return ("gpu", len(gpus)) if gpus else ("", 0)


def plan(environ, chips: tuple[str, int]) -> tuple[dict, dict]:
    """(environment variables, JAX config values) that give this process only its own chip;
    both empty when the launch needs none."""
    local_rank, local_world = environ.get("LOCAL_RANK"), environ.get("LOCAL_WORLD_SIZE")
    if not (local_rank and local_world and local_rank.isdigit() and local_world.isdigit()):
        return {}, {}
    rank, world = int(local_rank), int(local_world)
    kind, n = chips
    if world <= 1 or not config.read("chip_per_process", environ) \
            or environ.get("JAX_PLATFORMS", "").startswith("cpu") or rank >= n:
        return {}, {}
    nodes = int(environ.get("WORLD_SIZE", world) or world) // world
    if kind == "tpu" and not any(v in environ for v in _TPU_VARS) and nodes == 1 and n == world and n in _TPU_GRID:
        ports = [_TPU_BASE_PORT + i for i in range(world)]
        return {
            "TPU_VISIBLE_CHIPS": str(rank),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": _TPU_GRID[n],
            "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{p}" for p in ports),
            "TPU_PROCESS_PORT": str(ports[rank]),
            "CLOUD_TPU_TASK_ID": str(rank),
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        }, {}
    if kind == "gpu" and "CUDA_VISIBLE_DEVICES" not in environ and "JAX_CUDA_VISIBLE_DEVICES" not in environ:
        return {}, {"jax_cuda_visible_devices": str(rank)}
    return {}, {}


def configure(jax_config) -> None:
    """Give this process its own chip if its launch calls for it (before JAX's backend starts)."""
    env, cfg = plan(os.environ, host_chips())
    if not (env or cfg):
        return
    os.environ.update(env)
    for k, v in cfg.items():
        jax_config.update(k, v)
    _slot[:] = [int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])]


def slot() -> tuple[int, int] | None:
    """(local rank, local world size) when this process drives one chip of a host it shares."""
    return (_slot[0], _slot[1]) if _slot else None
