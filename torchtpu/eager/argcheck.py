"""Argument checks as CPU PyTorch makes them, before any program runs.

A lowering is a JAX function: handed arguments CPU rejects (a weight of the wrong
rank, a negative padding, an out= of the wrong dtype) it either computes a plausible
number or fails inside JAX's tracer with a message no PyTorch user recognises. So the
first call of each signature runs the op on meta stand-ins of its tensors first:
PyTorch's own meta kernels make the CPU kernel's shape, dtype, argument and memory
overlap checks (stand-ins of one storage share one meta storage, so an out= that
overlaps its input is caught). The meta kernel is only the detector: a call it rejects
runs once more on CPU copies of its tensors and CPU's own exception (class and
message) is raised; where CPU accepts what a meta kernel rejected, the call goes
ahead. A signature that passed is not checked again: the cost is paid once per
compiled executable.

Meta kernels that cannot answer (data-dependent shapes, no meta kernel) are skipped;
their op is checked by its lowering or kernel instead.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.utils._pytree import tree_leaves, tree_map

from ..runtime import cache as _caches
from ..runtime.jaxenv import CARRIED, NARROW_FLOATS

# Errors that say "the meta kernel cannot decide", never "the arguments are wrong".
_UNDECIDABLE = (
    "meta", "data-dependent", "data dependent", "Cannot access data pointer", "not allocated",
    "DataDependent", "DynamicOutputShape", "unbacked", "is not implemented for", "Could not run",
    "no attribute",
)
# Errors of binding a call to the overload's schema. The dispatcher bound the user's call
# already, so these say the call was rearranged for a lowering (an out= lowering run
# without its out, a fused kernel's own argument list), never that CPU rejects the user's
# arguments: such a call is not checked here.
_NOT_THIS_SCHEMA = ("is missing value for argument", "Expected a value of type",
                    "argument(s) but received", "got an unexpected keyword argument")
# Ops whose CPU kernel checks differently from every other device (CUDA and the composite
# give one message, CPU's own kernel another): their lowering makes the other devices' checks.
SKIP = {"narrow_copy.default",
        # checked by their kernels (eager/composites/indexing.py), which warn for uint8 masks as CPU
        # does once per call; the meta kernel's own warning would reach the user on top of it
        "index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default"}
# CPU implements few ops for the float8 and float4 dtypes (mul, mm, abs, eq, copies: not add,
# sum, max, sort, ...), and says so in its kernels' dtype dispatch, which meta kernels do not
# make. So a call with such a tensor (or dtype=) asks CPU once per signature, as PyTorch on CPU
# decides, rather than compute what CPU refuses. The ops here CPU accepts for every one of
# them, and they move big tensors (weights, caches): asking would copy those to the host.
_NARROW_ACCEPTED = {"_to_copy.default", "copy_.default", "clone.default", "_scaled_mm.default",
                    "_scaled_mm.out", "cat.default", "stack.default", "empty.memory_format",
                    "empty_strided.default", "full.default", "fill_.Scalar", "zero_.default",
                    "view.dtype", "_unsafe_view.default", "slice.Tensor", "select.int"}
_passed: set = _caches.register("argument checks passed", set())  # at most _MAX_PASSED
_MAX_PASSED = 100_000


def check(op: torch._ops.OpOverload, args, kwargs, ask_cpu: bool = False) -> None:
    """Raise CPU's error for arguments the meta kernel of `op` rejects; else return."""
    if op.__name__ in SKIP:
        return
    check_dtypes(op, args, kwargs)
    # meta kernels do not make every overlap check CPU kernels make: overlapping calls ask CPU
    overlaps = (ask_cpu or _overlaps(op, args, kwargs) or _narrow_float(op, args, kwargs)
                or _mixed_dtypes(op, args, kwargs))
    meta_err = None
    try:
        margs, mkwargs = convert(args, kwargs, _meta_of)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*margs, **mkwargs)
    except Exception as err:  # noqa: BLE001  (the meta kernel's verdict)
        if not _undecidable(err):
            meta_err = err
    if meta_err is None and not overlaps:
        return
    name = str(op).removeprefix("aten.")
    try:
        cargs, ckwargs = convert(args, kwargs, cpu_of)
    except Exception:  # noqa: BLE001  (no CPU copy to ask: the meta kernel's own message)
        if meta_err is None:
            return
        raise_as_cpu(meta_err, name, args, kwargs)
    err = _run_cpu(op, cargs, ckwargs)
    del cargs, ckwargs
    if err is not None:
        raise_as_cpu(err, name, args, kwargs)


def _run_cpu(op, cargs, ckwargs):
    """CPU's exception for the call, as a fresh exception object (class and message only:
    the original's traceback holds the CPU copies and C++ frames), or None."""
    found = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*cargs, **ckwargs)
    except Exception as err:  # noqa: BLE001
        found = (type(err), str(err))
        del err
    if found is None:
        return None
    cls, msg = found
    if any(s in msg for s in _NOT_THIS_SCHEMA):
        return None
    try:
        return cls(msg)
    except Exception:  # noqa: BLE001  (an exception class with its own constructor)
        return RuntimeError(msg)


def cpu_error(op: torch._ops.OpOverload, args, kwargs) -> BaseException | None:
    """The exception CPU PyTorch raises for this call, or None (it accepts it)."""
    try:
        cargs, ckwargs = convert(args, kwargs, cpu_of)
    except Exception:  # noqa: BLE001  (no CPU copy to ask)
        return None
    err = _run_cpu(op, cargs, ckwargs)
    del cargs, ckwargs
    if err is None:
        return None
    try:
        raise_as_cpu(err, str(op).removeprefix("aten."), args, kwargs)
    except Exception as named:  # noqa: BLE001
        return named


def check_once(op: torch._ops.OpOverload, args, kwargs, key, ask_cpu: bool = False) -> None:
    """check(), skipped for a `key` (see signature()) that already passed."""
    if key is not None and key in _passed:
        return
    check(op, args, kwargs, ask_cpu)
    if key is not None and len(_passed) < _MAX_PASSED:
        _passed.add(key)


# Ops whose CPU kernel refuses tensors of different dtypes (or complex ones) that their meta
# kernel accepts: heaviside ("not yet implemented for tensors with different dtypes", out= and
# in-place too), polar ("Expected object of scalar type Float but got scalar type Double for
# second argument"). Such a call asks CPU, once per signature.
_SAME_DTYPE_ON_CPU = {"heaviside", "polar"}


def _mixed_dtypes(op, args, kwargs) -> bool:
    if op._schema.name.removeprefix("aten::").rstrip("_") not in _SAME_DTYPE_ON_CPU:
        return False
    dts = {a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    if op._schema.name == "aten::polar":  # "Expected both inputs to be Half, Float or Double tensors"
        return len(dts) > 1 or not dts <= {torch.float16, torch.float32, torch.float64}
    return len(dts) > 1 or any(d.is_complex for d in dts)


def complex_into_real(args, kwargs) -> bool:
    """A complex scalar (a Python complex, a 0-d CPU complex tensor) in a call with no complex
    tpu tensor nor complex dtype=: CPU refuses most such calls (a comparison, clamp or maximum
    with a complex, "value cannot be converted to type float without overflow" for fill_, full,
    addcmul's value, lerp's weight when the imaginary part is not 0) in its kernels, where
    meta kernels do not look; so CPU is asked, once per signature (which tells a zero
    imaginary part from another, eager/op_args.py)."""
    found = False
    for a in tree_leaves((args, kwargs)):
        if type(a) is complex:
            found = True
        elif isinstance(a, torch.Tensor):
            if a.is_complex():
                if a.device.type != "cpu" or a.dim():
                    return False
                found = True
        elif isinstance(a, torch.dtype) and a.is_complex:
            return False
    return found


def odd_out_dtype(args, kwargs, outs) -> bool:
    """An out= tensor has a dtype no tensor input has: CPU's out= dtype rules (exact for neg,
    a safe cast for add, always int64 for nonzero) differ by op, so CPU is asked."""
    dts = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    return any(isinstance(kwargs.get(n), torch.Tensor) and kwargs[n].dtype not in dts for n in outs)


def _narrow_float(op, args, kwargs) -> bool:
    """A float8/float4 tensor or dtype= in a call CPU may refuse (see NARROW_FLOATS)."""
    if op.__name__ in _NARROW_ACCEPTED:
        return False
    if kwargs.get("dtype") in NARROW_FLOATS:
        return True
    return any(isinstance(t, torch.Tensor) and t.dtype in NARROW_FLOATS
               for t in torch.utils._pytree.tree_leaves((args, kwargs)))


_verdicts = _caches.register("dtype verdicts of CPU kernels", _caches.LRU(4096))

# Ops that take any dtype CPU has (moves, copies, views, factories): no verdict to ask for.
_EVERY_DTYPE = _NARROW_ACCEPTED | {"_copy_from.default", "_copy_from_and_resize.default", "as_strided.default",
                                   "view.default", "alias.default", "detach.default", "lift_fresh.default",
                                   "set_.source_Storage_storage_offset", "resize_.default",
                                   "_local_scalar_dense.default", "equal.default"}


# Ops CPU's and CUDA's kernels both refuse for integer and bool tensors that their meta
# kernels accept. (Not every such op: Transformers' accelerator paths call histc and the like on
# integer tensors, which CUDA's kernels take and CPU's do not.)
_NO_INTEGERS = {"_softmax.default", "_log_softmax.default", "gelu.default", "gelu_backward.default",
                "lerp.Scalar", "lerp.Tensor"}
_NO_BOOL = {"abs.default"}  # (integers are fine)
# Ops CPU refuses with any bool operand, a Python bool too, whatever the other's dtype
# (sub_check: "Subtraction, the `-` operator, with a bool tensor is not supported"); promotion
# would hide it from the lowering (bool - 1 computed in int64)
_NO_BOOL_OPERAND = {"sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar"}


def _dtype_class(op, args, kwargs) -> str | None:
    """Which kind of dtype verdict a call may get from CPU's kernels: "narrow" (a float8/float4
    tensor or dtype=: CPU implements few ops for them), "other" (a complex tensor with no
    integer one: ordering ops, clamp, sign, atan2, unique, ... refuse complex in CPU's (and
    CUDA's) kernels, where meta kernels do not look; or integer tensors in one of _NO_INTEGERS),
    or None. A complex call with integer tensors (an index_select's index) is not asked: run on
    stand-ins of size 1 its tensors could disagree, which a CPU kernel may not survive; dtypes
    carried in another type (complex32: eager/carried.py) are carried.py's."""
    if _narrow_float(op, args, kwargs):
        return "narrow"
    if op.__name__ in _EVERY_DTYPE or torch.Tag.nondeterministic_seeded in op.tags:
        return None  # (a random op run on CPU would draw from CPU's generator)
    complex_, integer, floating, all_bool = False, False, False, True
    for t in torch.utils._pytree.tree_leaves((args, kwargs)):
        if op.__name__ in _NO_BOOL_OPERAND and (type(t) is bool or getattr(t, "dtype", None) == torch.bool):
            return "other"
        if isinstance(t, torch.Tensor):
            if t.dtype in CARRIED:
                return None
            complex_ |= t.dtype.is_complex
            floating |= t.dtype.is_floating_point
            integer |= not (t.dtype.is_complex or t.dtype.is_floating_point)
            all_bool &= t.dtype == torch.bool
    if complex_ and not integer:
        return "other"
    if integer and not (complex_ or floating) and (
            op.__name__ in _NO_INTEGERS or (all_bool and op.__name__ in _NO_BOOL)):
        return "other"
    return None


def _verdict(op, err) -> bool:
    """Whether CPU's error on zeros is a verdict on the dtypes: "... not implemented for
    'ComplexFloat'", "clamp is not supported for complex types", "max(): does not support
    complex input", sub_check's (not "Could not run ... with arguments from the 'CPU'
    backend": an op CPU lacks for every dtype)."""
    msg = str(err)
    if not isinstance(err, (NotImplementedError, RuntimeError)) or "Could not run" in msg:
        return False
    return "not implemented for '" in msg or "complex" in msg.lower() or op.__name__ in _NO_BOOL_OPERAND


def check_dtypes(op: torch._ops.OpOverload, args, kwargs) -> None:
    """Raise CPU's error where its kernels refuse the call's dtypes and its meta kernel does
    not (max of a complex tensor, softmax of an integer one: dtype_refusal)."""
    refused = dtype_refusal(op, args, kwargs)
    if refused is not None:
        raise refused


def dtype_refusal(op: torch._ops.OpOverload, args, kwargs) -> BaseException | None:
    """For a call (its tensors on any device, fake or meta as a compiled graph holds them): CPU's
    error when its kernels implement `op` for none of the dtypes the call uses (float8/float4,
    complex, and integers for a few ops: see _dtype_class), else None. CPU runs the call on
    zeros of the tensors' dtypes, so only its dtype verdict counts: float8/float4 calls at the
    tensors' shapes (a matmul's verdict depends on them), the others at sizes clipped to 1 (a
    verdict on a dtype, asked once per op, dtypes and ranks at the cost of a tiny CPU call)."""
    kind = _dtype_class(op, args, kwargs)
    if kind is None:
        return None

    def size(s):
        hint = getattr(getattr(s, "node", None), "hint", s)  # a SymInt's example value
        return int(hint) if hint is not None else 1

    def conv(a):
        if isinstance(a, torch.Tensor):
            return torch.zeros([size(d) if kind == "narrow" else 1 for d in a.shape], dtype=a.dtype)
        if isinstance(a, torch.device) or (isinstance(a, str) and a.split(":")[0] == "tpu"):
            return torch.device("cpu")
        if isinstance(a, torch.SymInt):
            return size(a)
        return a

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # a compiler runs under aot_autograd's fake mode: real zeros
        cargs, ckwargs = tree_map(conv, (args, kwargs))
        key = (op, repr(tree_map(lambda a: (a.dtype, tuple(a.shape)) if isinstance(a, torch.Tensor) else a,
                                 (cargs, ckwargs))))
        found = _verdicts.get(key, False)
        if found is False:
            err = _run_cpu(op, cargs, ckwargs)
            if kind == "narrow":
                found = (type(err), str(err)) if isinstance(err, NotImplementedError) else None
            else:
                found = (type(err), str(err)) if err is not None and _verdict(op, err) else None
            _verdicts[key] = found
    if found is None:
        return None
    name = str(op).removeprefix("aten.")
    return found[0](f"{found[1]}\n  (torchtpu: {_describe(name, args, kwargs)} rejected as CPU PyTorch rejects it)")


def _overlaps(op, args, kwargs) -> bool:
    """A tensor the op writes overlaps another argument (other than exactly, for an in-place
    op's self) or itself (a stride-0 dim): the cases CPU kernels reject as "unsupported
    operation" that meta kernels let through."""
    schema = op._schema.arguments
    written, read = [], []
    for i, a in enumerate(schema):
        v = args[i] if i < len(args) else kwargs.get(a.name)
        ts = [v] if isinstance(v, torch.Tensor) else [x for x in v if isinstance(x, torch.Tensor)] \
            if isinstance(v, (list, tuple)) else []
        is_out = a.alias_info is not None and a.alias_info.is_write
        (written if is_out else read).extend((t, a.kwarg_only) for t in ts if t.device.type == "tpu")
    if not written:
        return False
    for w, out_kw in written:
        if any(st == 0 and sz > 1 for sz, st in zip(w.shape, w.stride())):
            return True
        ws = w.untyped_storage()._cdata
        for r, _ in read:
            if r.untyped_storage()._cdata == ws:
                same = (r.storage_offset() == w.storage_offset() and r.shape == w.shape
                        and r.stride() == w.stride() and r.dtype == w.dtype)
                if not same or out_kw:
                    return True
    return False


def _describe(name: str, args, kwargs) -> str:
    ins = ", ".join(f"{tuple(t.shape)}:{str(t.dtype).removeprefix('torch.')}"
                    for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
    return f"{name}({ins})"


def raise_as_cpu(err: BaseException, name: str, args=(), kwargs=None):
    """Raise CPU's exception (class and message), its message extended by the op, its inputs
    and the user's line, as every torchtpu error names them."""
    from .origin import user_frame as _origin

    where = _origin()
    at = f", issued at {where[0]}:{where[1]} in {where[2]}" if where else ""
    msg = f"{err}\n  (torchtpu: {_describe(name, args, kwargs or {})} rejected as CPU PyTorch rejects it{at})"
    if type(err) in (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError):
        err.args = (msg,)
    else:
        err.add_note(msg)
    raise err


def _undecidable(err: BaseException) -> bool:
    if isinstance(err, NotImplementedError) or not isinstance(err, (RuntimeError, IndexError, ValueError, TypeError)):
        return True
    name = type(err).__name__
    msg = str(err)
    return any(s in msg or s in name for s in _UNDECIDABLE) or any(s in msg for s in _NOT_THIS_SCHEMA)


def _meta_of(t: torch.Tensor, bases: dict) -> torch.Tensor:
    key = (t.untyped_storage()._cdata, t.dtype)
    base = bases.get(key)
    if base is None:
        extent = t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
        from ..runtime import storage

        entry = storage.table.get(t.untyped_storage()._cdata)
        numel = entry.numel * entry.dtype.itemsize // t.element_size() if entry is not None else 0
        base = bases[key] = torch.empty(max(numel, extent if t.numel() else 0), dtype=t.dtype, device="meta")
    return _bits(t, base.as_strided(t.shape, t.stride(), t.storage_offset()))


def cpu_of(t: torch.Tensor, bases: dict) -> torch.Tensor:
    """A CPU copy of `t` over a CPU copy of its whole storage (sharing kept)."""
    from ..runtime import storage, transfer
    from ..runtime.jaxenv import numpy_to_torch, to_jax_dtype

    key = (t.untyped_storage()._cdata, t.dtype)
    base = bases.get(key)
    if base is None:
        entry = storage.lookup(t)
        if t.dtype in CARRIED or entry.dtype != to_jax_dtype(t.dtype):
            # the storage's bytes as the tensor's dtype (a view of another dtype; complex32, uint4
            # and the like carried in another type's buffer: runtime/jaxenv.py CARRIED)
            raw = np.array(transfer.buffer(entry)).reshape(-1).view(np.uint8)
            if raw.size % t.element_size():
                raise TypeError("a view of another dtype")
            # (an empty buffer: numpy's 0-byte array comes with stride 0, which .view refuses)
            base = torch.from_numpy(raw.copy()).view(t.dtype) if raw.size else torch.empty(0, dtype=t.dtype)
        else:
            base = numpy_to_torch(np.array(transfer.buffer(entry))).clone()  # resizable
        bases[key] = base
    return _bits(t, base.as_strided(t.shape, t.stride(), t.storage_offset()))


def _bits(t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The lazy conjugate/negative bits of `t` on its stand-in."""
    if t.is_complex():
        if t.is_conj():
            m = m.conj()
        if t.is_neg():
            m = torch._neg_view(m)
    return m


def convert(args, kwargs, of):
    bases: dict = {}
    to = "meta" if of is _meta_of else "cpu"

    same: dict = {}  # one stand-in per tensor: CPU tells `out=x` with x an input by identity

    def conv(a):
        if isinstance(a, torch.Tensor):
            if a.device.type in ("cpu", "meta"):
                return a
            m = same.get(id(a))
            if m is None:
                m = same[id(a)] = of(a, bases)
            return m
        if isinstance(a, torch.device) and a.type == "tpu":
            return torch.device(to)
        if isinstance(a, str) and a.split(":")[0] == "tpu":
            return to
        return a

    return tree_map(conv, (args, kwargs))


def _sig(a, ids: dict):
    if isinstance(a, torch.Tensor):
        if a.device.type == "cpu":
            return ("c", tuple(a.shape), a.dtype)
        sid = ids.setdefault(a.untyped_storage()._cdata, len(ids))  # the sharing pattern, not the address
        return (sid, tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.is_conj(), a.is_neg())
    if isinstance(a, (list, tuple)):
        return tuple(_sig(x, ids) for x in a)
    if isinstance(a, float) and a != a:
        return "nan"
    return a


def signature(op, args, kwargs):
    """A hashable key of a call's geometry, dtypes, storage sharing and argument values."""
    ids: dict = {}
    try:
        key = (op, _sig(args, ids), tuple((k, _sig(v, ids)) for k, v in kwargs.items()))
        hash(key)
        return key
    except TypeError:
        return None
