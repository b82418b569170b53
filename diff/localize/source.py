"""Source lines: where in the user's code an op was called."""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Iterable

import torch

from conformance.paths import short_path

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The harness's own packages: an op called from them is not the user's.
_HARNESS_DIRS = tuple(os.path.join(_PROJECT, d) + os.sep for d in ("diff", "conformance", "emulator", "runner", "validate"))
_STDLIB_DIRS = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep})
_LIBRARY_DIRS = (_TORCH_DIR, *_HARNESS_DIRS, *_STDLIB_DIRS)


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceLine:
    """Where in the user's code an op was called."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.function}"

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function, "text": str(self)}


def _is_library(filename: str) -> bool:
    """torch, the harness, the standard library and code without a file; installed packages (transformers,
    timm) are not: the line inside them is where their op was called."""
    if filename.startswith("<"):
        return True
    return filename.startswith(_LIBRARY_DIRS) and f"{os.sep}site-packages{os.sep}" not in filename.replace(
        _TORCH_DIR, "")


def _path(filename: str) -> str:
    """An absolute path, except for code that has no file ("<string>": exec'd or generated code such as a
    dataclass's __init__), which must never be taken for a file of the working directory."""
    return filename if filename.startswith("<") else os.path.abspath(filename)


def find_source(frames: Iterable[tuple[str, int, str]], source_files: frozenset[str]) -> SourceLine | None:
    """The innermost frame in the user's files or outside torch, the harness and the stdlib: the line that
    called the op, in the user's code or in a library such as transformers that the user's code called.

    ``frames`` run from the innermost outward.
    """
    for filename, line, function in frames:
        if filename in source_files or not _is_library(filename):
            return SourceLine(file=filename, line=line, function=function)
    return None


def _python_frames(start) -> Iterable[tuple[str, int, str]]:
    frame = start
    while frame is not None:
        yield _path(frame.f_code.co_filename), frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back


def _traceback_frames(text: str) -> list[tuple[str, int, str]]:
    """Frames of an anomaly-mode traceback string, innermost first."""
    frames = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            try:
                name, rest = line[6:].split('", line ', 1)
                number, _, function = rest.partition(", in ")
                frames.append((_path(name), int(number), function.strip()))
            except ValueError:
                continue
    return frames[::-1]


def current_source(source_files: frozenset[str]) -> SourceLine | None:
    """The user's source line of the op running now (forward), or of the forward op behind a backward node."""
    node = torch._C._current_autograd_node()
    if node is not None:
        tb = node.metadata.get("traceback_") if hasattr(node, "metadata") else None
        if isinstance(tb, (list, tuple)):  # anomaly mode keeps traceback.format_stack()'s lines
            tb = "".join(tb)
        if isinstance(tb, str):
            return find_source(_traceback_frames(tb), source_files)
        return None
    return find_source(_python_frames(sys._getframe(2)), source_files)



def exception_frames(exc: BaseException) -> list[tuple[str, int, str]]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((_path(tb.tb_frame.f_code.co_filename), tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return frames[::-1]


