"""The ops' kernels registered as C++ boxed kernels (csrc/boxed.h) instead of through
torch.library's PythonKernelHolder, and storage._lock as a GilLock (csrc/gil_lock.h): the
arguments reach the kernel as PyTorch would pass them (keyword-only arguments, defaults,
dtypes, wrapped numbers, optional tensors), results and errors come back as on CPU, on the
main thread and on the autograd engine's, and the lock keeps the byte counts right under threads."""
import gc
import threading

import pytest
import torch

from conftest import assert_same, to_tpu
from torchtpu.runtime import storage, tensors

pytestmark = pytest.mark.skipif(tensors.native is None, reason="the C++ extensions were not built")


def test_registered_in_cpp():
    dump = torch._C._dispatch_dump("aten::add.Tensor")
    line = next(ln for ln in dump.splitlines() if ln.startswith("PrivateUse1"))
    assert "boxed.h" in line, line


def _both(fn, *args):
    want = fn(*args)
    got = fn(*[to_tpu(a) for a in args])
    return want, got


@pytest.mark.parametrize("case", [
    lambda a, b: a + b,
    lambda a, b: a + 2,                     # a wrapped number
    lambda a, b: 2.5 * a - b,
    lambda a, b: torch.add(a, b, alpha=3),  # a non-default keyword argument
    lambda a, b: torch.sub(a, b, alpha=1),  # a default one, omitted as PyTorch omits it
    lambda a, b: a.sum(dim=0, dtype=torch.float64),  # a keyword-only dtype
    lambda a, b: a.sum(),
    lambda a, b: a.max(dim=1),              # two results (a named tuple)
    lambda a, b: torch.clamp(a, min=None, max=0.5),  # an optional number as None
    lambda a, b: torch.where(a > 0, a, b),
    lambda a, b: a.to(torch.int32) // 2,
    lambda a, b: torch.nn.functional.layer_norm(a, (5,), None, None),  # optional tensors as None
    lambda a, b: a.std(dim=1, correction=0, keepdim=True),
])
def test_arguments_as_cpu_sees_them(case):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    want, got = _both(case, a, b)
    for _ in range(2):  # the first call compiles; the next ones are cache hits served in C++
        got = case(to_tpu(a), to_tpu(b))
    if isinstance(want, tuple):
        assert type(got) is type(want)
        for w, g in zip(want, got):
            assert_same(g, w)
    else:
        assert_same(got, want)


def test_in_place_returns_the_same_object():
    p = torch.nn.Parameter(torch.randn(3, device="tpu"))
    with torch.no_grad():
        r = p.add_(1)
        r2 = p.mul_(torch.ones(3, device="tpu"))
    assert r is p and r2 is p and isinstance(r, torch.nn.Parameter)


def test_errors_keep_their_type_and_message():
    a = torch.randn(3, 4, device="tpu")
    b = torch.randn(5, 4, device="tpu")
    with pytest.raises(RuntimeError, match="size of tensor a"):
        a + b
    with pytest.raises(RuntimeError) as cpu:
        torch.randn(3, 4) + torch.randn(5, 4)
    with pytest.raises(type(cpu.value)):
        a + b


def test_an_error_on_the_autograd_engine_thread():
    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g + torch.ones(7, device="tpu")  # the wrong shape, raised in the tpu kernel

    x = torch.randn(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="size of tensor"):
        Bad.apply(x).sum().backward()
    # and a correct backward after it, on the same engine thread
    y = torch.randn(3, requires_grad=True)
    yt = y.detach().to("tpu").requires_grad_()
    (y * y).sum().backward()
    (yt * yt).sum().backward()
    assert_same(yt.grad, y.grad)


def test_gil_lock_is_reentrant_and_owned():
    lock = storage._lock
    assert type(lock).__name__ == "GilLock"
    assert not lock._is_owned()
    with lock:
        with lock:
            assert lock._is_owned()
        assert lock._is_owned()
    assert not lock._is_owned()
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()


def test_gil_lock_excludes_other_threads():
    lock = storage._lock
    seen = []
    with lock:
        t = threading.Thread(target=lambda: seen.append(lock.acquire(blocking=False)))
        t.start()
        t.join()
    assert seen == [False]
    # free again: another thread takes and gives it
    t = threading.Thread(target=lambda: seen.append(lock.acquire(blocking=False) and (lock.release() or True)))
    t.start()
    t.join()
    assert seen == [False, True]


def test_byte_counts_under_threads():
    # (earlier tests' garbage collected now, not while the counts are compared)
    gc.collect()
    gc.disable()
    try:
        _byte_counts_under_threads()
    finally:
        gc.enable()


def _byte_counts_under_threads():
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    a = torch.randn(64, device="tpu")
    base = torch.tpu.memory_allocated()
    errors = []

    def work():
        try:
            for _ in range(300):
                c = a + a
                d = c * 2
                del c, d
        except Exception as e:  # pragma: no cover (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert torch.tpu.memory_allocated() == base, (before, base, torch.tpu.memory_allocated())
    del a
    assert torch.tpu.memory_allocated() == before
