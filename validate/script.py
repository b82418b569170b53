"""What a user's script offers, read from its source without running it.

``neuron-validate`` supports two conventions:

* **functions**: the script defines ``get_model()`` and ``get_inputs()`` (or
  the values ``model`` and ``example_inputs``), optionally ``loss_fn`` and
  ``get_optimizer(params)``. It is imported (``__name__`` is not
  ``"__main__"``) and the harness drives the model.
* **training**: any other script, typically an unchanged training loop
  written against ``torch.accelerator`` or a ``--device`` argument. It runs as
  ``__main__`` once per side, and the harness watches it.

Reading the AST first gives a syntax error or a half-followed convention a
one-line message before any process starts, and tells whether the script
declares a ``--device`` option that the harness can fill in per side.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

from conformance.paths import short_path

FUNCTIONS = "functions"
TRAINING = "training"
MODEL_NAMES = ("get_model", "model")
INPUT_NAMES = ("get_inputs", "example_inputs")


class ScriptError(Exception):
    """A script that cannot be validated (missing, unparsable, broken): one line, exit code 2."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptInfo:
    path: str  # absolute
    convention: str  # functions | training
    model_name: str | None  # get_model or model (functions convention)
    inputs_name: str | None  # get_inputs or example_inputs
    has_loss_fn: bool
    has_optimizer: bool
    device_option: str | None  # "--device" when the script's argparse declares it
    calls_backward: bool  # a `.backward(` call appears in the source (a hint, not a promise)
    # The device types the source spells in string constants ("neuron" of torch.device("neuron"), "neuron:0",
    # f"neuron:{rank}"): a script that names the target's device itself (validate.run)
    device_words: frozenset[str] = frozenset()
    # Picks CUDA (torch.cuda.is_available()) with no other way to choose its device (no torch.accelerator, no
    # --device option): elsewhere it trains on the CPU, so the check takes its cuda for the target's device
    written_for_cuda: bool = False
    # The model libraries the script imports (of PRELOADABLE): its sides' workers are forked with them imported
    libraries: tuple[str, ...] = ()

    def names_device(self, device_type: str) -> bool:
        return device_type in self.device_words

    @property
    def display(self) -> str:
        return short_path(self.path)


def _top_level_names(tree: ast.Module) -> dict[str, str]:
    """Top-level names bound by the module: name -> 'function' | 'value'."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = "function"
        elif isinstance(node, ast.ClassDef):
            names[node.name] = "class"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names[n.id] = "value"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = "import"
    return names


# Libraries that take seconds to import and do nothing else when imported: a check imports them once for each
# side's zygote (validate.execute), not once in each of its eight sides' processes.
PRELOADABLE = ("torchvision", "timm", "transformers", "diffusers")


def _libraries(tree: ast.Module) -> tuple[str, ...]:
    """The PRELOADABLE libraries the script imports anywhere in its source."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return tuple(name for name in PRELOADABLE if name in found)


def _device_option(tree: ast.Module) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in ("--device", "--device-type"):
                    return arg.value
    return None


def _calls_backward(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "backward":
                return True
    return False


_DEVICE_STRING = re.compile(r"([a-z][a-z0-9_]*)(:\d+)?")


def device_type_of(text: str) -> str | None:
    """The device type of a string shaped like a device string (``"neuron"``, ``"neuron:1"``, the head
    ``"neuron:"`` of an f-string), else None; many such strings are other words."""
    match = _DEVICE_STRING.fullmatch(text) or _DEVICE_STRING.fullmatch(text.removesuffix(":"))
    return match.group(1) if match else None


def _device_words(tree: ast.Module) -> frozenset[str]:
    """The type of every string constant shaped like a device string: they only matter if one is the target's
    name."""
    return frozenset(word for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= 32
                     and (word := device_type_of(node.value)))


def _attribute_paths(tree: ast.Module) -> set[str]:
    """Every dotted name the source reads (``torch.cuda.is_available``), outermost chains and their heads."""
    paths = set()
    for node in ast.walk(tree):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and parts:
            paths.add(".".join([node.id, *reversed(parts)]))
    return paths


def _written_for_cuda(tree: ast.Module, device_option: str | None) -> bool:
    paths = _attribute_paths(tree)
    picks_cuda = any(p.endswith("cuda.is_available") for p in paths)
    return picks_cuda and device_option is None and not any(".accelerator" in p for p in paths)


def inspect_script(path: str) -> ScriptInfo:
    """Reads the script's source; raises ScriptError (one line) when it cannot be validated."""
    if not path:
        raise ScriptError("no script given: usage: neuron-validate SCRIPT [options]")
    full = os.path.abspath(path)
    if not os.path.exists(full):
        raise ScriptError(f"{path}: no such file")
    if os.path.isdir(full):
        raise ScriptError(f"{path}: is a directory; expected a Python script")
    if not full.endswith(".py"):
        raise ScriptError(f"{path}: expected a Python script ending in .py")
    try:
        with open(full, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        tree = ast.parse(source, filename=full)
    except SyntaxError as exc:
        where = f"{short_path(full)}:{exc.lineno}" if exc.lineno else short_path(full)
        raise ScriptError(f"{where}: syntax error: {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise ScriptError(f"{path}: not a Python source file: {exc}") from None
    names = _top_level_names(tree)
    model_name = next((n for n in MODEL_NAMES if n in names and names[n] in ("function", "value")), None)
    inputs_name = next((n for n in INPUT_NAMES if n in names and names[n] in ("function", "value")), None)
    if model_name == "get_model" and names["get_model"] != "function":
        model_name = None
    if model_name == "get_model" and inputs_name is None:
        raise ScriptError(f"{short_path(full)}: defines get_model() but no get_inputs() (or example_inputs): "
                          "the harness needs inputs to run the model")
    if inputs_name is not None and model_name is None:
        raise ScriptError(f"{short_path(full)}: defines {inputs_name} but no get_model() (or model)")
    functions = model_name is not None and inputs_name is not None
    device_option = _device_option(tree)
    return ScriptInfo(
        path=full,
        convention=FUNCTIONS if functions else TRAINING,
        model_name=model_name if functions else None,
        inputs_name=inputs_name if functions else None,
        has_loss_fn="loss_fn" in names,
        has_optimizer="get_optimizer" in names,
        device_option=device_option,
        calls_backward=_calls_backward(tree),
        device_words=_device_words(tree),
        written_for_cuda=_written_for_cuda(tree, device_option),
        libraries=_libraries(tree),
    )
