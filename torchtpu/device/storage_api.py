"""Storage identity and resizing for tpu storages (`UntypedStorage.data_ptr` / `resize_`).

A tpu StorageImpl holds no host memory: its data pointer is null while its byte
count grows as views are made over it, a combination PyTorch calls an "invalid
python storage" (data_ptr() raises), and `resize_` needs a C++ PrivateUse1 hook.
Code that compares storages by data_ptr() or frees and regrows them (FSDP2's
reset_sharded_param and reshard_after_forward) needs both. For tpu storages:
data_ptr() is the StorageImpl's address (nonzero, the same for every view, as a
real data pointer would be); resize_(0) drops the device buffer (reads see zeros
until written again, the memory is released), resize_(n) grows the buffer if
needed. Other devices are untouched.
"""
from __future__ import annotations

import torch

def _storage_data_ptr(orig):
    def data_ptr(self):
        if self.device.type == "tpu":
            return self._cdata
        return orig(self)

    data_ptr._torchtpu = True
    return data_ptr


def _storage_resize(orig):
    def resize_(self, size):
        if self.device.type != "tpu":
            return orig(self, size)
        from ..runtime import storage

        try:
            entry = storage.lookup_storage(self)
        except KeyError:
            return orig(self, size)
        size = int(size)
        if size == 0:
            entry.buf = None  # the device buffer goes; reads see zeros until the next write
        else:
            storage.resize(entry, -(-size // entry.dtype.itemsize))
        return self

    resize_._torchtpu = True
    return resize_


def install() -> None:
    cls = torch.UntypedStorage
    if not getattr(cls.data_ptr, "_torchtpu", False):
        cls.data_ptr = _storage_data_ptr(cls.data_ptr)
    if not getattr(cls.resize_, "_torchtpu", False):
        cls.resize_ = _storage_resize(cls.resize_)
