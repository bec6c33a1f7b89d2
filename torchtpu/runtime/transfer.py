"""Host <-> device transfers and reading a tensor's value out of its storage."""
from __future__ import annotations

import atexit
import collections
import functools
import math
import os
import queue
import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import metrics
from . import geometry, inflight, leaf, pending, pinned, placement, storage, sync_debug
from .jaxenv import _BITCAST_VIA, numpy_to_torch, to_jax_dtype, torch_to_numpy


@functools.partial(jax.jit, static_argnums=(1,))
def _read_static(buf, lf):
    return leaf.read((buf,), lf)


@functools.partial(jax.jit, static_argnums=(1,))
def _read_at(buf, lf, offset):
    return leaf.read((buf,), lf, offset)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros(numel, dtype):
    return jnp.zeros((numel,), dtype)


def buffer(entry: storage.Entry):
    """The storage's concrete buffer: materializes a deferred value, zeros if never written."""
    b = entry.buf
    if b is None:
        if entry.index:
            with jax.default_device(placement.jax_device(entry.index)):
                entry.buf = b = _zeros(entry.numel, entry.dtype)
        else:
            entry.buf = b = _zeros(entry.numel, entry.dtype)
    elif not isinstance(b, jax.Array):
        b = pending.concrete(entry, "host_read")
    return b


def value(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a jax.Array of its shape (a gather for strided views)."""
    entry = storage.lookup(t)
    buf = buffer(entry)
    lf = leaf.leaf_of(t, 0, offsets := [])
    if offsets:  # a nonzero offset is a runtime argument (one program for all rows)
        return _read_at(buf, lf, np.int64(offsets[0]))
    if not lf.flags and math.prod(lf.shape) == entry.numel and lf.dtype == entry.dtype \
            and geometry.is_contiguous(lf.shape, lf.stride):
        return buf.reshape(lf.shape)
    return _read_static(buf, lf)


def _host_value(t: torch.Tensor) -> np.ndarray:
    """The tensor's value on the host. Cut out of its storage buffer on the host when the
    buffer is not much bigger than the tensor: any device-side op (even a reshape) would
    queue behind every program already dispatched, so reading a loss after launching the
    backward and optimizer programs would wait for them all; the buffer itself is ready as
    soon as the program that wrote it is done."""
    if _copies:
        wait_host_copies()  # one in-order stream: earlier non-blocking copies land first
    entry = storage.lookup(t)
    dt = to_jax_dtype(t.dtype)
    numel = math.prod(t.shape)
    if dt == entry.dtype and not leaf.flags_of(t) \
            and entry.numel <= max(4 * numel, 1 << 16):
        flat = np.asarray(buffer(entry))
        if numel == entry.numel and geometry.is_contiguous(tuple(t.shape), t.stride()):
            return flat.reshape(t.shape)
        item = flat.itemsize
        kind = flat.dtype
        if item == 1 and kind != np.uint8 and kind != np.int8 and kind != np.bool_:
            flat = flat.view(np.uint8)  # as_strided does not take ml_dtypes' float8 types
        view = np.lib.stride_tricks.as_strided(
            flat[t.storage_offset():] if numel else flat, shape=tuple(t.shape),
            strides=tuple(s * item for s in t.stride()), writeable=False)
        return np.ascontiguousarray(view).view(kind)
    return np.asarray(value(t))


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A new CPU tensor holding a tpu tensor's value (blocks until it is computed).
    A host read is where device-side check failures surface (runtime/checks.py)."""
    from . import checks

    sync_debug.host_sync()
    a = _host_value(t)  # (runs the deferred region that computes it, if any)
    if checks.outstanding():
        checks.raise_pending()
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", a.nbytes)
    return numpy_to_torch(a).reshape(t.shape)


def to_device_array(t: torch.Tensor) -> jax.Array:
    """A CPU tensor's value on the device (same shape and dtype)."""
    if _copies and pinned.is_pinned_ptr(t.data_ptr()):
        # it may be the destination of a non-blocking copy still landing: on CUDA's one
        # stream this host->device copy would queue behind it
        wait_host_copies()
    a = torch_to_numpy(t)  # a private copy: XLA:CPU may alias it rather than copy
    metrics.bump("transfers_to_device")
    metrics.bump("bytes_to_device", a.nbytes)
    return jax.device_put(a, placement.jax_device())


def storage_to_host(entry: storage.Entry) -> np.ndarray:
    """A storage's bytes on the host, as a flat uint8 array (blocks until computed)."""
    sync_debug.host_sync()
    if _copies:
        wait_host_copies()
    a = np.asarray(buffer(entry)).reshape(-1)
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", a.nbytes)
    return a.view(np.uint8)


def storage_byte(entry: storage.Entry, i: int) -> int:
    """Byte i of a storage (storage[i]): reads only the element holding it. Bytes past the
    buffer (a byte count grown by views set past its end) read as zeros, as in _fit."""
    sync_debug.host_sync()
    if _copies:
        wait_host_copies()
    k, r = divmod(i, entry.dtype.itemsize)
    if k >= entry.numel:
        return 0
    a = np.asarray(buffer(entry)[k:k + 1])
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", a.nbytes)
    return int(a.view(np.uint8)[r])


def bytes_to_device(data: np.ndarray, dtype) -> jax.Array:
    """Host bytes (flat uint8, length a multiple of dtype's size) as a device buffer of dtype."""
    a = np.array(data, dtype=np.uint8, copy=True).view(dtype)  # private copy: XLA:CPU may alias
    metrics.bump("transfers_to_device")
    metrics.bump("bytes_to_device", a.nbytes)
    return jax.device_put(a, placement.jax_device())


def to_other_device(t: torch.Tensor, index: int) -> jax.Array:
    """A tpu tensor's value (its shape) on tpu:`index`: a device-to-device copy where PJRT has
    one, never through a torch CPU tensor."""
    return moved(value(t), index)


def moved(buf: jax.Array, index: int) -> jax.Array:
    """A device buffer copied to tpu:`index`."""
    metrics.bump("transfers_between_devices")
    return jax.device_put(buf, placement.jax_device(index))


# ---- non-blocking device->host copies ----------------------------------------------------
# `.to("cpu", non_blocking=True)` returns a pinned tensor at once; one worker thread waits
# for each value and writes it there, in issue order. As on CUDA's one stream, the copies
# are ordered with the host reads issued after them: a blocking read (`.item()`, `.cpu()`,
# torch.save) first waits for every earlier non-blocking copy, and synchronize(), events
# and Stream.query() see each copy through runtime/inflight until it has landed.


class HostCopy:
    """One device->host copy in flight: `src` (a device array of the tensor's shape) lands
    in `dst` (a numpy view of the pinned result, or the result itself when the dtype
    changes: then torch converts on the host, as the blocking copy does)."""

    __slots__ = ("src", "dst", "done", "error")

    def __init__(self, src, dst):
        self.src, self.dst = src, dst
        self.done = threading.Event()
        self.error = None

    def is_ready(self) -> bool:
        return self.done.is_set()

    def block_until_ready(self):
        self.done.wait()
        return self

    def run(self) -> None:
        try:
            a = np.asarray(self.src)  # waits for the program, the GIL released
            if isinstance(self.dst, np.ndarray):
                np.copyto(self.dst, a, casting="no")
            else:
                self.dst.copy_(numpy_to_torch(a))
        except BaseException as e:  # noqa: BLE001 - raised at the next synchronize or host read
            self.error = e
        finally:
            self.src = self.dst = None  # the result's memory is the caller's again
            self.done.set()


_copies: collections.deque = collections.deque()  # issued, not yet waited for by the host
_queue: queue.SimpleQueue = queue.SimpleQueue()
_worker = [0]  # pid of the process whose worker thread runs (a forked child starts its own)


def _loop(q) -> None:
    while True:
        q.get().run()


def _start_worker() -> None:
    global _queue
    if _worker[0] == os.getpid():
        return
    if _worker[0] == 0:
        atexit.register(_drain_at_exit)
    _queue = queue.SimpleQueue()  # after a fork the parent's queue has no reader here
    threading.Thread(target=_loop, args=(_queue,), name="torchtpu-host-copies", daemon=True).start()
    _worker[0] = os.getpid()


def to_host_async(t: torch.Tensor, out: torch.Tensor) -> None:
    """Start copying tpu tensor `t` into the host tensor `out` (same shape; its dtype may
    differ); returns at once. `out` must not be read before a synchronization."""
    if out.dtype == t.dtype:
        via = _BITCAST_VIA.get(out.dtype)
        dst = out.view(via[0]).numpy().view(via[1]) if via else out.numpy()
    else:
        dst = out
    src = value(t)  # dispatched, not waited for (a deferred value's region runs first)
    try:
        src.copy_to_host_async()  # start the transfer now; the worker only waits for it
    except Exception:  # noqa: BLE001 - an optimization only
        pass
    job = HostCopy(src, dst)
    metrics.bump("transfers_to_host")
    metrics.bump("bytes_to_host", out.numel() * out.element_size())
    _start_worker()
    while _copies and _copies[0].done.is_set() and _copies[0].error is None:
        _copies.popleft()
    _copies.append(job)
    _queue.put(job)
    inflight.retire(job)  # synchronize(), events and Stream.query() wait for it


def wait_host_copies() -> None:
    """Block until every non-blocking device->host copy issued so far has landed; raise the
    first one's failure."""
    while True:
        try:
            job = _copies[0]  # left queued while waited for: another thread's read waits too
        except IndexError:
            return
        job.done.wait()
        try:
            if _copies[0] is job:
                _copies.popleft()
        except IndexError:
            pass
        if job.error is not None:
            raise RuntimeError(f"torchtpu: a non-blocking copy to the host failed: {job.error}") from job.error


def _drain_at_exit() -> None:
    # JAX's runtime must not be torn down under a copy still running on the worker
    for job in list(_copies):
        job.done.wait(timeout=60)
