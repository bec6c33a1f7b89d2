"""tpu storages as Python sees them: identity, creation, copies, resizing, serialization.

A tpu StorageImpl holds no host memory: its C++ data pointer stays null while its
byte count grows as views are made over it, a combination PyTorch's C++ calls an
"invalid python storage" (its copy_ and data_ptr() raise), and creating one with
`torch.UntypedStorage(n, device="tpu")` or resizing it needs a C++ PrivateUse1
allocator the pure-Python route cannot register. Everything that moves a storage's
bytes goes through a handful of `UntypedStorage` methods, so serving those for tpu
storages (and leaving other devices untouched) makes every caller work:

- `UntypedStorage(n, device="tpu")`: a new device buffer (torch.load's restore,
  `storage.clone()`, `copy.deepcopy`, `_new_shared`, `storage.tpu()`).
- `copy_` between a tpu storage and a CPU or tpu one, byte for byte: `storage.cpu()`
  (torch.save writes each storage through it), `storage.to(device=)`.
- `_write_file` / `_set_from_file`: the legacy format and pickling (`pickle.dumps(t)`,
  multiprocessing) write the storage's CPU copy and read into one.
- `nbytes()`: the device buffer's size (the C++ count starts at 0 and only grows as
  views are set over the storage).
- `data_ptr()` of storages and tensors: the storage's device address
  (runtime/storage.address), plus the view's offset for a tensor, so sharing is
  detected from pointers as on CUDA. C++ code never sees these addresses.
- `storage[i]` reads one byte (its element only); `storage[i] = v`, `storage[a:b] = v` and
  `fill_` run on the CPU copy and write it back (CPU's checks); `len()` and `tolist()` see
  the device buffer's bytes. A slice `storage[a:b]` raises: CUDA's shares the buffer, which
  a tpu storage cannot.
- `resize_`: resize_(0) drops the device buffer (reads see zeros until written again,
  the memory is released), resize_(n) grows it (FSDP2's reshard and reset_sharded_param).
"""
from __future__ import annotations

import numpy as np
import torch


def _is_tpu(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.device):
        return device.type == "tpu"
    if isinstance(device, str):
        return device.split(":")[0] == "tpu"
    return False


def _entry(st):
    from ..runtime import storage

    try:
        return storage.lookup_storage(st)
    except KeyError:
        raise RuntimeError(
            "torchtpu: this tpu storage has no device buffer (was it created outside torchtpu?)"
        ) from None


def _storage_new(orig):
    def __new__(cls, *args, device=None, **kwargs):
        if not _is_tpu(device):
            if device is not None:
                kwargs["device"] = device
            return orig(cls, *args, **kwargs)
        if kwargs:
            raise TypeError(f"UntypedStorage(): unexpected keyword arguments {sorted(kwargs)} for a tpu storage")
        from ..runtime import placement

        idx = placement.index_of(torch.device(device), "UntypedStorage")
        data = None
        if not args:
            size = 0
        elif len(args) == 1 and isinstance(args[0], int):
            size = args[0]
        elif len(args) == 1:  # a sequence of byte values, as for CPU storages
            data = orig(cls, *args)
            size = data.nbytes()
        else:
            raise TypeError(f"UntypedStorage(): unexpected arguments {args!r} for a tpu storage")
        if size < 0:
            raise RuntimeError(f"UntypedStorage: size must be non-negative, got {size}")
        from ..runtime import tensors

        with placement.at(idx, "UntypedStorage"):
            st = tensors.empty((size,), torch.uint8).untyped_storage()
        _entry(st).untyped = True
        if data is not None:
            st.copy_(data)
        return st

    __new__._torchtpu = True
    return __new__


def _storage_copy(orig):
    def copy_(self, src, non_blocking=None):
        dst_tpu, src_tpu = self.device.type == "tpu", src.device.type == "tpu"
        if not (dst_tpu or src_tpu):
            return orig(self, src) if non_blocking is None else orig(self, src, non_blocking)
        if self.nbytes() != src.nbytes():
            raise RuntimeError(f"size does not match, self was {self.nbytes()} bytes but src was {src.nbytes()} bytes")
        if self.nbytes() == 0:
            return self
        from ..runtime import inflight, placement, transfer

        if dst_tpu:
            entry = _entry(self)
            with placement.at(entry.index, "UntypedStorage.copy_"):
                if src_tpu:
                    s = _entry(src)
                    buf = transfer.buffer(s)
                    if s.dtype != entry.dtype or s.nbytes != entry.nbytes:
                        host = transfer.storage_to_host(s)
                        buf = transfer.bytes_to_device(_fit(host, entry.nbytes), entry.dtype)
                    elif s.index != entry.index:  # another tpu device: a device-to-device copy
                        buf = transfer.moved(buf, entry.index)
                else:
                    host = torch.empty(0, dtype=torch.uint8).set_(src).numpy()
                    buf = transfer.bytes_to_device(_fit(host, entry.nbytes), entry.dtype)
            inflight.replaced(entry.buf)  # a transfer does not wait for the old buffer's program
            entry.buf = buf
            return self
        host = transfer.storage_to_host(_entry(src))
        torch.empty(0, dtype=torch.uint8).set_(self).numpy()[:] = _fit(host, self.nbytes())
        return self

    copy_._torchtpu = True
    return copy_


def _fit(data: np.ndarray, n: int) -> np.ndarray:
    """`data` cut or zero-padded to n bytes (a StorageImpl's byte count can exceed the
    buffer's when views were set past its end; the bytes there read as zeros)."""
    if data.shape[0] == n:
        return data
    out = np.zeros(n, np.uint8)
    k = min(n, data.shape[0])
    out[:k] = data[:k]
    return out


def _storage_write_file(orig):
    def _write_file(self, *args, **kwargs):
        if self.device.type == "tpu":
            return orig(self.cpu(), *args, **kwargs)
        return orig(self, *args, **kwargs)

    _write_file._torchtpu = True
    return _write_file


def _storage_set_from_file(orig):
    def _set_from_file(self, f, offset, *args, **kwargs):
        if self.device.type == "tpu":
            host = torch.UntypedStorage(self.nbytes())
            orig(host, f, offset, *args, **kwargs)
            return self.copy_(host)
        return orig(self, f, offset, *args, **kwargs)

    _set_from_file._torchtpu = True
    return _set_from_file


def _storage_data_ptr(orig):
    def data_ptr(self):
        if self.device.type == "tpu":
            from ..runtime import storage

            entry = storage.table.get(self._cdata)
            return storage.address(entry) if entry is not None else self._cdata
        return orig(self)

    data_ptr._torchtpu = True
    return data_ptr


def _storage_nbytes(orig):
    def nbytes(self):
        n = orig(self)
        if self.device.type == "tpu":
            from ..runtime import storage

            entry = storage.table.get(self._cdata)
            if entry is not None and entry.nbytes > n:
                return entry.nbytes  # the C++ count only grows as views are set over it
        return n

    nbytes._torchtpu = True
    return nbytes


def _tensor_data_ptr(orig):
    def data_ptr(self):
        if not self.is_cpu and self.device.type == "tpu":
            from ..runtime import storage

            entry = storage.table.get(self.untyped_storage()._cdata)
            if entry is not None:
                base = storage.address(entry)
                return base + self.storage_offset() * self.element_size() if base else 0
        return orig(self)

    data_ptr._torchtpu = True
    return data_ptr


def _storage_resize(orig):
    def resize_(self, size):
        if self.device.type != "tpu":
            return orig(self, size)
        from ..runtime import inflight, storage

        try:
            entry = storage.lookup_storage(self)
        except KeyError:
            return orig(self, size)
        size = int(size)
        if size == 0:
            inflight.replaced(entry.buf)
            entry.buf = None  # the device buffer goes; reads see zeros until the next write
        else:
            storage.resize(entry, -(-size // entry.dtype.itemsize))
        return self

    resize_._torchtpu = True
    return resize_


def _storage_getitem(orig):
    def __getitem__(self, idx):
        if self.device.type != "tpu" or isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
            if self.device.type == "tpu" and isinstance(idx, slice):
                raise NotImplementedError(
                    "a slice of a tpu storage: it cannot share the device buffer as a CUDA storage's slice "
                    "does (read storage.cpu()[a:b], or take a view of a tensor over the storage)")
            return orig(self, idx)
        n = self.nbytes()
        i = int(idx) + n if idx < 0 else int(idx)
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for storage of size {n}")
        from ..runtime import transfer

        return transfer.storage_byte(_entry(self), i)

    __getitem__._torchtpu = True
    return __getitem__


def _through_host(orig, what):
    """A tpu storage's `what` (item assignment, fill_) run on its CPU copy, written back: CPU's
    checks and errors, the device buffer updated."""
    def run(self, *args):
        if self.device.type != "tpu":
            return orig(self, *args)
        host = self.cpu()
        orig(host, *args)
        self.copy_(host)
        return self if what == "fill_" else None

    run._torchtpu = True
    return run


def _storage_len(orig):
    def __len__(self):
        return self.nbytes() if self.device.type == "tpu" else orig(self)

    __len__._torchtpu = True
    return __len__


def _storage_tolist(orig):
    def tolist(self):
        return self.cpu().tolist() if self.device.type == "tpu" else orig(self)

    tolist._torchtpu = True
    return tolist


def install() -> None:
    cls = torch.UntypedStorage
    for name, wrap in (("data_ptr", _storage_data_ptr), ("nbytes", _storage_nbytes), ("resize_", _storage_resize),
                       ("copy_", _storage_copy), ("_write_file", _storage_write_file),
                       ("_set_from_file", _storage_set_from_file), ("__getitem__", _storage_getitem),
                       ("__setitem__", lambda f: _through_host(f, "__setitem__")),
                       ("fill_", lambda f: _through_host(f, "fill_")), ("__len__", _storage_len),
                       ("tolist", _storage_tolist)):
        if not getattr(getattr(cls, name), "_torchtpu", False):
            setattr(cls, name, wrap(getattr(cls, name)))
    if not getattr(cls.__new__, "_torchtpu", False):
        cls.__new__ = staticmethod(_storage_new(cls.__new__))
    if not getattr(torch.Tensor.data_ptr, "_torchtpu", False):
        torch.Tensor.data_ptr = _tensor_data_ptr(torch.Tensor.data_ptr)
    if not hasattr(torch.storage._StorageBase, "tpu"):
        # storage.tpu() and TypedStorage.tpu(), as storage.cuda()
        from torch.utils.backend_registration import _generate_storage_methods_for_privateuse1_backend

        _generate_storage_methods_for_privateuse1_backend("tpu")
    from . import host_memory

    host_memory.install()  # pinned host memory: CPU storages that feed the device
