import os
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

import torchtpu  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "xfail_in(mode, reason): an op-suite test fails in that mode (conftest)")


@pytest.fixture
def no_fallback():
    """Run the test with the CPU fallback forbidden, so any missing lowering fails loudly."""
    torchtpu.set_fallback(False)
    try:
        yield
    finally:
        torchtpu.set_fallback(True)


@pytest.fixture
def gate_open():
    """The C++ gate's sticky reasons off for the test (a carried dtype or a second device seen
    by an earlier test in this process closes it for good), as in a process that never met them."""
    from torchtpu.runtime import placement
    from torchtpu.runtime.jaxenv import CARRIED_SEEN

    cells = (CARRIED_SEEN, placement.SPREAD)
    was = [c[0] for c in cells]
    for c in cells:
        c[0] = False
    try:
        yield
    finally:
        for c, v in zip(cells, was):
            c[0] = v


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# ---- the same program on CPU and on tpu ------------------------------------------------------
#
# One comparison for every test file: `check(fn, *args)` runs fn on the CPU tensors given and
# on the same tensors moved to tpu (args and kwargs, nested lists/tuples/dicts too), then
# `assert_same` compares the results leaf by leaf. Test files import them with
# `from conftest import check` (pytest puts tests/ on sys.path).


def to_tpu(x):
    """`x` with every tensor in it moved to tpu (lists, tuples and dicts walked)."""
    return tree_map(lambda a: a.to("tpu") if isinstance(a, torch.Tensor) else a, x)


def to_cpu(x):
    return tree_map(lambda a: a.cpu() if isinstance(a, torch.Tensor) else a, x)


def assert_same(tpu, cpu, *, atol=None, rtol=None, equal_nan=False, check_dtype=True, check_stride=False,
                device="tpu", msg=None):
    """`tpu` matches the CPU result `cpu`: the same structure; each tensor on tpu with CPU's
    shape, dtype (unless check_dtype=False), strides (if check_stride) and values (within
    atol/rtol, assert_close's defaults for the dtype when None; NaN equal to NaN only if
    equal_nan); each non-tensor leaf equal. `msg` (what is compared) heads a failure.
    atol may also be a function of the CPU tensor giving its absolute tolerance (atol_by_scale:
    one relative to the reference's magnitude). device="cpu": the result side is host memory
    the backend produced, so its tensors must be on the CPU instead (a tpu result copied back,
    a pinned copy, a tpu op run on CPU tensors)."""
    got, got_spec = tree_flatten(tpu)
    want, want_spec = tree_flatten(cpu)
    assert got_spec == want_spec, f"structure: tpu {got_spec} vs cpu {want_spec}"
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.device.type == device, f"not a {device} tensor: {g!r}"
    assert_values(tpu, cpu, atol=atol, rtol=rtol, equal_nan=equal_nan, check_dtype=check_dtype,
                  check_stride=check_stride, msg=msg)


# ---- the modes a test runs in ----------------------------------------------------------------
#
# As PyTorch instantiates a device-generic test once per device, a test here is instantiated
# once per execution mode: `@pytest.mark.parametrize("mode", modes())` for a test that takes
# the mode, or, for a whole file of op tests, `pytestmark = IN_EVERY_MODE`: each of its tests
# runs in strict, defer_and_fuse and compile, and `check` runs the tpu side in that mode.
# `make test` runs strict; the other two are in the slow tier (`pytest -m slow`) with the
# OpInfo sweeps (`python -m torchtpu.validate ops --mode ...`).

MODES = ("strict", "defer_and_fuse", "compile")
EAGER_MODES = ("strict", "defer_and_fuse")
ALL_MODES = ("strict", "debug", "defer_and_fuse", "compile")


def modes(*names: str, slow=()) -> list:
    """pytest params of `names` (default MODES); those in `slow` marked slow."""
    return [pytest.param(m, marks=pytest.mark.slow, id=m) if m in slow else pytest.param(m, id=m)
            for m in (names or MODES)]


_instantiated = [None]  # the mode of the op-suite test running now (None: the ambient eager mode)


def xfail_in(mode: str, reason: str):
    """Mark an op-suite test as failing in one of its instantiations, with the cause (strict:
    the day it passes, the mark must go)."""
    return pytest.mark.xfail_in(mode, reason)


@pytest.fixture(params=modes(slow=("defer_and_fuse", "compile")))
def suite_mode(request):
    """The op suite's instantiation: the test body in this mode's eager mode (strict under
    compile: what check() does not compile runs eagerly), check() in the mode."""
    for m in request.node.iter_markers("xfail_in"):
        if m.args[0] == request.param:
            request.applymarker(pytest.mark.xfail(reason=m.args[1], strict=True))
    _instantiated[0] = request.param
    try:
        with torchtpu.eager_mode("strict" if request.param == "compile" else request.param):
            yield request.param
    finally:
        _instantiated[0] = None


IN_EVERY_MODE = pytest.mark.usefixtures("suite_mode")


def in_mode(fn, mode=None):
    """`fn` as the mode runs it on tpu: compiled with the tpu backend in "compile" (a fresh
    Dynamo cache, so every call traces and none falls back to eager past a recompile limit),
    else as is (the eager mode is the caller's)."""
    mode = mode or _instantiated[0]
    if mode != "compile":
        return fn
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu")


def check(fn, *args, atol=None, rtol=None, equal_nan=False, check_dtype=True, check_stride=False,
          both=False, grad=False, tpu_mode=None, raises=False, **kwargs):
    """Run `fn(*args, **kwargs)` on the CPU tensors given and on them moved to tpu (in the
    test's mode, see in_mode), and assert_same the results. With `grad`, also backward: every
    floating or complex input tensor (grad=True) or those of the positional arguments at the
    positions given (grad=(0, 2)) requires grad, each output that requires grad gets the same
    random cotangent on both sides, and those inputs' gradients must match too (strides as well
    with check_stride). Returns the tpu result, or (the tpu result on the CPU, the CPU result)
    with both=True.
    tpu_mode: run the tpu side, forward and backward, in this mode rather than the op suite's
    (for a test parametrized by mode; see _in_tpu_mode). raises: CPU raising is an outcome too,
    the tpu side must then raise the same exception class with CPU's first message line (its
    result read back, so a deferred error surfaces); returns the tpu exception."""
    tol = dict(atol=atol, rtol=rtol, equal_nan=equal_nan, check_dtype=check_dtype)
    targs, tkwargs = to_tpu((_detached(args), _detached(kwargs)))
    if grad:
        args, kwargs = _requiring_grad(args, kwargs, grad)
        targs, tkwargs = _requiring_grad(targs, tkwargs, grad)
    if raises:
        cpu, error = _outcome_as_cpu(fn, args, kwargs, targs, tkwargs, tpu_mode)
        if error is not None:
            return error
    else:
        cpu = fn(*args, **kwargs)
    with _in_tpu_mode(tpu_mode):
        tpu = in_mode(fn, tpu_mode)(*targs, **tkwargs)
        assert_same(tpu, cpu, check_stride=check_stride, **tol)
        if grad:
            _check_grads(tpu, cpu, (targs, tkwargs), (args, kwargs), dict(tol, check_stride=check_stride))
    return (to_cpu(tpu), cpu) if both else tpu


def _requiring_grad(args, kwargs, grad):
    if grad is True:
        return _leaves_requiring_grad((args, kwargs))
    return tuple(_leaves_requiring_grad(a) if i in grad else a for i, a in enumerate(args)), kwargs


def _differentiable(t) -> bool:
    return isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex)


def _detached(x):
    return tree_map(lambda a: a.detach() if isinstance(a, torch.Tensor) else a, x)


def _leaves_requiring_grad(x):
    return tree_map(lambda a: a.detach().requires_grad_() if _differentiable(a) else a, x)


def _check_grads(tpu, cpu, tpu_inputs, cpu_inputs, tol):
    outs_c = [o for o in tree_flatten(cpu)[0] if _differentiable(o) and o.requires_grad]
    outs_t = [o for o in tree_flatten(tpu)[0] if _differentiable(o) and o.requires_grad]
    assert len(outs_c) == len(outs_t), "outputs that require grad differ"
    ins_c = [i for i in tree_flatten(cpu_inputs)[0] if _differentiable(i) and i.requires_grad]
    ins_t = [i for i in tree_flatten(tpu_inputs)[0] if _differentiable(i) and i.requires_grad]
    if not outs_c:
        return
    cot = [torch.randn_like(o) for o in outs_c]
    got = torch.autograd.grad(outs_t, ins_t, [c.to("tpu") for c in cot], allow_unused=True)
    want = torch.autograd.grad(outs_c, ins_c, cot, allow_unused=True)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), f"input {i}: gradient {'missing' if g is None else 'extra'} on tpu"
        if w is not None:
            assert_same(g, w, **tol)


def run_in_mode(mode, fn, *args):
    """fn on the tpu copies of args in `mode`; the result back on the CPU
    ("compile": torch.compile(fn, backend="tpu"), eager in strict)."""
    targs = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torchtpu.eager_mode("strict" if mode == "compile" else mode):
            out = in_mode(fn, mode)(*targs)
        return out.cpu() if isinstance(out, torch.Tensor) else out


# ---- added for group A ----
#
# For a tpu program checked against a different CPU program (a kernel library's op against
# the PyTorch functions it replaces) and for tolerances that follow the reference's scale.


def check_against(fn, ref, *args, **kwargs):
    """check() with `fn` on the tpu side and `ref`, the same math in other ops, on the CPU
    side: the same arguments, tolerances, gradients (grad=, one shared random cotangent) and
    mode. Which side a call is on is told by its first tensor argument's device."""
    def either(*a, **k):
        first = next(t for t in tree_flatten((a, k))[0] if isinstance(t, torch.Tensor))
        return (ref if first.device.type == "cpu" else fn)(*a, **k)

    return check(either, *args, **kwargs)


def atol_by_scale(tol):
    """An atol for assert_same/check: `tol` times the reference's largest magnitude, at least
    `tol` (sums of products cancel: an absolute error scales with the terms, not the result)."""
    return lambda want: tol * max(1.0, want.abs().max().item()) if want.numel() else tol


def inplace(fn):
    """`fn`, an in-place op, as a function of the same arguments returning what it mutated (its
    first argument: a tensor or a list of them), so check() compares the mutated values on both
    sides. check hands the CPU side the tensors given: pass copies (check makes the tpu ones)."""
    def returning_self(self, *args, **kwargs):
        fn(self, *args, **kwargs)
        return self

    return returning_self
# ---- added for group B ----
#
# Comparisons that are not "a tpu result against CPU's" (assert_values), bit-for-bit ones
# (assert_bits), and what check's tpu_mode= and raises= use.


def assert_values(got, want, *, atol=None, rtol=None, equal_nan=False, check_dtype=True, check_stride=False,
                  msg=None):
    """`got` matches `want` as assert_same compares (structure, then each tensor's shape, dtype,
    strides if check_stride, values within atol/rtol, atol perhaps a function of the reference
    tensor; each other leaf equal), where neither side
    need be on tpu: tpu tensors on either side are read back first. For the comparisons that are
    not a tpu result against a CPU reference: two tpu results (one mode against another, before
    and after a state restore), a CPU round trip (save/load), values from a subprocess or a
    distributed job, a result against literal values. A tpu result against a CPU computation
    is assert_same, which also asserts the result is on tpu."""
    head = f"{msg}: " if msg else ""
    got, got_spec = tree_flatten(got)
    want, want_spec = tree_flatten(want)
    assert got_spec == want_spec, f"{head}structure: {got_spec} vs {want_spec}"
    for g, w in zip(got, want):
        if not isinstance(w, (torch.Tensor, int, float, complex)):  # None, str, dtype, ...
            assert g == w, f"{head}{g!r} vs {w!r}"
            continue
        if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and check_stride:
            assert g.stride() == w.stride(), f"{head}strides: {g.stride()} vs {w.stride()}"  # before a read back
        w = to_cpu(w)
        torch.testing.assert_close(to_cpu(g), w, atol=atol(w) if callable(atol) else atol, rtol=rtol,
                                   equal_nan=equal_nan, check_dtype=check_dtype, msg=_headed(msg))


def _headed(msg):
    """assert_close's msg: its own message headed by `msg` (None: its own message only)."""
    return None if msg is None else (lambda m: f"{msg}: {m}")


def _bits(t):
    """A tensor as comparable bits: every floating or complex dtype viewed as the integer of its
    size (float8/float4 as uint8, complex32 as int32, complex128 as its two parts' int64s), so
    NaN payloads, -0 and every rounding count; other dtypes as they are."""
    if t.dtype == torch.complex128:  # no 16-byte integer: both parts' bits
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.dtype.itemsize])
    return t


def assert_bits(got, want, msg=None):
    """`got` is `want` bit for bit: the same dtype and shape and the same bits in every element
    (see _bits), on any device (tpu tensors read back)."""
    got, want = to_cpu(got), to_cpu(want)
    head = f"{msg}: " if msg else ""
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{head}got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}"
    g, w = _bits(got), _bits(want)
    if not torch.equal(g, w):
        bad = (g != w).nonzero().flatten()[:5]
        raise AssertionError(f"{head}{(g != w).sum().item()} differ, e.g. at {bad.tolist()}: "
                             f"got {g.flatten()[bad].tolist()} want {w.flatten()[bad].tolist()}")


def _in_tpu_mode(mode):
    """The eager mode check(tpu_mode=mode) runs the tpu side in: the mode's own, strict under
    "compile" (in_mode compiles fn; the rest runs eagerly); None: the caller's."""
    import contextlib
    if mode is None:
        return contextlib.nullcontext()
    return torchtpu.eager_mode("strict" if mode == "compile" else mode)


def _outcome_as_cpu(fn, args, kwargs, targs, tkwargs, mode):
    """(CPU's result, None) if fn runs on CPU; else (None, the exception the tpu side raises),
    which must be of the class CPU raised, with CPU's first message line in its message."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  (the outcome compared: class and message)
        want = e
    try:
        with _in_tpu_mode(mode):
            to_cpu(in_mode(fn, mode)(*targs, **tkwargs))
    except Exception as e:  # noqa: BLE001
        got = e
    else:
        raise AssertionError(f"CPU raises {type(want).__name__}: {want}; tpu returned")
    first = str(want).split("\n")[0]
    assert type(got) is type(want) and first in str(got), \
        f"CPU raises {type(want).__name__}: {first}; tpu {type(got).__name__}: {got}"
    return None, got
