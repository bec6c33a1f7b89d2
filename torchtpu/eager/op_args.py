"""An op call's arguments, flattened for the strict executor's cache key and program.

Tensors become leaves over the call's storages (runtime/leaf.py); Python numbers where
the op takes a Scalar or a Tensor are runtime values (`dyn`); everything else is static.
The encoding of each argument (a small tuple tagged by its first element) is part of
the executable's cache key and tells the program how to rebuild the call:

    (TENSOR, i)         the i-th leaf's value
    (SCALAR, type)      the next runtime scalar (complex: with whether its imaginary part is 0)
    (LIST, (spec,...))  a list of encoded items
    (VALUE, v[, types]) a static value (a tuple stands for a list), with its numbers' types
    None                None
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..ops.registry import Lowering
from ..runtime import leaf as _leaf
from ..runtime import placement
from ..runtime import storage as _storage
from ..runtime.jaxenv import torch_to_numpy

TENSOR, SCALAR, LIST, VALUE = "T", "S", "L", "V"
_SCALARS = (bool, int, float, complex)


class HostEntry:
    """A 0-dim CPU tensor used as an operand: it rides along as a device value, in a
    storage-like entry of its own."""

    __slots__ = ("buf", "numel", "dtype")

    def __init__(self, t: torch.Tensor):
        self.buf = jnp.asarray(torch_to_numpy(t.reshape(1)))
        self.numel = 1
        self.dtype = self.buf.dtype


def _device_error(low: Lowering, tensors, other) -> RuntimeError:
    mine = next((t.device.index for t in tensors if not t.is_cpu), 0)
    return placement.same_device_error(mine, other, low.name)


def check_device(device, op: str) -> None:
    """An index this process does not have is refused, as CUDA refuses an ordinal it does not
    have, rather than quietly made on another device."""
    if device is not None:
        d = torch.device(device)
        if d.type == "tpu" and d.index not in (None, 0):
            placement.index_of(d, op)


class Flat(_leaf.Leaves):
    """One call, flattened: its storages and leaves (a nonzero offset is a runtime value
    in `offsets`, passed after the op's scalars), runtime scalars `dyn`, the tensors."""

    __slots__ = ("dyn", "tensors")

    def __init__(self):
        super().__init__(runtime_offsets=True)
        self.dyn = []
        self.tensors = []

    @classmethod
    def scanned(cls, entries, offsets, dyn, tensors) -> "Flat":
        """The Flat of a call csrc/hit.cpp walked (its lists, as scan() fills them)."""
        flat = cls()
        flat.entries, flat.offsets, flat.dyn, flat.tensors = entries, offsets, dyn, tensors
        return flat

    def tensor(self, t: torch.Tensor, low: Lowering):
        if t.is_cpu:
            if t.dim() != 0:
                raise _device_error(low, self.tensors, "cpu")
            entry = HostEntry(t)
            self.leaves.append(_leaf.host_leaf(self.slot(entry), t))
        else:
            try:
                entry = _leaf.entry_of(t)
            except KeyError:
                if t.device.type != "tpu":
                    raise _device_error(low, self.tensors, str(t.device)) from None
                raise RuntimeError(f"{low.name}: {_storage.NO_BUFFER}") from None
            self.leaves.append(_leaf.leaf_of(t, self.slot(entry), self.offsets))
        self.tensors.append(t)
        return (TENSOR, len(self.leaves) - 1)

    def encode(self, v, info, low):
        if isinstance(v, torch.Tensor):
            return self.tensor(v, low)
        if v is None:
            return None
        kind = info.kind if info is not None else "other"
        if isinstance(v, _SCALARS):
            # A Python number where a Tensor is expected is a wrapped scalar: a runtime value too.
            if kind in ("scalar", "scalar_list", "tensor") and info.name not in low.static:
                self.dyn.append(v)
                # a complex one's imaginary part, zero or not, keys its own signature: CPU
                # converts 1+0j into a real tensor's dtype and refuses 1j (argcheck.py)
                return (SCALAR, complex, v.imag != 0) if type(v) is complex else (SCALAR, type(v))
            # the type is part of the key: 3 == 3.0 == True hash alike, and arange(3.0) is
            # float32 where arange(3) is int64
            return (VALUE, v, type(v))
        if isinstance(v, (list, tuple)):
            if kind == "scalar_list" and info.name not in low.static:
                return (LIST, tuple(self.encode(x, info, low) for x in v))
            if v and any(isinstance(x, torch.Tensor) for x in v) or kind in ("tensor_list", "opt_tensor_list"):
                return (LIST, tuple(self.encode(x, info, low) for x in v))
            return (VALUE, tuple(v), tuple(type(x) for x in v))
        if isinstance(v, torch.device):  # a factory's device=
            check_device(v, low.name)
        return (VALUE, v)


def decode(spec, vals, scalars):
    """The argument `spec` encodes, from the leaves' values and an iterator of scalars."""
    if spec is None:
        return None
    tag = spec[0]
    if tag == TENSOR:
        return vals[spec[1]]
    if tag == SCALAR:
        return next(scalars)
    if tag == LIST:
        return [decode(s, vals, scalars) for s in spec[1]]
    v = spec[1]
    return list(v) if isinstance(v, tuple) else v


def flatten(low: Lowering, args, kwargs) -> tuple[Flat, tuple, tuple]:
    """(flat call, positional specs, (name, spec) keyword specs)."""
    flat = Flat()
    infos = low.args
    pos = []
    i = 0
    for a in args:
        info = infos[i] if i < len(infos) else None
        pos.append(flat.encode(a, info, low))
        i += 1
    kw = []
    if kwargs:
        names = {a.name: a for a in infos}
        for name, v in kwargs.items():
            kw.append((name, flat.encode(v, names.get(name), low)))
    return flat, tuple(pos), tuple(kw)


# ---- the per-call key of a signature seen before --------------------------------------------

# Values a quick key holds as they are (hashable, equal only to themselves); any other
# non-tensor argument sends the call down the full path (flatten).
_PLAIN = frozenset({str, torch.dtype, torch.device, torch.memory_format, torch.layout, type(None)})
_NUMBERS = frozenset(_SCALARS)
_BAIL = object()
_table = _storage.table


def scan(low: Lowering, args, kwargs, head):
    """(quick key, Flat without leaves) of a call whose arguments are tpu tensors, numbers,
    lists of them and plain values; None otherwise (the caller flattens it). `head` is the
    key's first item. The walk is C++ (csrc/scan.cpp); scan_python states its rules and
    serves where the extension was not built."""
    flat = Flat()
    key = _cscan(head, args if type(args) is tuple else tuple(args), kwargs or None, low.scan_info, _table, flat.entries, flat.offsets, flat.dyn,
                 flat.tensors)
    return None if key is None else (key, flat)


def scan_python(low: Lowering, args, kwargs, head):
    """(quick key, Flat without leaves) of a call whose arguments are tpu tensors, numbers
    and plain values; None otherwise (the caller flattens it).

    The key is read straight off the tensors' metadata: no Leaf is built, no stride is
    normalized, so it is finer than the call's Signature (two keys may share one program),
    never coarser: everything flatten() reads of a tensor (its storage's slot, numel, dtype
    and whether it was written, its sizes, strides, whether its offset is nonzero, dtype,
    lazy bits) and of an argument (a runtime number's type, a static value and its type)
    is in it. The Flat's entries, runtime scalars and offsets are in flatten()'s order."""
    flat = Flat()
    rt, kinds, by_name = low.scan_info  # (the C++ walk's reading of the schema too)
    n = len(rt)
    key = [head]
    for i, v in enumerate(args):
        k = _item(v, rt[i], flat, kinds[i]) if i < n else _item(v, False, flat, 0)
        if k is _BAIL:
            return None
        key.append(k)
    if kwargs:
        for name, v in kwargs.items():
            meta = by_name.get(name)
            k = _item(v, meta[0], flat, meta[1]) if meta is not None else _item(v, False, flat, 0)
            if k is _BAIL:
                return None
            key.append((name, k))
    return tuple(key), flat


try:
    from ..runtime._scan import scan as _cscan
except ImportError:  # (a checkout whose C++ extensions were not built: `make venv` builds them)
    scan = scan_python  # noqa: F811


def _item(v, runtime: bool, flat: Flat, kind: int):
    """kind: the argument's list kind (0 other, 1 a tensor list, 2 a scalar list: Lowering.scan_info)."""
    tv = type(v)
    if tv in _NUMBERS:
        if runtime:
            flat.dyn.append(v)
            return (complex, v.imag != 0) if tv is complex else tv
        if v != v:  # NaN: never equal to itself, so never found again
            return _BAIL
        return (v, tv)
    if isinstance(v, torch.Tensor):
        if v.is_cpu:
            return _BAIL
        e = _table.get(v.untyped_storage()._cdata)
        if e is None:
            return _BAIL
        k = id(e)
        slot = flat.index.get(k)
        spec = None
        if slot is None:
            slot = flat.index[k] = len(flat.entries)
            flat.entries.append(e)
            spec = (e.numel, e.dtype, e.buf is not None)
        off = v.storage_offset()
        if off:
            flat.offsets.append(off)
        flat.tensors.append(v)
        return (slot, spec, v.shape, v.stride(), off != 0, v.dtype, v.is_neg(), v.is_conj())
    if tv in _PLAIN:
        return v
    if tv is list or tv is tuple:
        # flatten's rule: a list is encoded item by item when it is a runtime scalar list or
        # holds tensors, else kept whole as a static value
        if (kind == 2 and runtime) or kind == 1 \
                or any(isinstance(x, torch.Tensor) for x in v):
            items = []
            for x in v:
                k = _item(x, runtime, flat, kind)
                if k is _BAIL:
                    return _BAIL
                items.append(k)
            return (list, tuple(items))
        for x in v:
            if type(x) not in _NUMBERS or x != x:
                return _BAIL
        return (tuple, tuple(v), tuple([type(x) for x in v]))
    return _BAIL


def target_specs(low: Lowering, pos, kw) -> tuple[list, bool]:
    """(the encoded tensor(s) an in-place op writes, whether it is one tensor rather than a
    list): its first mutated argument's."""
    target = low.mutated[0]
    idx = [a.name for a in low.args].index(target)
    spec = pos[idx] if idx < len(pos) else dict(kw).get(target)
    if spec is None:
        return [], True
    return ([spec], True) if spec[0] == TENSOR else (list(spec[1]), False)
