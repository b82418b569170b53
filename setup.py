"""Builds the emulated Neuron device (a PrivateUse1 backend in C++).

Everything else about the distribution lives in pyproject.toml. The build
needs the installed torch's headers, so install with --no-build-isolation
(see the README); it needs no network.
"""
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

CSRC = Path("conformance/emulator/csrc")

setup(
    ext_modules=[
        CppExtension(
            name="conformance.emulator._C",
            sources=sorted(str(p) for p in CSRC.glob("*.cpp")),
            extra_compile_args=["-O2", "-g0", "-std=c++20"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
