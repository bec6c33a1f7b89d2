"""Builds torchtpu's one C++ extension, torchtpu/runtime/_generator (csrc/generator.cpp).

Everything else is declared in pyproject.toml. The extension links against the installed
torch, so it is built with torch importable: `pip install --no-build-isolation -e .`
(the Makefile's venv rule). No ninja: one source file compiles in well under a minute.
"""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("torchtpu.runtime._generator", ["csrc/generator.cpp"],
                              extra_compile_args=["-O1"])],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
