"""Builds torchtpu's five small C++ extensions: torchtpu/runtime/_generator
(csrc/generator.cpp: torch.Generator(device="tpu")), torchtpu/device/_pinned_factories
(csrc/pinned_factories.cpp: torch.empty(..., pin_memory=True) and the factories over it) and
torchtpu/runtime/_device_guard (csrc/device_guard.cpp: the device guard, never entering Python, and
tensors made on a given device index) and torchtpu/runtime/_scan (csrc/scan.cpp: the quick key of an
op call, read off its arguments in one pass) and torchtpu/runtime/_hit (csrc/hit.cpp: a strict op's
cache hit, a defer_and_fuse record (csrc/record.h), a compiled graph's call and a new tensor's
storage entry, without Python frames).

Everything else is declared in pyproject.toml. The extension links against the installed
torch, so it is built with torch importable: `pip install --no-build-isolation -e .`
(the Makefile's venv rule). No ninja: each source file compiles in well under a minute.
"""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension("torchtpu.runtime._generator", ["csrc/generator.cpp"], extra_compile_args=["-O1"]),
        CppExtension("torchtpu.device._pinned_factories", ["csrc/pinned_factories.cpp"], extra_compile_args=["-O1"]),
        CppExtension("torchtpu.runtime._device_guard", ["csrc/device_guard.cpp"], extra_compile_args=["-O1"]),
        # on every op call's path: optimized
        CppExtension("torchtpu.runtime._scan", ["csrc/scan.cpp"], depends=["csrc/walk.h"], extra_compile_args=["-O2"]),
        CppExtension("torchtpu.runtime._hit", ["csrc/hit.cpp"], depends=["csrc/walk.h", "csrc/record.h", "csrc/slots.h", "csrc/kernel.h", "csrc/boxed.h", "csrc/views.h", "csrc/gil_lock.h", "csrc/held.h"], extra_compile_args=["-O2"]),
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
