"""``neuron-conformance scripts``: a folder of user scripts as a suite.

    neuron-conformance scripts DIR [--target T] [--mode eager|compile] [--steps N] [--build ID] [-j N] ...

A team keeps its migration scripts in a folder; each backend build gates on
them. Every ``*.py`` file in DIR (recursively, files starting with ``_``
left out) is one case of kind ``script``, checked exactly as
``neuron-validate SCRIPT`` checks it, and its verdict recorded in the results
store: ready is ``pass``, not ready fails as its first error says. Reports go
to ``RESULTS/artifacts/BUILD/scripts/CASE_ID/``.
"""

from __future__ import annotations

from pathlib import Path

from .common import UsageError, apply_environment
from .suite import add_suite_options, plan_run, run_cases


def script_cases(folder: Path, *, mode: str, steps: int | None, seed: int) -> list:
    from validate.run import ValidateOptions, script_case
    from validate.script import ScriptError, inspect_script

    cases = []
    for path in sorted(folder.rglob("*.py")):
        if path.name.startswith("_") or any(part.startswith((".", "_")) for part in path.relative_to(folder).parts[:-1]):
            continue
        try:
            script = inspect_script(str(path))
        except ScriptError as exc:
            raise UsageError(str(exc)) from None
        cases.append(script_case(ValidateOptions(script=script, target="", mode=mode, steps=steps,
                                                 steps_given=steps is not None, seed=seed)))
    return cases


def cmd_scripts(args) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        raise UsageError(f"{args.folder}: no such folder" if not folder.exists() else f"{args.folder}: not a folder")
    if args.steps is not None and args.steps < 0:
        raise UsageError(f"--steps {args.steps}: must be 0 or more")
    if ":" in args.target:
        device, _, mode = args.target.partition(":")
        if args.mode and args.mode != mode:
            raise UsageError(f"--target {args.target} and --mode {args.mode} disagree: give the mode once")
        args.mode = mode
        args.target = device
    mode = args.mode or "eager"
    if mode != "eager":
        args.target = f"{args.target}:{mode}"
    apply_environment(args)
    plan = None if getattr(args, "list", False) else plan_run(args)  # listing needs no device
    cases = script_cases(folder, mode=mode, steps=args.steps, seed=args.seed)
    if not cases:
        raise UsageError(f"{args.folder}: holds no Python scripts")
    if args.list:
        for c in cases:
            print(c.id, c.title)
        return 0
    return run_cases(args, plan, cases, kind_label="scripts", timeout=900.0, group="convention")


def register(sub) -> None:
    p = sub.add_parser("scripts", help="a folder of user scripts, each checked as neuron-validate checks it")
    add_suite_options(p)
    p.add_argument("folder", metavar="DIR", help="folder of scripts (functions convention or training scripts)")
    p.add_argument("--mode", choices=("eager", "compile"), default=None,
                   help="run the target eagerly or through torch.compile (default: the target spec's mode)")
    p.add_argument("--steps", type=int, default=None, metavar="N", help="training steps for the loss curves")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.set_defaults(func=cmd_scripts)
