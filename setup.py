"""Builds the emulated Neuron device (a PrivateUse1 backend in C++) and the host-copy watch's recorder.

Everything else about the distribution lives in pyproject.toml. The build
needs the installed torch's headers, so install with --no-build-isolation
(see the README); it needs no network.
"""
import os
from pathlib import Path

from setuptools import setup

# The build needs torch's headers, not its devices: an installed earlier version of this package may
# have left a backend entry point that no longer imports, which would make `import torch` fail here.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

CSRC = Path("emulator/csrc")
FLAGS = ["-O2", "-g0", "-std=c++20"]

setup(
    ext_modules=[
        CppExtension(
            name="emulator._C",
            sources=sorted(str(p) for p in CSRC.glob("*.cpp")),
            extra_compile_args=FLAGS,
        ),
        CppExtension(
            name="conformance._copy_recorder",
            sources=["conformance/csrc/copy_recorder.cpp"],
            extra_compile_args=FLAGS,
        ),
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
