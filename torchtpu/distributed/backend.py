"""The c10d backend "tpu": a Python ProcessGroup whose collectives are XLA collectives.

Bring-up: the first "tpu" process group (the default group) starts the XLA
multi-process runtime with jax.distributed.initialize; rank 0 picks the
coordinator address and publishes it through the c10d store. On XLA:CPU the
cross-process collectives go through gloo. This must happen before JAX starts
its backends, i.e. before the first tpu operation in the process.

Collectives ("skinny"): each one is a jitted shard_map program over a mesh of
the group's devices, one device per process, cached per (collective, static
arguments) and, by jit, per shape/dtype. A tensor enters as its flat storage
buffer: the global array is the concatenation of every rank's flat buffer, each
rank's block is its own buffer, and the block each rank gets back is written
into its output tensor (directly as the new storage buffer when the output owns
its whole storage, else through copy_). Dispatch is asynchronous like every
torchtpu op; later ops are ordered by data dependence.

Matching: before launching a collective each rank posts its signature (the
collective's name, program and input shapes) to the group's c10d store and reads
its peers' for the same sequence number (four store round trips, ~0.1 ms on one
host; the issuing thread also waits there for its peers to reach the collective). Ranks that issued different
collectives (op or shape) all fail at once with an error naming each rank's
collective, instead of hanging in, or silently mixing, two different XLA
programs. A peer that has not posted within a grace period
(TORCHTPU_DIST_CHECK_GRACE, default 5 s, at most the group timeout) is not
waited for further: the collective launches and is verified when it completes
(if it never does, the timeout error says what each peer last issued).
TORCHTPU_DIST_CHECK=0 turns the check off.

Faults: a watchdog thread waits on every collective's result in order. If one
fails (a peer died: gloo reports the closed connection) or does not finish
within the process-group timeout (a peer hangs or never joined), it prints an
error naming the collective and ends the process (exit code 1), as NCCL's
watchdog does; TORCHTPU_DIST_ABORT=0 only records the error (raised by the
next collective or Work.wait()).
"""
from __future__ import annotations

import datetime
import functools
import json
import math
import os
import socket
import sys
import threading
import time
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from torch._C._distributed_c10d import _create_work_from_future

from ..runtime import jaxenv, storage, tensors, transfer
from . import fused

ReduceOp = dist.ReduceOp
_AXIS = "r"
_KEY = "torchtpu/jax_coordinator"


class TpuDistError(RuntimeError):
    """A collective failed or timed out (the message names it)."""


# ---------------------------------------------------------------------------- bring-up

_runtime = {"world": None, "rank": None}


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
            addr = os.environ.get("TORCHTPU_COORDINATOR_ADDRESS") or f"{_coordinator_host()}:{_free_port()}"
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
    # Workaround (core): runtime/jaxenv.device() takes jax.devices()[0], the global
    # device 0, which belongs to rank 0; each process must drive its own local device.
    jaxenv._device = jax.local_devices()[0]
    _runtime["world"], _runtime["rank"] = world, rank


def _device_of(global_rank: int):
    if _runtime["world"] in (None, 1):
        return jaxenv.device()
    for d in jax.devices():
        if d.process_index == global_rank:
            return d
    raise RuntimeError(f"torchtpu.distributed: no XLA device for rank {global_rank}")


# ---------------------------------------------------------------------------- watchdog


class _Watchdog:
    """Waits on every collective's outputs in issue order; fails loudly on error or timeout."""

    def __init__(self):
        self.queue: deque = deque()
        self.cv = threading.Condition()
        self.current = None  # (desc, t0, timeout, info) of the collective being waited on
        self.dispatching = None  # the same while the user's thread is inside the launch
        self.error: str | None = None
        self.abort = os.environ.get("TORCHTPU_DIST_ABORT", "1") != "0"
        threading.Thread(target=self._wait_loop, name="torchtpu-dist-waiter", daemon=True).start()
        threading.Thread(target=self._monitor_loop, name="torchtpu-dist-monitor", daemon=True).start()

    def add(self, desc: str, arrays, timeout: float, verify=None, info=None) -> None:
        """`verify()` (optional) runs once the outputs are ready and raises on a mismatch;
        `info()` (optional) says what the peers issued, for the timeout message."""
        with self.cv:
            self.queue.append((desc, time.monotonic(), timeout, arrays, verify, info))
            self.cv.notify()

    def drain(self) -> None:
        """Block until every collective issued so far has finished (or failed)."""
        while True:
            with self.cv:
                if not self.queue and self.current is None:
                    break
            time.sleep(0.0005)
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise TpuDistError(self.error)

    def _fail(self, msg: str) -> None:
        if self.error is not None:
            return
        self.error = msg
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
        if self.abort:
            # Like NCCL's watchdog: a failed or hung collective leaves the XLA runtime
            # unusable (and its exit barrier would wait for the dead peer), so end here.
            os._exit(1)

    def _wait_loop(self) -> None:
        while True:
            with self.cv:
                while not self.queue:
                    self.cv.wait()
                desc, t0, timeout, arrays, verify, info = self.queue.popleft()
                self.current = (desc, t0, timeout, info)
            try:
                for a in arrays:
                    a.block_until_ready()
            except Exception as e:  # noqa: BLE001 - reported, not swallowed
                self._fail(f"torchtpu.distributed: {desc} failed: {str(e).strip()}{_peers_said(info)}")
            else:
                if verify is not None:
                    try:
                        verify()
                    except TpuDistError as e:
                        self._fail(str(e))
                    except Exception:  # noqa: BLE001 - store unreachable: the next collective says so
                        pass
            with self.cv:
                self.current = None

    def _monitor_loop(self) -> None:
        while True:
            time.sleep(0.2)
            for cur in (self.dispatching, self.current):
                if cur is None or self.error is not None:
                    continue
                desc, t0, timeout, info = cur
                if time.monotonic() - t0 > timeout:
                    self._fail(
                        f"torchtpu.distributed: {desc} timed out after {timeout:.1f} s (process-group "
                        f"timeout): a peer process probably died, hangs, or issued a different collective"
                        f"{_peers_said(info)}"
                    )


def _peers_said(info) -> str:
    """info() in a helper thread, bounded in time (the store may be gone with its host)."""
    if info is None:
        return ""
    box: list = []

    def run():
        try:
            box.append(info())
        except Exception:  # noqa: BLE001 - diagnostics only
            pass

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(3.0)
    return f"; {box[0]}" if box and box[0] else ""


_watchdog_obj = None
_watchdog_lock = threading.Lock()


def _watchdog() -> _Watchdog:
    global _watchdog_obj
    if _watchdog_obj is None:
        with _watchdog_lock:
            if _watchdog_obj is None:
                _watchdog_obj = _Watchdog()
    return _watchdog_obj


# ---------------------------------------------------------------------------- tensors <-> flat buffers


def _owns_storage(t: torch.Tensor, entry) -> bool:
    return (
        t.storage_offset() == 0
        and t.numel() == entry.numel
        and jaxenv.to_jax_dtype(t.dtype) == entry.dtype
        and t.is_contiguous()
    )


def _flat_in(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a flat 1-D array on this process's device."""
    if t.device.type == "tpu":
        entry = storage.lookup(t)
        if _owns_storage(t, entry):
            return transfer.buffer(entry)
        return transfer.value(t).reshape(-1)
    return transfer.to_device_array(t.reshape(-1))


def _store(t: torch.Tensor, flat: jax.Array) -> None:
    """Write a flat result into tensor `t` (tpu or cpu), whatever its geometry."""
    if t.device.type == "tpu":
        entry = storage.lookup(t)
        if _owns_storage(t, entry):
            entry.buf = flat
        else:
            t.copy_(tensors.empty(t.shape, t.dtype, flat))
    else:
        with torch.no_grad():
            t.copy_(jaxenv.numpy_to_torch(np.asarray(flat)).reshape(t.shape))


def _dtype_of(a) -> np.dtype:
    return jnp.dtype(a.dtype)


# ---------------------------------------------------------------------------- program bodies
# Each body sees this rank's flat block(s) and returns flat block(s); `w` is the group size.


def _reduce_kind(op, dtype) -> str:
    if op == ReduceOp.SUM:
        k = "sum"
    elif op == ReduceOp.AVG:
        k = "avg"
    elif op == ReduceOp.MAX:
        k = "max"
    elif op == ReduceOp.MIN:
        k = "min"
    elif op == ReduceOp.PRODUCT:
        k = "prod"
    elif op == ReduceOp.BAND:
        k = "band"
    elif op == ReduceOp.BOR:
        k = "bor"
    elif op == ReduceOp.BXOR:
        k = "bxor"
    else:
        raise ValueError(f"torchtpu.distributed: reduce op {op} is not supported")
    return _for_dtype(k, dtype)


# the reduce-op names functional collectives (_c10d_functional) pass
_NAMED = {"sum": "sum", "avg": "avg", "max": "max", "min": "min", "product": "prod",
          "band": "band", "bor": "bor", "bxor": "bxor"}


def reduce_kind_named(name: str, dtype) -> str:
    """_reduce_kind for a functional collective's reduce-op string ("sum", "product", ...)."""
    k = _NAMED.get(name.lower())
    if k is None:
        raise NotImplementedError(f"torchtpu.distributed: reduce op {name!r} is not supported")
    return _for_dtype(k, dtype)


def _for_dtype(k: str, dtype) -> str:
    # bool tensors reduce as logic: sum/avg/bor are "any", prod/band "all"
    if dtype == np.bool_:
        k = {"sum": "max", "avg": "max", "prod": "min", "band": "min", "bor": "max"}.get(k, k)
    return k


def _combine(stacked, kind):
    """Reduce a (w, n) stack of every rank's block over its first axis."""
    if kind in ("sum", "avg"):
        return jnp.sum(stacked, axis=0, dtype=stacked.dtype)
    if kind == "max":
        return jnp.max(stacked, axis=0)
    if kind == "min":
        return jnp.min(stacked, axis=0)
    if kind == "prod":
        return jnp.prod(stacked, axis=0, dtype=stacked.dtype)
    fn = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[kind]
    out = stacked[0]
    for i in range(1, stacked.shape[0]):
        out = fn(out, stacked[i])
    return out


def _avg(x, w):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return (x / w).astype(x.dtype)
    return x // w


def _allreduce_one(x, kind, w):
    if x.dtype == jnp.bool_:
        y = x.astype(jnp.uint8)
        return (jax.lax.pmax(y, _AXIS) if kind == "max" else
                jax.lax.pmin(y, _AXIS) if kind == "min" else
                _combine(jax.lax.all_gather(y, _AXIS), "bxor")).astype(jnp.bool_)
    if kind == "sum":
        return jax.lax.psum(x, _AXIS)
    if kind == "avg":
        return _avg(jax.lax.psum(x, _AXIS), w)
    if kind == "max":
        return jax.lax.pmax(x, _AXIS)
    if kind == "min":
        return jax.lax.pmin(x, _AXIS)
    return _combine(jax.lax.all_gather(x, _AXIS), kind)


def _body_allreduce(kind, w):
    return lambda *xs: tuple(_allreduce_one(x, kind, w) for x in xs)


def _body_broadcast(src, w):
    return lambda *xs: tuple(jax.lax.all_gather(x, _AXIS)[src] for x in xs)


def _body_allgather(w):
    return lambda *xs: tuple(jax.lax.all_gather(x, _AXIS, tiled=True) for x in xs)


def _reduce_scatter_one(x, kind, w):
    k = x.shape[0] // w
    if kind in ("sum", "avg") and x.dtype != jnp.bool_:
        y = jax.lax.psum_scatter(x, _AXIS, scatter_dimension=0, tiled=True)
        return _avg(y, w) if kind == "avg" else y
    # every rank's chunk for me, then combine here
    y = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    parts = jax.lax.all_to_all(y, _AXIS, 0, 0, tiled=True).reshape(w, k)
    out = _combine(parts, kind)
    return out.astype(x.dtype)


def _body_reduce_scatter(kind, w):
    return lambda *xs: tuple(_reduce_scatter_one(x, kind, w) for x in xs)


def _body_alltoall(w):
    return lambda x: jax.lax.all_to_all(x, _AXIS, 0, 0, tiled=True)


@functools.lru_cache(maxsize=256)
def _pad_chunks(send_sizes, m):
    """Local (no collective): this rank's chunks, each padded to m elements, back to back."""
    off = np.concatenate([[0], np.cumsum(send_sizes)]).astype(int)

    @jax.jit
    def pad(x):
        return jnp.concatenate([jnp.pad(x[off[j]:off[j + 1]], (0, m - send_sizes[j])) for j in range(len(send_sizes))])

    return pad


@functools.lru_cache(maxsize=256)
def _unpad_chunks(recv_sizes, m):
    """Local: the first recv_sizes[j] elements of each m-element chunk, back to back."""

    @jax.jit
    def unpad(y):
        y = y.reshape(len(recv_sizes), m)
        return jnp.concatenate([y[j, : recv_sizes[j]] for j in range(len(recv_sizes))])

    return unpad


def _body_scatter(src, w):
    def body(x):
        k = x.shape[0] // w
        return jax.lax.all_to_all(x, _AXIS, 0, 0, tiled=True)[src * k:(src + 1) * k]

    return body


def _body_p2p(dirs):
    """One slot per message between a pair of ranks: direction 0 is mesh index 0 -> 1."""
    perms = {0: [(0, 1)], 1: [(1, 0)]}
    return lambda *xs: tuple(jax.lax.ppermute(x, _AXIS, perms[d]) for x, d in zip(xs, dirs))


class _P2PWork(dist._Work):
    """A queued send/recv: waiting runs the process group's queued point-to-point messages."""

    def __init__(self, pg, tensors):
        super().__init__()
        self._pg = pg
        self._tensors = tensors

    def wait(self, timeout=None):
        self._pg._flush_p2p()
        return True

    def is_completed(self):
        return not self._pg._p2p

    def get_future(self):
        self._pg._flush_p2p()
        fut = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut


# ---------------------------------------------------------------------------- the process group


def _shape_str(ts) -> str:
    return ", ".join(f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}" for t in ts)


def _detail(key) -> str:
    """The program's static arguments, as a user reads them (reduction, root)."""
    if key[0] in ("allreduce", "reduce_scatter"):
        return f"({key[1]})"
    if key[0] in ("broadcast", "scatter"):
        return f"(src {key[1]})"
    return ""


class TpuProcessGroup(dist.ProcessGroup):
    """A process group over one XLA device per process; collectives are XLA programs."""

    def __init__(self, rank: int, size: int, global_ranks, timeout: datetime.timedelta, name: str = "",
                 store=None):
        super().__init__(rank, size)
        self._store = store if size > 1 and os.environ.get("TORCHTPU_DIST_CHECK", "1") != "0" else None
        self._grace = min(float(os.environ.get("TORCHTPU_DIST_CHECK_GRACE", "5")), timeout.total_seconds())
        self._cseq = 0  # group-wide collectives issued (point-to-point ones are not counted)
        self._rank = rank
        self._size = size
        self._global_ranks = list(global_ranks)
        self._timeout = timeout.total_seconds()
        self._label = name
        self._seq = 0
        self._mesh = None
        self._sharding = None
        self._fns: dict = {}
        self._pair_meshes: dict = {}
        self._exes: dict = {}  # (program key, mesh, input avals) -> compiled executable
        self._p2p: list = []  # queued (kind, peer, tensor, flat value for sends)

    # -- identity
    def getBackendName(self) -> str:
        return "tpu"

    # this Python process group is its own backend for every device type
    def _get_backend(self, device=None):
        return self

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_coalescing(self) -> bool:
        return False

    # old-style coalescing: the collectives inside run one by one as they are issued
    def _start_coalescing(self, device=None) -> None:
        pass

    def _end_coalescing(self, device=None):
        self._flush_p2p()
        return self._work(None)

    # a Python process group keeps its own name (the C++ base asks its backends for it)
    def setGroupName(self, name) -> None:
        self._group_name = name

    def getGroupName(self):
        return getattr(self, "_group_name", self._label)

    def setGroupDesc(self, desc) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self._rank}, size={self._size}, ranks={self._global_ranks})"

    # -- machinery
    def _mesh_and_sharding(self):
        if self._mesh is None:
            devs = [_device_of(r) for r in self._global_ranks]
            self._mesh = Mesh(np.array(devs), (_AXIS,))
            self._sharding = NamedSharding(self._mesh, P(_AXIS))
        return self._mesh, self._sharding

    def _program(self, key, make_body, n_in: int, mesh=None):
        fn = self._fns.get(key)
        if fn is None:
            mesh = mesh or self._mesh_and_sharding()[0]
            sm = jax.shard_map(make_body(), mesh=mesh, in_specs=(P(_AXIS),) * n_in, out_specs=P(_AXIS),
                               check_vma=False)
            fn = self._fns[key] = jax.jit(sm)
        return fn

    def _run(self, name: str, key, make_body, flats, ts, mesh=None, sharding=None, width=None):
        """Run a collective program on this rank's flat blocks; returns this rank's out blocks."""
        _watchdog().check()
        from ..eager import deferred

        deferred.flush_collectives("collective")
        if self._p2p and mesh is None:
            self._flush_p2p()  # queued point-to-point messages go first, in program order
        self._seq += 1
        desc = (f"collective {name} (rank {self._rank} of {self._size}, seq {self._seq}, "
                f"tensors [{_shape_str(ts)}])")
        verify = info = None
        if mesh is None:
            mesh, sharding = self._mesh_and_sharding()
            if self._store is not None:
                verify, info = self._match(name, key, flats, ts, desc)
        w = width or self._size
        fn = self._program(key, make_body, len(flats), mesh)
        glob = [jax.make_array_from_single_device_arrays((w * f.shape[0],), sharding, [f]) for f in flats]
        wd = _watchdog()
        # compiled ahead of time, so that the watched launch below is only the launch
        sig = (key, id(mesh), tuple((f.shape, f.dtype) for f in flats))
        exe = self._exes.get(sig)
        if exe is None:
            exe = self._exes[sig] = fn.lower(*glob).compile()
        # a launch can itself block (XLA:CPU runs a first call inline): watch it too
        wd.dispatching = (desc, time.monotonic(), self._timeout, info)
        try:
            outs = exe(*glob)
        except Exception as e:
            msg = f"torchtpu.distributed: {desc} failed: {str(e).strip()}"
            wd._fail(msg)  # ends the process unless TORCHTPU_DIST_ABORT=0
            raise TpuDistError(msg) from e
        finally:
            wd.dispatching = None
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        local = [o.addressable_data(0) for o in outs]
        wd.add(desc, local, self._timeout, verify, info)
        return local

    # -- matching: every rank issues the same collective (op, program, shapes) at each step
    def _sig_key(self, seq: int, rank: int) -> str:
        return f"torchtpu/sig/{seq}/{rank}"

    def _match(self, name, key, flats, ts, desc):
        """Post this rank's signature for the next collective and compare with the peers'.

        Returns (verify, info) for the watchdog: verify is None when every peer's signature
        was seen and matched here; else it checks them once the collective has completed."""
        store, me = self._store, self._rank
        self._cseq += 1
        seq = self._cseq
        prog = f"{name} {key!r} " + " ".join(f"{str(f.dtype)}[{f.shape[0]}]" for f in flats)
        mine = json.dumps(dict(prog=prog, what=f"{name}{_detail(key)} on [{_shape_str(ts)}]"))
        peers = [self._sig_key(seq, r) for r in range(self._size) if r != me]
        try:
            store.set(self._sig_key(seq, me), mine)
            if seq > 2:
                store.delete_key(self._sig_key(seq - 2, me))  # every peer has read it (it posted seq - 1)
        except Exception as e:  # noqa: BLE001
            msg = f"torchtpu.distributed: {desc}: the c10d store is unreachable ({e}); a peer probably died"
            _watchdog()._fail(msg)
            raise TpuDistError(msg) from e

        def info() -> str:
            return self._peer_report(seq)

        def verify(wait: float = 0.0) -> bool:
            if wait > 0:
                try:
                    store.wait(peers, datetime.timedelta(seconds=wait))
                except Exception:  # noqa: BLE001 - not all posted within the grace period
                    return False
            elif not store.check(peers):
                return False
            sigs = {me: json.loads(mine)}
            for r, v in zip([r for r in range(self._size) if r != me], store.multi_get(peers)):
                sigs[r] = json.loads(v)
            if any(sigs[r]["prog"] != sigs[me]["prog"] for r in sigs):
                self._mismatch(seq, desc, sigs)
            return True

        try:
            if verify(self._grace):
                return None, info
        except TpuDistError:
            raise
        except Exception:  # noqa: BLE001 - store trouble: let the collective itself decide
            pass
        return (lambda: verify()), info

    def _exchange(self, prog: str, what: str) -> tuple[int, dict]:
        """Post this rank's next program (a fused region's or a compiled graph's collectives)
        under the group's next collective number and wait for every peer's; returns the
        number and {rank: {"prog", "what"}} for every rank. A peer that never posts ends in
        the process-group timeout with an error naming what this rank was about to run."""
        wd = _watchdog()
        wd.check()
        store, me = self._store, self._rank
        self._cseq += 1
        seq = self._cseq
        mine = dict(prog=prog, what=what)
        others = [r for r in range(self._size) if r != me]
        peers = [self._sig_key(seq, r) for r in others]
        desc = f"{what} (rank {me} of {self._size}, collective #{seq})"
        wd.dispatching = (desc, time.monotonic(), self._timeout, lambda: self._peer_report(seq))
        try:
            store.set(self._sig_key(seq, me), json.dumps(mine))
            if seq > 2:
                store.delete_key(self._sig_key(seq - 2, me))  # every peer has read it (it posted seq - 1)
            store.wait(peers, datetime.timedelta(seconds=self._timeout))
            sigs = {r: json.loads(v) for r, v in zip(others, store.multi_get(peers))}
        except Exception as e:  # noqa: BLE001
            msg = (f"torchtpu.distributed: {desc}: the peers did not post their next collective within the "
                   f"process-group timeout ({e}); a peer probably died or hangs")
            wd._fail(msg)  # ends the process unless TORCHTPU_DIST_ABORT=0
            raise TpuDistError(msg) from e
        finally:
            wd.dispatching = None
        sigs[me] = mine
        return seq, sigs

    def check_program(self, what: str, digest: str) -> None:
        """Before a compiled SPMD program first runs: every rank must run the same
        collectives (a rank-dependent branch in compiled code compiles another graph)."""
        if self._store is None:  # TORCHTPU_DIST_CHECK=0
            return
        prog = f"GRAPH {digest}"
        seq, sigs = self._exchange(prog, what)
        if any(v["prog"] != prog for v in sigs.values()):
            self._mismatch(seq, f"{what} (rank {self._rank} of {self._size})", sigs)

    def _mismatch(self, seq, desc, sigs):
        lines = "; ".join(f"rank {r} issued {sigs[r]['what']}" for r in sorted(sigs))
        msg = (f"torchtpu.distributed: {desc}: the ranks of group {self.getGroupName()!r} issued different "
               f"collectives at collective #{seq}: {lines}. Every rank of a group must issue the same "
               "collectives, in the same order, on tensors of the same shapes and dtypes.")
        # let every peer read this rank's signature before a process (maybe the store's host) ends
        try:
            self._store.set(f"torchtpu/seen/{seq}/{self._rank}", "1")
            self._store.wait([f"torchtpu/seen/{seq}/{r}" for r in sigs], datetime.timedelta(seconds=3))
        except Exception:  # noqa: BLE001
            pass
        _watchdog()._fail(msg)  # ends the process unless TORCHTPU_DIST_ABORT=0
        raise TpuDistError(msg)

    def _peer_report(self, seq: int) -> str:
        """What each peer last posted, for an error message (reads the store, never waits)."""
        out = []
        for r in range(self._size):
            if r == self._rank:
                continue
            for s in (seq, seq - 1):
                k = self._sig_key(s, r)
                if s > 0 and self._store.check([k]):
                    what = json.loads(self._store.get(k))["what"]
                    out.append(f"rank {r} issued {what} as collective #{s}" + ("" if s == seq else
                                                                              " and nothing since"))
                    break
            else:
                out.append(f"rank {r} has not issued collective #{seq}")
        return f"collective #{seq} of group {self.getGroupName()!r} here; " + ", ".join(out) if out else ""

    def _work(self, result, block: bool = False):
        if block:
            _watchdog().drain()
        fut = torch.futures.Future()
        fut.set_result(result)
        return _create_work_from_future(fut)

    # -- collectives
    def allreduce(self, tensors, opts=None):
        op = ReduceOp.SUM if opts is None else opts.reduceOp
        ts = [t for t in tensors if t.numel()]
        if ts:
            groups: dict = {}
            for t in ts:
                groups.setdefault(t.dtype, []).append(t)
            for dt, grp in groups.items():
                kind = _reduce_kind(op, jaxenv.to_jax_dtype(dt))
                w = self._size
                key = ("allreduce", kind, len(grp))
                if fused.recording(self) and fused.record_written(
                        self, "ALLREDUCE", key, lambda: _body_allreduce(kind, w), grp, grp):
                    continue  # in the defer_and_fuse region (DDP's bucket all-reduce)
                outs = self._run("ALLREDUCE", key, lambda: _body_allreduce(kind, w),
                                 [_flat_in(t) for t in grp], grp)
                for t, o in zip(grp, outs):
                    _store(t, o)
        return self._work(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        # an allreduce whose result only the root keeps
        (t,) = tensors
        kind = _reduce_kind(opts.reduceOp, jaxenv.to_jax_dtype(t.dtype))
        if t.numel():
            w = self._size
            (o,) = self._run("REDUCE", ("allreduce", kind, 1), lambda: _body_allreduce(kind, w), [_flat_in(t)], [t])
            if self._rank == opts.rootRank:
                _store(t, o)
        return self._work([t])

    def broadcast(self, tensors, opts):
        src = opts.rootRank
        ts = [t for t in tensors if t.numel()]
        if ts:
            w = self._size
            if fused.recording(self) and fused.record_written(
                    self, "BROADCAST", ("broadcast", src, len(ts)), lambda: _body_broadcast(src, w), ts, ts):
                return self._work(list(tensors))
            outs = self._run("BROADCAST", ("broadcast", src, len(ts)), lambda: _body_broadcast(src, w),
                             [_flat_in(t) for t in ts], ts)
            if self._rank != src:
                for t, o in zip(ts, outs):
                    _store(t, o)
        return self._work(list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self._size:
                raise ValueError(f"torchtpu.distributed: all_gather needs {self._size} output tensors, got {len(outs)}")
            if t.numel():
                w = self._size
                (g,) = self._run("ALLGATHER", ("allgather", 1), lambda: _body_allgather(w), [_flat_in(t)], [t])
                n = t.numel()
                for i, o in enumerate(outs):
                    _store(o, g[i * n:(i + 1) * n])
        return self._work(output_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def _allgather_base(self, output, input, opts=None):
        if input.numel() * self._size != output.numel():
            raise ValueError(
                f"torchtpu.distributed: all_gather_into_tensor: output has {output.numel()} elements, "
                f"expected {self._size} x {input.numel()}")
        if input.numel():
            w = self._size
            if fused.recording(self) and fused.record_written(
                    self, "ALLGATHER_BASE", ("allgather", 1), lambda: _body_allgather(w), [input], [output]):
                return self._work([output])  # in the defer_and_fuse region (FSDP2's all-gather)
            (g,) = self._run("ALLGATHER_BASE", ("allgather", 1), lambda: _body_allgather(w), [_flat_in(input)],
                             [input])
            _store(output, g)
        return self._work([output])

    all_gather_single = _allgather_base

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return self._work(list(outputs))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def _reduce_scatter_flat(self, name, output, flat_in, ts, op):
        kind = _reduce_kind(op, _dtype_of(flat_in))
        w = self._size
        (o,) = self._run(name, ("reduce_scatter", kind, 1), lambda: _body_reduce_scatter(kind, w), [flat_in], ts)
        _store(output, o)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = ReduceOp.SUM if opts is None else opts.reduceOp
        for out, ins in zip(output_tensors, input_lists):
            if len(ins) != self._size:
                raise ValueError(f"torchtpu.distributed: reduce_scatter needs {self._size} inputs, got {len(ins)}")
            if out.numel():
                flat = jnp.concatenate([_flat_in(t) for t in ins])
                self._reduce_scatter_flat("REDUCE_SCATTER", out, flat, ins, op)
        return self._work(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = ReduceOp.SUM if opts is None else opts.reduceOp
        if output.numel() * self._size != input.numel():
            raise ValueError(
                f"torchtpu.distributed: reduce_scatter_tensor: input has {input.numel()} elements, "
                f"expected {self._size} x {output.numel()}")
        if output.numel():
            kind = _reduce_kind(op, jaxenv.to_jax_dtype(input.dtype))
            w = self._size
            if not (fused.recording(self) and fused.record_written(
                    self, "REDUCE_SCATTER_BASE", ("reduce_scatter", kind, 1), lambda: _body_reduce_scatter(kind, w),
                    [input], [output])):
                self._reduce_scatter_flat("REDUCE_SCATTER_BASE", output, _flat_in(input), [input], op)
        return self._work([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return self._work(list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _alltoall_flat(self, name, flat, send, recv, ts):
        """send/recv: element counts per peer (this rank's)."""
        w = self._size
        even = len(set(send)) == 1 and len(set(recv)) == 1 and send[0] == recv[0]
        # The collective program must be the same on every rank: uneven chunks are padded
        # here to the largest chunk anywhere in the group (agreed first), and cut after.
        m = send[0] if even else self._max_over_group(max(max(send), max(recv)))
        if not even:
            flat = _pad_chunks(tuple(int(v) for v in send), m)(flat)
        (o,) = self._run(name, ("alltoall",), lambda: _body_alltoall(w), [flat], ts)
        if not even:
            o = _unpad_chunks(tuple(int(v) for v in recv), m)(o)
        return o

    def _max_over_group(self, v: int) -> int:
        x = jax.device_put(np.array([v], dtype=np.int64), jaxenv.device())
        w = self._size
        (o,) = self._run("ALLREDUCE(max, split sizes)", ("allreduce", "max", 1), lambda: _body_allreduce("max", w),
                         [x], [])
        return int(np.asarray(o)[0])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        w = self._size
        if output.numel() == 0 and input.numel() == 0 and not output_split_sizes and not input_split_sizes:
            return self._work([output])
        inner_in = math.prod(input.shape[1:]) if input.dim() else 1
        inner_out = math.prod(output.shape[1:]) if output.dim() else 1
        if input_split_sizes:
            send = [s * inner_in for s in input_split_sizes]
        else:
            send = [input.numel() // w] * w
        if output_split_sizes:
            recv = [s * inner_out for s in output_split_sizes]
        else:
            recv = [output.numel() // w] * w
        if sum(send) != input.numel() or sum(recv) != output.numel():
            raise ValueError("torchtpu.distributed: all_to_all_single split sizes do not add up to the tensor sizes")
        o = self._alltoall_flat("ALLTOALL_BASE", _flat_in(input), send, recv, [input])
        _store(output, o)
        return self._work([output])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        send = [t.numel() for t in input_tensors]
        recv = [t.numel() for t in output_tensors]
        flat = jnp.concatenate([_flat_in(t) for t in input_tensors])
        o = self._alltoall_flat("ALLTOALL", flat, send, recv, input_tensors)
        off = 0
        for t in output_tensors:
            _store(t, o[off:off + t.numel()])
            off += t.numel()
        return self._work(output_tensors)

    def gather(self, output_tensors, input_tensors, opts):
        (t,) = input_tensors
        dst = opts.rootRank
        if t.numel():
            w = self._size
            (g,) = self._run("GATHER", ("allgather", 1), lambda: _body_allgather(w), [_flat_in(t)], [t])
            if self._rank == dst:
                n = t.numel()
                for i, o in enumerate(output_tensors[0]):
                    _store(o, g[i * n:(i + 1) * n])
        return self._work(output_tensors[0] if output_tensors else [])

    def scatter(self, output_tensors, input_tensors, opts):
        (t,) = output_tensors
        src = opts.rootRank
        if t.numel():
            w = self._size
            if self._rank == src:
                flat = jnp.concatenate([_flat_in(x) for x in input_tensors[0]])
            else:
                flat = jax.device_put(np.zeros(w * t.numel(), jaxenv.to_jax_dtype(t.dtype)), jaxenv.device())
            (o,) = self._run("SCATTER", ("scatter", src), lambda: _body_scatter(src, w), [flat], [t])
            _store(t, o)
        return self._work([t])

    def barrier(self, opts=None):
        x = jax.device_put(np.zeros(1, np.int32), jaxenv.device())
        w = self._size
        self._run("BARRIER", ("allreduce", "sum", 1), lambda: _body_allreduce("sum", w), [x], [])
        return self._work(None, block=True)

    # -- point to point
    # isend/irecv are queued and run when one of their Works is waited on (dist.send and
    # dist.recv wait at once), or before the next collective. The queue is run as one
    # 2-device program per peer, pairs taken in (lower rank, higher rank) order, each
    # program carrying every queued message of that pair in both directions, matched in
    # issue order per direction (as MPI matches). So a ring exchange issued as
    # [isend(next), irecv(prev)] on every rank (batch_isend_irecv) cannot deadlock.

    def send(self, tensors, dstRank, tag=0):
        (t,) = tensors
        self._p2p.append(("send", dstRank, t, _flat_in(t) if t.numel() else None))
        return _P2PWork(self, [t])

    def recv(self, tensors, srcRank, tag=0):
        (t,) = tensors
        self._p2p.append(("recv", srcRank, t, None))
        return _P2PWork(self, [t])

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("torchtpu.distributed: recv from any source is not supported; name the source rank")

    def _pair_mesh(self, lo: int, hi: int):
        ms = self._pair_meshes.get((lo, hi))
        if ms is None:
            mesh = Mesh(np.array([_device_of(self._global_ranks[lo]), _device_of(self._global_ranks[hi])]), (_AXIS,))
            ms = self._pair_meshes[(lo, hi)] = (mesh, NamedSharding(mesh, P(_AXIS)))
        return ms

    def _flush_p2p(self) -> None:
        if not self._p2p:
            return
        pending, self._p2p = self._p2p, []
        me = self._rank
        for peer in sorted({op[1] for op in pending}):
            ops = [op for op in pending if op[1] == peer and op[2].numel()]
            if not ops:
                continue
            lo, hi = min(me, peer), max(me, peer)
            sends = [op for op in ops if op[0] == "send"]
            recvs = [op for op in ops if op[0] == "recv"]
            # slots of lo->hi first, then hi->lo; each slot: (direction, numel, dtype)
            up, down = (sends, recvs) if me == lo else (recvs, sends)
            slots = [(0, op[2].numel(), str(op[2].dtype)) for op in up] + [(1, op[2].numel(), str(op[2].dtype))
                                                                         for op in down]
            flats = []
            for op in up + down:
                if op[0] == "send":
                    flats.append(op[3])
                else:
                    flats.append(jax.device_put(np.zeros(op[2].numel(), jaxenv.to_jax_dtype(op[2].dtype)),
                                                jaxenv.device()))
            mesh, sh = self._pair_mesh(lo, hi)
            dirs = tuple(d for d, _, _ in slots)
            desc = f"P2P(with rank {peer}: {len(sends)} send, {len(recvs)} recv)"
            outs = self._run(desc, ("p2p", lo, hi, dirs), lambda: _body_p2p(dirs), flats,
                             [op[2] for op in up + down], mesh=mesh, sharding=sh, width=2)
            for op, o in zip(up + down, outs):
                if op[0] == "recv":
                    _store(op[2], o)

    # -- lifecycle
    def abort(self):
        pass

    def shutdown(self):
        pass


def create(backend_opts, pg_options=None):
    """The c10d creator (extended API): brings up the XLA runtime on the first call."""
    rank, size = backend_opts.group_rank, backend_opts.group_size
    ranks = list(backend_opts.global_ranks_in_group) or list(range(size))
    timeout = backend_opts.timeout
    if _runtime["world"] is None:
        # the first group is the default (world) group: its ranks are the global ranks
        bring_up(backend_opts.store, rank, size, timeout)
    from . import fused

    fused.install()
    return TpuProcessGroup(rank, size, ranks, timeout, name=str(backend_opts.group_id), store=backend_opts.store)
