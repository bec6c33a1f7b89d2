"""Out of memory is a Python error, as on CUDA, never a crash (issue 16).

A program whose buffers do not fit raises torch.OutOfMemoryError (a RuntimeError) naming
what ran, in every mode, and is counted in memory_stats()["num_ooms"]. A compilation that
would start on an exhausted heap (XLA's compiler aborts the process with std::bad_alloc
there) first gives back cached executables, then raises torch.OutOfMemoryError. After
either, the process keeps working."""
import gc
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu
from torchtpu.runtime import cache
from conftest import MODES, assert_same, assert_values


def _big():
    y = torch.ones(2**36, device="tpu") * 2  # 256 GiB of float32, kept alive: it must exist
    return y, y.sum()


def _run(fn, mode):
    if mode == "compile":
        torch._dynamo.reset()
        return torch.compile(fn, backend="tpu")()
    with torchtpu.eager_mode(mode):
        out = fn()
        return [o.cpu() for o in out] if isinstance(out, tuple) else out.cpu()


def _works():
    assert_same(torch.arange(3.0, device="tpu") * 2, torch.arange(3.0) * 2)


@pytest.mark.parametrize("mode", MODES)
def test_program_that_does_not_fit_raises_out_of_memory(mode):
    before = torch.tpu.memory_stats()["num_ooms"]
    held = torch.tpu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError, match="out of memory running"):
        _run(_big, mode)
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    _works()
    # the failed call's tensors go with it (a failed region's storages kept the error, and its
    # traceback's frames kept the 256 GiB tensor: memory_allocated() said so for good)
    gc.collect()
    assert torch.tpu.memory_allocated() <= held


@pytest.mark.parametrize("mode", MODES)
def test_compile_without_headroom_raises_instead_of_aborting(mode, monkeypatch):
    x = torch.arange(5.0, device="tpu")
    x.cpu()
    # no machine has a petabyte free: every new compilation must refuse to start
    monkeypatch.setattr(cache, "COMPILE_HEADROOM_MB", 2.0**30)

    def new_program():
        return (torch.cos(x * 1.2345) + 0.5,)  # a shape/op combination no other test compiles

    with pytest.raises(torch.OutOfMemoryError, match="compilation of"):
        _run(new_program, mode)
    monkeypatch.undo()
    got = _run(new_program, mode)
    assert_values(got[0], torch.cos(torch.arange(5.0) * 1.2345) + 0.5)  # _run read it back


@pytest.mark.parametrize("mode", MODES)
def test_compile_near_the_mapping_cap_raises_instead_of_aborting(mode, monkeypatch):
    # LLVM aborts the process when the kernel refuses it a mapping (vm.max_map_count); a cap
    # just above what the process maps now leaves no room for any compile
    x = torch.arange(5.0, device="tpu")
    x.cpu()
    before = torch.tpu.memory_stats()["num_ooms"]
    monkeypatch.setitem(cache._maps, "limit", cache.mappings() + 10)
    monkeypatch.setitem(cache._maps, "countdown", 0)

    def new_program():
        return (torch.sin(x * 1.98765) - 0.25,)  # a shape/op combination no other test compiles

    with pytest.raises(torch.OutOfMemoryError, match="memory mappings for the compilation of"):
        _run(new_program, mode)
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    monkeypatch.undo()
    cache._maps["countdown"] = 0
    got = _run(new_program, mode)
    assert_values(got[0], torch.sin(torch.arange(5.0) * 1.98765) - 0.25)


def test_mappings_are_counted_every_few_compiles_while_far_from_the_cap(monkeypatch):
    reads = []
    monkeypatch.setattr(cache, "mappings", lambda: reads.append(1) or 100)
    monkeypatch.setitem(cache._maps, "limit", 65530)
    monkeypatch.setitem(cache._maps, "countdown", 0)
    monkeypatch.setitem(cache._maps, "near", False)
    for _ in range(3 * (cache.MAPS_EVERY + 1) + 1):  # counted at the 1st call, then every MAPS_EVERY + 1
        assert cache.maps_short() is None
    assert len(reads) == 4
    monkeypatch.setattr(cache, "mappings", lambda: reads.append(1) or 65530 - cache.MAPS_HEADROOM - 1)
    cache._maps["countdown"] = 0
    assert cache.maps_short() is None and cache._maps["near"]  # near: counted at every compile now
    n = len(reads)
    assert cache.maps_short() is None and cache.maps_short() is None and len(reads) == n + 2


@pytest.mark.slow
def test_address_space_exhausted_during_compile_is_an_error_not_an_abort(tmp_path):
    # the real thing: 50 MB of address space left; XLA's compiler would die with
    # "terminate called after throwing an instance of 'std::bad_alloc'"
    script = textwrap.dedent("""
        import resource, torch, torchtpu
        x = torch.ones(64, device="tpu"); (x * 2).cpu()
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + 50 * 2**20, resource.RLIM_INFINITY))
        try:
            with torchtpu.eager_mode("defer_and_fuse"):
                y = x
                for i in range(600):
                    y = torch.sin(y * 1.0001 + i)
                y.sum().cpu()
            print("no error")
        except torch.OutOfMemoryError as e:
            print("OutOfMemoryError", e)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("after", (torch.arange(3.0, device="tpu") * 2).cpu().tolist())
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # (the loop's region compiles whole, or as chunks cut at its iterations: eager/region_plan.py)
    assert re.search(r"OutOfMemoryError torchtpu: out of memory for the compilation of a "
                     r"(fused region|chunk of \d+ ops of a region)", p.stdout), p.stdout
    assert "after [0.0, 2.0, 4.0]" in p.stdout
