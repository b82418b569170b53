"""``neuron-conformance curves``: side-by-side loss curves of a zoo model on the reference and the target.

    neuron-conformance curves --model NAME --steps N --target neuron --out DIR

Parses the options, shows both sides' progress live and prints the verdict; the
building, training, comparing and writing are validate.zoo_curves's: the zoo model
built once (fixed seed, dropout off), a copy trained on each side for N steps on
the same batches, the curves compared against the band (diff.curves, perturbed
reference trainings included), and ``loss_curves.png`` / ``.svg`` and
``curves.json`` written.

``--data fixed`` (the default) trains on the same few batches, a task the model
can fit, so both curves fall and the band tells drift by design from divergence;
``--data fresh`` draws a new random batch each step (unlearnable: the curves only
wander).
Exit code 0 when the curves agree, 1 when they diverge or the target fails
to train, 2 for bad usage (an unknown model lists the closest names).
"""

from __future__ import annotations

from pathlib import Path

from .common import EXIT_FINDINGS, EXIT_OK, UsageError, add_target_options, apply_environment, resolve_targets

DEFAULT_OUT = Path("runs") / "curves"
MIN_BATCH = 16  # validate.zoo_curves.MIN_BATCH, named here for --help without importing the models


def register(sub) -> None:
    p = sub.add_parser("curves", help="side-by-side loss curves of a zoo model")
    add_target_options(p)
    p.add_argument("--model", required=True, metavar="NAME", help="zoo model, e.g. hf/gpt2:causal_lm (see neuron-conformance models --list)")
    p.add_argument("--steps", type=int, default=20, metavar="N", help="training steps (default 20)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (default float32)")
    p.add_argument("--batch", type=int, default=0, help=f"batch size (default: the model's, at least {MIN_BATCH} "
                   "with --data fixed)")
    p.add_argument("--data", choices=("fixed", "fresh"), default="fixed",
                   help="fixed: the same --data-batches batches again and again, a task the model can fit "
                        "(default); fresh: a new random batch each step")
    p.add_argument("--data-batches", type=int, default=1, metavar="K", help="batches of the fixed task (default 1)")
    p.add_argument("--size", type=int, default=0, help="sequence length or image side (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=None, help="band around the reference loss, relative (default 0.05)")
    p.add_argument("--max-failing-steps", type=int, default=None, metavar="K",
                   help="steps allowed outside the band (default: 10%% of the steps, at least 1)")
    p.add_argument("--out", default=None, metavar="DIR", help=f"output folder (default: {DEFAULT_OUT}/MODEL)")
    p.set_defaults(func=cmd_curves)


def _checked(args):
    """The output folder and the band's tolerance, or a UsageError."""
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: must be at least 1")
    if args.data_batches < 1:
        raise UsageError(f"--data-batches {args.data_batches}: must be at least 1")
    out = Path(args.out) if args.out else DEFAULT_OUT / args.model.replace("/", "_").replace(":", "_")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; expected a folder")
    from diff.curves import CurveTolerance

    try:
        tolerance = CurveTolerance(**{k: v for k, v in (("rtol", args.rtol), ("max_failing_steps", args.max_failing_steps))
                                      if v is not None})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return out, tolerance


def _progress(console, steps: int):
    """A live bar per side (lines every 10 steps when not on a terminal), and the per-step callback it takes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("loss {task.fields[loss]}"), console=console,
                        disable=not console.is_terminal)

    def on_step(side: str):
        task = progress.add_task(side, total=steps, loss="-")

        def update(step: int, value: float) -> None:
            progress.update(task, completed=step + 1, loss=f"{value:.5g}")
            if not console.is_terminal and (step == 0 or step + 1 == steps or (step + 1) % 10 == 0):
                console.print(f"  {side}: step {step + 1}/{steps} loss {value:.5g}", highlight=False)
        return update
    return progress, on_step


def cmd_curves(args) -> int:
    out, tolerance = _checked(args)
    apply_environment(args)
    from rich.markup import escape

    from model_zoo import ModelZooError
    from validate.zoo_curves import (NOISE_RUNS, SideFailedToTrain, band_precision, compare_with_band, train_sides,
                                     write_curves, zoo_training)

    from .progress import console

    reference, target = resolve_targets(args)
    try:
        training = zoo_training(model=args.model, steps=args.steps, dtype=args.dtype, batch=args.batch,
                                size=args.size, seed=args.seed, data=args.data, data_batches=args.data_batches)
    except (ValueError, ModelZooError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    console.print(f"[bold]curves[/] {training.config}: {args.steps} steps on [bold]{target.describe()}[/] "
                  f"against {reference.describe()}")
    progress, on_step = _progress(console, args.steps)
    try:
        with progress:
            curves = train_sides(training, reference, target, on_step)
    except SideFailedToTrain as exc:
        if exc.side == "reference":
            raise UsageError(f"{args.model} {exc}") from None
        console.print(f"[bold red]{escape(f'{args.model} {exc}')}[/]", highlight=False)
        console.print("verdict: [bold red]DIVERGE[/] (the target did not train)")
        return EXIT_FINDINGS
    console.print(f"  band: {NOISE_RUNS} reference trainings perturbed as the device's precision allows "
                  f"({band_precision(target)[1].summary})", highlight=False)
    comparison = compare_with_band(training, curves, reference, target, tolerance)
    png, svg, data = write_curves(out, training, comparison, tolerance, reference, target,
                                  data_batches=args.data_batches)
    for label, c in (("reference:", comparison.reference), ("target:   ", comparison.target)):
        console.print(f"  {label} loss {c.losses[0]:.5g} -> {c.losses[-1]:.5g}, "
                      f"{c.steps_per_second or 0:.2f} steps/s", highlight=False)
    console.print(comparison.summary(), highlight=False)
    # soft_wrap: a path is never broken across lines, so it can be copied (and parsed) from a log
    console.print(f"plot: {png} (and {svg.name}); data: {data}", highlight=False, soft_wrap=True)
    verdict = "[bold green]AGREE[/]" if comparison else f"[bold red]DIVERGE at step {comparison.diverged_at}[/]"
    console.print(f"verdict: {verdict}")
    return EXIT_OK if comparison else EXIT_FINDINGS
