"""x[idx] and x[idx] = v on torch tensors: what the lowerings INDEX / INDEX_PUT (ops/indexing.py)
cannot do inside a program. A boolean mask's true count is an output size read from the data,
so a mask is turned into positions first (one host read); CPU index tensors move to the device
(as CUDA accepts them); CPU's index checks and uint8 deprecation warning come first."""
from __future__ import annotations

import warnings

import torch

from ...ops._common import scalar_type_name
from ...ops.indexing import INDEX, INDEX_PUT
from ...runtime.jaxenv import to_jax_dtype
from ...ops.registry import kernel
from ...runtime.jaxenv import NARROW_FLOATS
from ..argcheck import dtype_refusal
from ..executor import execute

_MASKS = (torch.bool, torch.uint8)


def _mask_shape_error(mask, j, self, at) -> IndexError:
    return IndexError(
        f"The shape of the mask {list(mask.shape)} at index {j} does not match the "
        f"shape of the indexed tensor {list(self.shape)} at index {at}"
    )


def _check_mask_shape(self, mask, pos) -> None:
    for j in range(mask.dim()):
        if pos + j >= self.dim() or mask.shape[j] != self.shape[pos + j]:
            raise _mask_shape_error(mask, j, self, pos + j)


def _expand_masks(self, indices):
    """Replace boolean masks by the long indices of their nonzero entries (syncs)."""
    out = []
    pos = 0
    for a in indices:
        if a is not None and a.dtype in _MASKS:
            _check_mask_shape(self, a, pos)
            nz = torch.nonzero(a)
            out.extend(nz[:, j] for j in range(a.dim()))
            pos += a.dim()
        else:
            out.append(a)
            pos += 1
    return out


def _to_self(self, indices):
    """CPU index tensors are accepted for device tensors (as on CUDA): move them over."""
    return [a.to(self.device) if a is not None and a.device != self.device else a for a in indices]


def _refuse_narrow(op, self, indices, values=None) -> None:
    """CPU indexes no float4 tensor (its index kernels dispatch on dtype): nor may tpu."""
    if self.dtype in NARROW_FLOATS or (values is not None and values.dtype in NARROW_FLOATS):
        err = dtype_refusal(op, (self, indices) if values is None else (self, indices, values), {})
        if err is not None:
            raise err


def _check_indices(self, indices):
    n = sum(a.dim() if a is not None and a.dtype in _MASKS else 1 for a in indices)
    if n > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()} (got {n})")
    for a in indices:
        if a is not None and not (a.dtype in (torch.bool, torch.uint8, torch.int64, torch.int32)):
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if a is not None and a.dtype == torch.uint8:  # as CPU's expandTensors warns, per mask
            warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                          "torch.bool instead.", UserWarning, stacklevel=3)


@kernel("index.Tensor")
def index(self, indices):
    _refuse_narrow(torch.ops.aten.index.Tensor, self, indices)
    indices = _to_self(self, list(indices))
    _check_indices(self, indices)
    if any(a is not None and a.dtype in _MASKS for a in indices):
        if self.dim() == 0 and len(indices) == 1 and indices[0].dim() == 0:
            # x[True] / x[False] on a 0-d tensor
            keep = bool(indices[0].item())
            return self.reshape(1)[: int(keep)].clone()
        indices = _expand_masks(self, indices)
    return execute(INDEX, (self, indices), {})


@kernel("index.Tensor_out")
def index_out(self, indices, *, out):
    r = index(self, indices)
    if out.shape != r.shape:
        out.resize_(r.shape)
    out.copy_(r)
    return out


@kernel("_index_put_impl_")
def _index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    _refuse_narrow(torch.ops.aten.index_put.default, self, indices, values)
    indices = _to_self(self, list(indices))
    _check_indices(self, indices)
    masks = [a for a in indices if a is not None and a.dtype in _MASKS]
    if masks:
        pos = [i for i, a in enumerate(indices) if a is not None]
        if len(masks) == 1 and len(pos) == 1 and masks[0].dim() > 0:
            # one mask alone: INDEX_PUT takes it as it is (no host read)
            _check_mask_shape(self, masks[0], pos[0])
        else:
            indices = _expand_masks(self, indices)
    if values.dtype != self.dtype and not (
            not accumulate and values.dim() == 0 and len(masks) == 1
            and sum(a is not None for a in indices) == 1):
        # CPU's index_put iterator (a lone mask with a 0-dim value is a masked_fill, which casts)
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(to_jax_dtype(self.dtype))} for the destination and "
            f"{scalar_type_name(to_jax_dtype(values.dtype))} for the source.")
    if values.device.type == "cpu" and values.dim() == 0:
        values = values.to(self.device)
    execute(INDEX_PUT, (self, indices, values, accumulate, unsafe), {})
    return self


@kernel("index_put_")
def index_put_(self, indices, values, accumulate=False):
    return _index_put_impl_(self, indices, values, accumulate)


@kernel("index_put")
def index_put(self, indices, values, accumulate=False):
    out = self.clone()
    return _index_put_impl_(out, indices, values, accumulate)
