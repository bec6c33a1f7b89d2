"""Ops on the dtypes XLA has no element type for: complex32 and the sub-byte and bits dtypes.

Their buffers hold a same-size carrier's bits (runtime/jaxenv.py CARRIED: uint8 for uint1..7,
int1..7, bits1x8/2x4/4x2/8, uint16 for bits16, uint32 for complex32), so a lowering handed one
of these tensors would compute on the carrier: integer arithmetic on complex32's bits, a uint8
result where CPU gives uint4. Every kernel entry (lowered ops, out= kernels, composites, copies,
the fallback) sends a call with such a tensor or dtype= here once any exists (`seen`), and:

1. CPU decides, once per signature: the call runs on CPU copies of its tensors; what CPU refuses
   (`"add_stub" not implemented for 'UInt4'`, `"div_cpu" not implemented for 'ComplexHalf'`)
   raises CPU's error naming the op and dtypes. What CPU accepts also gives the dtype of each of
   its results.
2. Sub-byte and bits calls CPU accepts are byte moves (cat, copies, zero_): they run on carrier
   views of the same storages, and each result is viewed back as CPU's result dtype.
3. complex32 calls run in complex64: each complex32 argument is widened (exact: float16 ->
   float32 per part), the op runs natively, a result CPU gives as complex32 is rounded back per
   part (float32 -> float16, round to nearest even, as c10 rounds), one CPU gives as float16
   (abs, real of a copy) is cast, and a mutated argument gets its rounded value written back
   through the carrier. CPU computes complex32 arithmetic in complex<float> and rounds once
   (its opmath), which is what this does: results are bit-equal to CPU's.

torch.compile graphs holding these dtypes run their ATen graph op by op through the same
kernels (compile/__init__.py), since the graph lowering sees only carriers.
"""
from __future__ import annotations

import threading

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ..runtime import cache as _caches
from ..runtime.jaxenv import CARRIED, CARRIED_SEEN

seen = CARRIED_SEEN  # set once a tensor of a carried dtype exists on tpu: until then, no checks
_verdicts = _caches.register("carried-dtype verdicts", _caches.LRU(4096))
_MOVES = frozenset(CARRIED) - {torch.complex32}
# ops that only move complex32 elements: they run on its uint32 carrier, every bit kept (a
# NaN's payload too, which a float16 -> float32 -> float16 round trip need not keep)
_BYTE_MOVES = frozenset(["clone", "cat", "stack", "copy_", "index_select", "index", "index_put",
                         "index_put_", "_index_put_impl_", "select_scatter", "slice_scatter",
                         "repeat", "roll", "tril", "triu", "diag", "diagonal_copy", "masked_select",
                         "constant_pad_nd", "_unsafe_view", "view_copy", "permute_copy",
                         "expand_copy", "unfold_copy", "narrow_copy", "alias_copy", "_to_copy",
                         "where", "masked_fill", "zero_", "index_copy", "index_copy_"])


def note(dtype) -> None:
    if dtype in CARRIED:
        seen[0] = True


class FirstSeen(Exception):
    """Raised by the executor (eager/executor.execute) when the call it ran is the first of the
    process to name a carried dtype (dtype=torch.complex32 before any such tensor existed, a
    float16 tensor promoted with a complex scalar to complex32): the lowering computed on the
    carrier, so the kernel entry that called it serves the call again through `call`."""


def involved(args, kwargs) -> bool:
    """A tensor of a carried dtype among the arguments, or dtype= one, or a float16 tensor with
    a complex scalar or tensor (CPU promotes those to complex32)."""
    d = kwargs.get("dtype") if kwargs else None
    if d is not None and d in CARRIED:
        return True
    half = cplx = False
    for a in (args, kwargs.values()) if kwargs else (args,):
        for x in a:
            if isinstance(x, torch.Tensor):
                dt = x.dtype
                if dt in CARRIED:
                    return True
                if dt is torch.float16:
                    half = True
                elif dt.is_complex:
                    cplx = True
            elif type(x) is complex:
                cplx = True
            elif isinstance(x, (list, tuple)):
                for y in x:
                    if isinstance(y, torch.Tensor) and y.dtype in CARRIED:
                        return True
    return half and cplx and not getattr(_plain, "on", False)


# set (per thread: a guard of this call stack) while a call that involved() flagged only for
# float16 with a complex operand runs as it is, CPU having said its result is not complex32
_plain = threading.local()


def _verdict(op, args, kwargs):
    """(CPU's exception or None, the dtypes of CPU's results), once per signature."""
    from . import argcheck

    key = argcheck.signature(op, args, kwargs)
    found = _verdicts.get(key) if key is not None else None
    if found is not None:
        return found
    cargs, ckwargs = argcheck.convert(args, kwargs, argcheck.cpu_of)
    err, dtypes = None, None
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = op(*cargs, **ckwargs)
        dtypes = tree_map(lambda r: r.dtype if isinstance(r, torch.Tensor) else None, res)
    except Exception as e:  # noqa: BLE001  (CPU's verdict: its class and message, named)
        try:
            cpu = type(e)(str(e))
        except Exception:  # noqa: BLE001  (an exception class with its own constructor)
            cpu = RuntimeError(str(e))
        try:
            argcheck.raise_as_cpu(cpu, str(op).removeprefix("aten."), args, kwargs)
        except Exception as named:  # noqa: BLE001
            err = named
    del cargs, ckwargs
    found = (err, dtypes)
    if key is not None:
        _verdicts[key] = found
    return found


def call(op, args, kwargs, run):
    """The op on carried-dtype arguments: CPU's error, or `run(args, kwargs)` on carriers with
    the results in CPU's dtypes (see the module doc)."""
    err, dtypes = _verdict(op, args, kwargs)
    if err is not None:
        raise type(err)(*err.args) if type(err) in (RuntimeError, NotImplementedError, TypeError,
                                                     ValueError, IndexError) else err
    name = op._schema.name
    if _promotes_half(args, kwargs) and _in_complex32(name, args, dtypes):
        # float16 with a complex scalar (or 0-d complex tensor), computed in complex32: CPU's
        # TensorIterator casts the float16 operands to complex32 (exact) first
        half = lambda a: a.to(torch.complex32) if isinstance(a, torch.Tensor) and a.dtype == torch.float16 \
            and a.device.type == "tpu" else a  # noqa: E731
        args, kwargs = tree_map(half, (tuple(args), kwargs))
        return call(op, args, kwargs, run)
    if not _carries(args, kwargs):  # float16 with complex64 (say): nothing carried, run it as it is
        was = getattr(_plain, "on", False)
        _plain.on = True
        try:
            return run(tuple(args), kwargs)
        finally:
            _plain.on = was
    if name in _ALPHA and op._overloadname in ("Tensor", "Scalar") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.complex32 for a in args[:2]):
        res = _alpha_sum(name, *args, half=dtypes == torch.complex32, **kwargs)
        if name.endswith("_"):
            store(args[0], res)
            return args[0]
        # CPU's result dtype: complex32 also with a 0-d complex64 tensor as the other operand
        return narrow(res) if dtypes == torch.complex32 else res
    all32 = all(isinstance(a, torch.Tensor) and a.dtype == torch.complex32 for a in args[:3])
    if name == "aten::addcmul" and not op._schema.is_mutable and all32:
        return _addcmul(*args, **kwargs)
    out = kwargs.get("out") if name == "aten::addcmul" and op._overloadname == "out" else None
    if out is not None and all32 and out.dtype == torch.complex32:
        res = _addcmul(*args, **{k: v for k, v in kwargs.items() if k != "out"})
        if out.shape != res.shape:
            out.resize_(res.shape)
        store(out, widen(res))
        return out
    if name == "aten::addcmul_" and all32:
        self = args[0]
        store(self, widen(_addcmul(*args, **kwargs)))
        return self
    widened = {}  # id(complex32 argument) -> (argument, its complex64 copy)
    viewed = {}  # id(carrier view) -> the sub-byte argument it views
    moves = _MOVES
    if name.split("::")[-1] in _BYTE_MOVES and _plain_complex32(op, args, kwargs, dtypes):
        moves = CARRIED

    def conv(a):
        if isinstance(a, torch.Tensor) and a.device.type == "tpu":
            if a.dtype in moves:
                v = a.view(CARRIED[a.dtype])
                viewed[id(v)] = (v, a)
                return v
            if a.dtype == torch.complex32:
                w = widened.get(id(a))
                if w is None:
                    w = widened[id(a)] = (a, widen(a))
                return w[1]
        if a is torch.complex32:
            return torch.complex64
        if isinstance(a, torch.dtype) and a in moves:
            return CARRIED[a]
        return a

    if _in_complex32(name, args, dtypes):
        # CPU casts every operand to the common dtype complex32 before computing: a Python
        # float/complex scalar or a 0-d CPU tensor is rounded to float16 parts first
        base = conv
        conv = lambda a: base(_rounded(a))  # noqa: E731

    cargs, ckwargs = tree_map(conv, (list(args), kwargs))
    res = run(tuple(cargs), ckwargs)
    back = {id(w): a for a, w in widened.values()}
    back.update({k: a for k, (_, a) in viewed.items()})
    for i, a in enumerate(op._schema.arguments):  # mutated complex32 arguments: rounded back
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor) \
                and id(v) in widened:
            store(v, widened[id(v)][1])

    def fix(r, want):
        if not isinstance(r, torch.Tensor) or want is None:
            return r
        orig = back.get(id(r))
        if orig is not None:  # an in-place op's self, returned
            return orig
        if r.dtype == want:
            return r
        if want in moves:
            return r.view(want)
        if want == torch.complex32:
            return narrow(r)
        return r.to(want)

    if isinstance(res, (list, tuple)) and isinstance(dtypes, (list, tuple)):
        return type(res)(fix(r, d) for r, d in zip(res, dtypes))
    return fix(res, dtypes)


def _carries(args, kwargs) -> bool:
    """A tensor of a carried dtype among the arguments, or a carried dtype named."""
    return any((isinstance(a, torch.Tensor) and a.dtype in CARRIED) or (isinstance(a, torch.dtype) and a in CARRIED)
               for a in tree_leaves((args, kwargs)))


def _promotes_half(args, kwargs) -> bool:
    """A float16 tpu tensor and a complex operand that is not complex32 (a Python complex, a
    complex tensor): their promotion may be complex32."""
    half = cplx = False
    for a in tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            half |= a.dtype == torch.float16 and a.device.type == "tpu"
            cplx |= a.is_complex() and a.dtype != torch.complex32
        elif type(a) is complex:
            cplx = True
    return half and cplx


def _in_complex32(name, args, dtypes) -> bool:
    """CPU computes the call in complex32: a complex32 result, or a comparison of complex32
    tensors with scalars."""
    if any(d == torch.complex32 for d in tree_leaves(dtypes)):
        return True
    return name in ("aten::eq", "aten::ne") and all(
        a.dtype == torch.complex32 or a.dim() == 0 and a.device.type == "cpu"
        for a in args[:2] if isinstance(a, torch.Tensor))


def _rounded(a):
    """A Python float/complex (or 0-d CPU float/complex tensor) as complex32 holds it."""
    if type(a) in (float, complex):
        c = torch.tensor(a, dtype=torch.complex64).to(torch.complex32).to(torch.complex64).item()
        return c if type(a) is complex else c.real
    if isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.dim() == 0 \
            and (a.is_complex() or a.is_floating_point()) and a.dtype != torch.complex32:
        return a.to(torch.complex32).to(torch.complex64) if a.is_complex() else a.half()
    return a


def _plain_complex32(op, args, kwargs, dtypes) -> bool:
    """Every tensor of the call and result (CPU's) is complex32 or not complex, none conjugated,
    and no Scalar is complex: a move of complex32 elements is a move of their bits."""
    same = op._schema.name in ("aten::copy_", "aten::_to_copy")  # a cast is not a move
    for a in tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            if (a.is_complex() or a.is_floating_point() or same) and (a.dtype != torch.complex32 or a.is_conj()):
                return False
        elif isinstance(a, complex) or (isinstance(a, torch.dtype) and a.is_complex and a != torch.complex32):
            return False
    return all(d is None or d == torch.complex32 or not (d.is_complex or d.is_floating_point or same)
               for d in tree_leaves(dtypes))


def complex_of_halves(real, imag, run):
    """torch.complex of two float16 tensors: complex32, its parts placed as they are (XLA has
    no complex32 to compute into); other dtypes go to `run`, the lowering."""
    if real.dtype == imag.dtype == torch.float16 and real.device.type == "tpu":
        re, im = torch.broadcast_tensors(real, imag)
        return torch.view_as_complex(torch.stack([re, im], -1))
    return run(real, imag)


_ALPHA = frozenset(["aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::rsub"])


def _alpha_sum(name, self, other, alpha=1, half=True):
    """add / sub / rsub with a complex32 operand as CPU's kernel computes them: a + alpha * b (sub:
    -alpha), each operation in complex<float> rounded to complex32 where the result is complex32
    (`half`: c10::complex<Half> arithmetic; a scalar operand and alpha rounded first, the product
    by alpha a full complex product even for alpha 1, so an infinite part of b meets 0 * inf:
    NaN, as on CPU); in complex64 (or wider) otherwise. The sum is unrounded: call() rounds it."""
    a = widen(self) if isinstance(self, torch.Tensor) and self.dtype == torch.complex32 else self
    b = widen(other) if isinstance(other, torch.Tensor) and other.dtype == torch.complex32 else other
    if name == "aten::rsub":
        a, b = b, a
    if half:
        a, b = _rounded(a), _rounded(b)
    if not isinstance(a, torch.Tensor):
        a = torch.tensor(a, dtype=torch.complex64)
    if not isinstance(b, torch.Tensor):
        b = torch.tensor(b, dtype=torch.complex64)
    alpha = complex(alpha)
    if name != "aten::add" and name != "aten::add_":  # a + (-alpha) * b, as CPU's sub
        alpha = -alpha
    alpha = torch.tensor(_rounded(alpha) if half else alpha, dtype=torch.complex64)
    dev = a.device if a.device.type == "tpu" else b.device
    prod = b.to(torch.complex64) * alpha if b.device.type == "cpu" else b * alpha.to(b.device)
    if half:
        prod = widen(narrow(prod.to(dev)))
    return a.to(dev) + prod.to(dev) if a.dim() == 0 and a.device.type == "cpu" else a + prod


def _addcmul(self, tensor1, tensor2, *, value=1):
    """addcmul on complex32 as CPU's kernel computes it: self + value * t1 * t2 in
    c10::complex<Half> arithmetic, where each operation runs in complex<float> and rounds to
    complex32 (the value too): three roundings, not the one of a complex64 computation."""
    v = torch.tensor(complex(value), dtype=torch.complex64).to(torch.complex32).to(torch.complex64).item()
    p = narrow(widen(tensor1) * v)
    p = narrow(widen(p) * widen(tensor2))
    return narrow(widen(self) + widen(p))


def widen(t: torch.Tensor) -> torch.Tensor:
    """complex32 -> complex64 (exact), on tpu: its float16 parts read through a view."""
    if t.is_conj():
        return widen(t.conj()).conj()
    return torch.view_as_complex(torch.view_as_real(t).float())


def narrow(c: torch.Tensor) -> torch.Tensor:
    """complex64 -> complex32, each part rounded as c10 rounds float32 to float16."""
    if c.dtype != torch.complex64:
        c = c.to(torch.complex64)
    return torch.view_as_complex(torch.view_as_real(c.resolve_conj()).half())


def store(dst: torch.Tensor, c: torch.Tensor) -> None:
    """Write complex64 `c` rounded to complex32 into `dst` (complex32), through the carrier."""
    dst.view(torch.uint32).copy_(narrow(c).view(torch.uint32))


def graph_holds(gm) -> bool:
    """A traced graph computes on a carried dtype (compile/__init__.py runs it op by op)."""
    for node in gm.graph.nodes:
        for v in tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.Tensor) and v.dtype in CARRIED:
                return True
    return False
