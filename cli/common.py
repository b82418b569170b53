"""What every command shares: target options, bad-input handling, exit codes.

Exit codes: 0 good, 1 the check found problems, 2 bad usage or input. Bad
input gets one line on stderr (``neuron-validate: error: ...``), never a
traceback unless ``--verbose``. Options that shape the emulated device
(``--emulator-profile``, ``--backend-module``) are applied to the environment
*before* torch is imported, so that worker processes and user scripts see
them too.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import sys
import traceback
from typing import Callable

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad usage or input: reported in one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def add_target_options(parser: argparse.ArgumentParser, *, default_target: str = "neuron") -> None:
    g = parser.add_argument_group("target")
    g.add_argument("--target", default=default_target, help="DEVICE[:MODE], e.g. neuron, neuron:compile, cuda, cpu:compile")
    g.add_argument("--reference", default="cpu", help="reference target (default: cpu)")
    g.add_argument("--backend-module", action="append", default=[], metavar="MOD",
                   help="import MOD first: it registers a backend (repeatable)")
    g.add_argument("--emulator-profile", default=None, metavar="NAME",
                   help="numerics profile of the emulated neuron device: a built-in name, NAME:key=value,... or a JSON file "
                        "(default: $NEURON_VALIDATE_EMULATOR_PROFILE or neuron-2.27)")
    g.add_argument("--precision-model", default=None, metavar="FILE",
                   help="JSON precision model of the target (which ops it computes at lower precision, and how much), "
                        "replacing the one derived from the target (default: $NEURON_VALIDATE_PRECISION_MODEL)")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")


def apply_environment(args) -> None:
    """Validates the emulator profile and sets the environment before torch is imported."""
    from emulator.profiles import PROFILE_ENV, ProfileError, resolve_profile

    if getattr(args, "emulator_profile", None):
        try:
            resolve_profile(args.emulator_profile)
        except ProfileError as exc:
            raise UsageError(str(exc)) from None
        os.environ[PROFILE_ENV] = args.emulator_profile
    elif os.environ.get(PROFILE_ENV):
        try:
            resolve_profile(os.environ[PROFILE_ENV])
        except ProfileError as exc:
            raise UsageError(f"${PROFILE_ENV}: {exc}") from None
    from conformance.target import apply_strict_neuronx_env

    apply_strict_neuronx_env()  # before any import of torch_neuronx, in this process and its children
    modules = getattr(args, "backend_module", None) or []
    if modules:
        # Another backend may need PrivateUse1: the emulator must not take it at `import torch`.
        os.environ["NEURON_VALIDATE_EMULATOR_AUTOLOAD"] = "0"
        os.environ["NEURON_VALIDATE_BACKEND_MODULES"] = ",".join(modules)
    faults = os.environ.get("NEURON_VALIDATE_FAULTS")
    if faults:
        from emulator.faults import FaultSpecError, parse_faults

        try:
            parse_faults(faults)
        except FaultSpecError as exc:
            raise UsageError(f"$NEURON_VALIDATE_FAULTS: {exc}") from None
    from conformance.settings import PRECISION_MODEL_ENV

    path = getattr(args, "precision_model", None) or os.environ.get(PRECISION_MODEL_ENV)
    if path:
        from diff.precision import PrecisionModelError, load_model  # imports torch: only for a model to check

        try:
            load_model(path)
        except PrecisionModelError as exc:
            raise UsageError(str(exc)) from None
        os.environ[PRECISION_MODEL_ENV] = str(Path(path).resolve())


def resolve_targets(args):
    """(reference, target) Targets, or UsageError with the reason."""
    from conformance.target import TargetError, resolve_target

    try:
        target = resolve_target(args.target, backend_modules=tuple(args.backend_module))
        reference = resolve_target(args.reference)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    return reference, target


def run_command(prog: str, func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs a command, turning bad input into one line and exit code 2."""
    try:
        return func(args)
    except UsageError as exc:
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; results written so far are kept (rerun with --resume)", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the store, a bad file, anything: one line unless --verbose
        from results.store import StoreError

        if getattr(args, "verbose", False):
            traceback.print_exc()
        kind = "error" if isinstance(exc, StoreError) else f"error: {type(exc).__name__}"
        print(f"{prog}: {kind}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return EXIT_USAGE
