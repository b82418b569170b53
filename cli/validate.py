"""``neuron-validate``: migration checks of a user's own script against a target.

    neuron-validate SCRIPT [--target T] [--reference cpu] [--mode eager|compile] [--steps N]
                   [--out DIR] [--results DIR] [--build ID] [--json] [-- SCRIPT ARGS...]
    neuron-validate compare OLD.json NEW.json

Argument parsing and printing only: the check itself is validate.run. Each
check is also recorded in the results store (``--results``, default
``runs/``) as a case of kind ``script`` in build ``--build``, so the gate and
the dashboard see it. Exit codes: 0 ready (with or without warnings), 1 not
ready, 2 bad usage or a broken script. Progress goes to stderr; the summary
(or, with --json, the report) to stdout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .common import (
    EXIT_OK,
    EXIT_USAGE,
    OneLineParser,
    UsageError,
    add_target_options,
    apply_environment,
    resolve_targets,
    run_command,
)

PROG = "neuron-validate"
DEFAULT_OUT = Path("runs") / "validate"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="Migration checks of a PyTorch script on a target backend: does it "
                      "run, does it compute the same thing (and where does it first go wrong), does it learn the same way.",
                      epilog="Arguments after -- go to the script; {device} in them is replaced by each side's device.")
    p.add_argument("script", help="the user's script (functions convention: get_model() and get_inputs(); "
                   "or an unchanged training script)")
    add_target_options(p)
    g = p.add_argument_group("checks")
    g.add_argument("--mode", choices=("eager", "compile"), default=None,
                   help="run the target eagerly or through torch.compile (default: the target spec's mode, eager)")
    g.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training steps for the loss curves (functions convention: default 10; training script: "
                        "stop at its N-th backward(); 0 skips the curves)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the functions convention's weights and inputs; for a training script, of "
                        "Python's, NumPy's and torch's global generators, alike on every side, unless the "
                        "script seeds them itself (default 0)")
    g.add_argument("--rtol", type=float, default=None, help="loss-curve band, relative (default 0.05)")
    g.add_argument("--max-failing-steps", type=int, default=None, metavar="K",
                   help="steps allowed outside the band (default: 10%% of the steps, at least 1)")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds per child process (default 900)")
    g.add_argument("--no-localize", action="store_true", help="skip the layer-by-layer comparison")
    g.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="run a torchrun-style training script on N ranks per side (default 1)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, metavar="DIR",
                   help=f"report folder (default: a new {DEFAULT_OUT}/SCRIPT_NAME/TIME per run, the newest linked as "
                        f"{DEFAULT_OUT}/SCRIPT_NAME/latest)")
    o.add_argument("--json", action="store_true", help="print report.json to stdout instead of the summary")
    o.add_argument("--results", default=None, metavar="DIR",
                   help="results folder whose store records the check (default: --out's folder when given, else runs/)")
    o.add_argument("--build", default=None, metavar="ID",
                   help="build id to record the check under (default: derived from the target and the time)")
    return p


def build_compare_parser() -> OneLineParser:
    p = OneLineParser(prog=f"{PROG} compare", description="What changed between two neuron-validate reports.")
    p.add_argument("old", help="the earlier report.json (or its folder)")
    p.add_argument("new", help="the later report.json (or its folder)")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.add_argument("--verbose", action="store_true", help="show tracebacks")
    return p


# ---------------------------------------------------------------- progress
class _Status:
    """Live per-side status on stderr: a rich status line on a terminal, phase lines otherwise."""

    def __init__(self, console) -> None:
        self.console = console
        self.state: dict[str, str] = {}
        self.last_phase: dict[str, str] = {}
        self.live = None
        if console.is_terminal:
            from rich.live import Live

            self.live = Live("", console=console, refresh_per_second=8, transient=True)

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(self, side: str, event: dict) -> None:
        phase = event.get("phase", "")
        text = phase
        if phase == "train":
            steps = event.get("steps")
            text = f"training step {event.get('step')}{f'/{steps}' if steps else ''}, loss {event.get('loss', float('nan')):.4g}"
        self.state[side] = text
        if self.live is not None:
            self.live.update(" | ".join(f"[bold]{s}[/]: {t}" for s, t in self.state.items()))
        elif self.last_phase.get(side) != phase:
            self.last_phase[side] = phase
            self.console.print(f"  {side}: {text}", highlight=False)


# ---------------------------------------------------------------- commands
def _target_spec(args) -> tuple[str, str]:
    from conformance.target import TargetError, TargetSpec

    try:
        spec = TargetSpec.parse(args.target)
        TargetSpec.parse(args.reference)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    explicit = ":" in args.target
    if args.mode and explicit and spec.mode != args.mode:
        raise UsageError(f"--target {args.target} and --mode {args.mode} disagree: give the mode once")
    mode = args.mode or spec.mode
    return (spec.device if mode == "eager" else f"{spec.device}:{mode}"), mode


def _record(args, target, case, outcome) -> str | None:
    """Writes the check to the results store; returns its path, or None (with a note) when it cannot."""
    from results.store import ResultStore, StoreError
    from runner.suite import default_build_id

    build = args.build or default_build_id(target.label)
    try:
        with ResultStore.open(args.results) as store:
            manifest = target.manifest()
            store.ensure_build(build, target=str(target.spec), label=target.label, manifest=manifest)
            store.record(build, case, outcome)
            return f"{store.path} (build {build})"
    except StoreError as exc:
        raise UsageError(f"--results {args.results}: {exc}") from None


def run_folder(base: Path) -> Path:
    """A new folder per run under ``base`` (named by the time), so that no run overwrites another's report;
    ``base/latest`` links the newest."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = base / stamp, 1
    while folder.exists():
        n += 1
        folder = base / f"{stamp}-{n}"
    folder.mkdir(parents=True)
    latest = base / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(folder.name)
    except OSError:  # a file system without links: the folder names still sort by time
        pass
    return folder


def cmd_validate(args) -> int:
    from rich.console import Console

    from validate.script import ScriptError, inspect_script

    try:
        script = inspect_script(args.script)
    except ScriptError as exc:
        raise UsageError(str(exc)) from None
    if args.steps is not None and args.steps < 0:
        raise UsageError(f"--steps {args.steps}: must be 0 or more")
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: must be positive")
    if args.rtol is not None and args.rtol < 0:
        raise UsageError(f"--rtol {args.rtol:g}: must be 0 or more")
    if args.max_failing_steps is not None and args.max_failing_steps < 0:
        raise UsageError(f"--max-failing-steps {args.max_failing_steps}: must be 0 or more")
    out = Path(args.out) if args.out else run_folder(DEFAULT_OUT / Path(script.path).stem)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; expected a folder")
    if args.results is None:  # the store goes with the run's outputs, never into the script's folder by surprise
        args.results = str(out) if args.out else "runs"
    if Path(args.results).exists() and not Path(args.results).is_dir():
        raise UsageError(f"--results {args.results}: is a file; expected a results folder")
    target_spec, mode = _target_spec(args)
    apply_environment(args)  # before torch is imported

    from diff.curves import CurveTolerance
    from validate.common import ScriptProblem
    from validate.report import print_summary
    from validate.run import ValidateOptions, problem_outcome, validate_script
    from validate.verdict import EXIT_CODES

    args.target = target_spec
    reference, target = resolve_targets(args)
    tolerance = CurveTolerance(**{k: v for k, v in (("rtol", args.rtol), ("max_failing_steps", args.max_failing_steps))
                                  if v is not None})
    if args.nproc < 1:
        raise UsageError(f"--nproc {args.nproc}: must be at least 1")
    if args.nproc > 1 and script.convention != "training":
        raise UsageError(f"--nproc {args.nproc}: ranks run an unchanged (torchrun-style) training script; "
                         f"{script.display} follows the {script.convention} convention")
    options = ValidateOptions(
        nproc=args.nproc,
        script=script, target=target_spec, reference=args.reference, mode=mode, steps=args.steps,
        steps_given=args.steps is not None, seed=args.seed, out=out, script_args=tuple(args.script_args),
        timeout_s=args.timeout, backend_modules=tuple(args.backend_module), localize=not args.no_localize,
        curve_tolerance=tolerance, argv=tuple(args.argv),
    )
    err = Console(stderr=True, highlight=False)
    err.print(f"[bold]neuron-validate[/] {script.display}: {script.convention} convention, "
              f"{target.describe()} against {reference.describe()}")
    with _Status(err) as status:
        try:
            validation = validate_script(options, target=target, reference=reference, on_progress=status)
        except ScriptProblem as exc:
            _record(args, target, *problem_outcome(options, exc))
            raise UsageError(str(exc)) from None
    stored = _record(args, target, validation.case, validation.outcome)
    if args.json:
        import json

        print(json.dumps(validation.report, indent=1, default=str))
    else:
        console = Console(highlight=False)
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console = Console(highlight=False, width=120)  # logs: keep a finding on one line where it fits
        print_summary(validation.report, console)
        console.print(f"recorded in {stored}", highlight=False, soft_wrap=True)
    return EXIT_CODES[validation.verdict]


def cmd_compare(args) -> int:
    import json

    from rich.console import Console

    from validate.report_diff import ReportError, diff_reports, load_report, print_diff

    try:
        old, new = load_report(args.old), load_report(args.new)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    d = diff_reports(old, new)
    if args.json:
        print(json.dumps(d.to_dict(), indent=1, default=str))
    else:
        print_diff(d, args.old, args.new, Console(highlight=False))
    return 1 if d.worse else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, script_args = argv[:i], argv[i + 1:]
    if argv and argv[0] == "compare" and not os.path.isfile("compare"):
        args = build_compare_parser().parse_args(argv[1:])
        return run_command(f"{PROG} compare", cmd_compare, args)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # The script's own options given without "--": say how to pass them, not only that they are unknown.
        script = getattr(args, "script", None) or "SCRIPT"
        parser.error(f"unrecognized arguments: {' '.join(unknown)}; options for the script go after --, "
                     f"as in: {PROG} {script} -- {' '.join(unknown)}")
    args.script_args = script_args
    args.argv = argv + (["--", *script_args] if script_args else [])
    return run_command(PROG, cmd_validate, args)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["EXIT_USAGE", "main"]
