"""``neuron-conformance curves``: side-by-side loss curves of a zoo model on the reference and the target.

    neuron-conformance curves --model NAME --steps N --target neuron --out DIR

Builds the zoo model once (fixed seed, dropout off), trains a copy on each
side for N steps on the same batches with the zoo's optimizer, shows both
sides' progress live, compares the curves against the band (diff.curves) and
writes ``loss_curves.png`` / ``.svg`` and ``curves.json`` (both curves, the
comparison, and both sides' manifests).

The data is a task the model can learn: the same few batches (``--data
fixed``, the default), at least ``MIN_BATCH`` examples each so batch norm
sees a batch, which the model fits, so both curves fall and the band tells
drift by design from divergence. ``--data fresh`` draws a new random batch
each step (unlearnable: the curves only wander). For a target with a
precision model (diff.precision) the band comes from perturbed reference
trainings as well.
Exit code 0 when the curves agree, 1 when they diverge or the target fails
to train, 2 for bad usage (an unknown model lists the closest names).
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import EXIT_FINDINGS, EXIT_OK, UsageError, add_target_options, apply_environment, resolve_targets

DEFAULT_OUT = Path("runs") / "curves"
MIN_BATCH = 16  # the default batch of the learnable task: batch norm over 2 images only wanders


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


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def cmd_curves(args) -> int:
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: must be at least 1")
    if args.data_batches < 1:
        raise UsageError(f"--data-batches {args.data_batches}: must be at least 1")
    out = Path(args.out) if args.out else DEFAULT_OUT / args.model.replace("/", "_").replace(":", "_")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; expected a folder")
    apply_environment(args)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from diff.curves import CurveTolerance, compare_curves, train_curve
    from diff.plots import plot_curves

    from .progress import console

    try:
        tolerance = CurveTolerance(**{k: v for k, v in (("rtol", args.rtol), ("max_failing_steps", args.max_failing_steps))
                                      if v is not None})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    reference, target = resolve_targets(args)
    from model_zoo import ModelConfig, ModelZooError, build

    try:
        config = ModelConfig(arch=args.model, dtype=args.dtype, batch=args.batch, size=args.size, mode="steps",
                             steps=args.steps, seed=args.seed)
        built = build(config)
        if args.data == "fixed" and not args.batch and built.config and built.config.batch < MIN_BATCH:
            config = ModelConfig(arch=args.model, dtype=args.dtype, batch=MIN_BATCH, size=args.size, mode="steps",
                                 steps=args.steps, seed=args.seed)
            built = build(config)
    except (ValueError, ModelZooError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    fixed = [built.make_batch(k) for k in range(args.data_batches)] if args.data == "fixed" else None

    def batch(step: int):
        return dict(fixed[step % len(fixed)]) if fixed is not None else built.make_batch(step)
    model_name = str(built.config or config)
    console.print(f"[bold]curves[/] {model_name}: {args.steps} steps on [bold]{target.describe()}[/] "
                  f"against {reference.describe()}")

    def loss(model, inputs):
        return built.loss_fn(model(**inputs), inputs)

    progress = Progress(TextColumn("[bold]{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("loss {task.fields[loss]}"), console=console,
                        disable=not console.is_terminal)
    common = dict(batch=batch, loss=loss, optimizer_factory=built.optimizer_factory, steps=args.steps,
                  seed=args.seed)
    with progress:
        curves = {}
        for side, t in (("reference", reference), ("target", target)):
            task = progress.add_task(side, total=args.steps, loss="-")

            def on_step(step, value, task=task, side=side):
                progress.update(task, completed=step + 1, loss=f"{value:.5g}")
                if not console.is_terminal and (step == 0 or step + 1 == args.steps or (step + 1) % 10 == 0):
                    console.print(f"  {side}: step {step + 1}/{args.steps} loss {value:.5g}", highlight=False)

            try:
                curves[side] = train_curve(built.model, device=t.device, label=t.describe(),
                                           prepare=t.prepare if t.compiles else None, synchronize=t.synchronize,
                                           on_step=on_step, **common)
            except Exception as exc:  # noqa: BLE001
                if side == "reference":
                    raise UsageError(f"{args.model} fails to train on the reference ({t.describe()}): {_one_line(exc)}") from None
                progress.stop()
                console.print(f"[bold red]{args.model} fails to train on the target ({t.describe()}):[/] "
                              f"{_one_line(exc)}", highlight=False)
                console.print("verdict: [bold red]DIVERGE[/] (the target did not train)")
                return EXIT_FINDINGS
    from diff.curves import NOISE_RUNS, curve_precision
    from diff.precision import model_for, perturbed_runs

    precision = model_for(target)
    console.print(f"  band: {NOISE_RUNS} reference trainings perturbed as the device's precision allows "
                  f"({curve_precision(precision).summary})", highlight=False)
    perturbed = perturbed_runs(lambda: train_curve(built.model, device=reference.device,
                                                   label="perturbed reference", **common),
                               curve_precision(precision), runs=NOISE_RUNS, seed=args.seed)
    comparison = compare_curves(curves["reference"], curves["target"], tolerance, perturbed)
    paths = plot_curves(comparison, out / "loss_curves", title=f"{args.model} on {target.describe()}")
    record = {"model": args.model, "config": (built.config or config).to_dict(), "comparison": comparison.to_dict(),
              "tolerance": tolerance.describe(), "data": {"kind": args.data, "batches": args.data_batches},
              "precision_model": precision.to_dict() if precision else None,
              "manifest": {"target": target.manifest(), "reference": reference.manifest()}}
    (out / "curves.json").write_text(json.dumps(record, indent=1, default=str))
    r, tg = comparison.reference, comparison.target
    console.print(f"  reference: loss {r.losses[0]:.5g} -> {r.losses[-1]:.5g}, "
                  f"{r.steps_per_second or 0:.2f} steps/s", highlight=False)
    console.print(f"  target:    loss {tg.losses[0]:.5g} -> {tg.losses[-1]:.5g}, "
                  f"{tg.steps_per_second or 0:.2f} steps/s", highlight=False)
    console.print(comparison.summary(), highlight=False)
    # soft_wrap: a path is never broken across lines, so it can be copied (and parsed) from a log
    console.print(f"plot: {paths[0]} (and {paths[1].name}); data: {out / 'curves.json'}", highlight=False,
                  soft_wrap=True)
    verdict = "[bold green]AGREE[/]" if comparison else f"[bold red]DIVERGE at step {comparison.diverged_at}[/]"
    console.print(f"verdict: {verdict}")
    return EXIT_OK if comparison else EXIT_FINDINGS

