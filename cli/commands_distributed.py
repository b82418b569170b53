"""``neuron-conformance distributed``: collectives and parallelism setups on N ranks of the target.

    neuron-conformance distributed --target neuron --world-size 2,4
                                   [--suite collectives,dtensor,ddp,fsdp2,fsdp2-keep,fsdp2-mp,tp,tp-sp,
                                            fsdp2-tp,pp] [--filter GLOB] [--steps K]

Each case launches its ranks with PyTorch's elastic launcher (the machinery of
``torchrun``) on the target's process-group backend; a rank that hangs is the
case's ``timeout`` and a rank that dies its ``crash``, and the run goes on.
Results are stored as kind ``distributed``, so the gate and the dashboard see
them like any other case.
"""

from __future__ import annotations

import fnmatch

from .common import UsageError, apply_environment
from .suite import add_suite_options, plan_run, run_cases

DEFAULT_TIMEOUT = 300.0


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _names(suite: str, world: int) -> list[str]:
    """The cases of one suite that ``world`` ranks can run."""
    from distributed.collectives import COLLECTIVES
    from distributed.dtensor import DTENSOR_CASES, fits
    from distributed.parity import SETUPS

    if suite == "collectives":
        return list(COLLECTIVES)
    if suite == "dtensor":
        return [n for n in DTENSOR_CASES if not fits(n, world)]
    setup = SETUPS[suite]
    return [] if setup.unfit(world) else list(setup.models)


def cmd_distributed(args) -> int:
    apply_environment(args)
    try:  # the options that need no suite checked first: the suites' modules import torch (seconds)
        worlds = [int(w) for w in _split(args.world_size)]
    except ValueError:
        raise UsageError(f"--world-size {args.world_size!r}: expected comma-separated integers, e.g. 2,4") from None
    if not worlds or any(w < 2 for w in worlds):
        raise UsageError(f"--world-size {args.world_size!r}: every world size must be at least 2")
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: must be at least 1")
    from distributed.execute import SAMPLE_SUITES, distributed_case
    from distributed.parity import SETUPS

    known = (*SAMPLE_SUITES, *SETUPS)
    suites = _split(args.suite) or list(known)
    for suite in suites:
        if suite not in known:
            raise UsageError(f"--suite {suite!r}: unknown suite (suites: {', '.join(known)})")
    plan = plan_run(args)
    from distributed.backends import devices_short

    for world in worlds:
        short = devices_short(plan.target, world)
        if short:
            raise UsageError(f"--world-size {world}: {short}")
    patterns = _split(args.filter)
    cases = []
    unfit = []
    for world in worlds:
        for suite in suites:
            names = _names(suite, world)
            if not names and suite in SETUPS:
                unfit.append(SETUPS[suite].unfit(world))
            chosen = [n for n in names if not patterns or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
            cases += [distributed_case(suite, n, world, steps=0 if suite in SAMPLE_SUITES else args.steps)
                      for n in chosen]
    if not cases:
        if unfit and not patterns:
            raise UsageError(f"--world-size {args.world_size!r}: {'; '.join(dict.fromkeys(unfit))}")
        everything = sorted({n for suite in known for w in (2, 4) for n in _names(suite, w)})
        raise UsageError(f"--filter {args.filter!r} selects nothing (names: {', '.join(everything)})")
    return run_cases(args, plan, cases, kind_label="distributed", timeout=DEFAULT_TIMEOUT, group="suite")


def register(sub) -> None:
    p = sub.add_parser("distributed", help="collectives, DTensor, DDP, FSDP2, tensor and pipeline parallelism on N ranks of the target")
    add_suite_options(p)
    p.add_argument("--world-size", default="2", metavar="N[,N...]", help="ranks per case (default 2)")
    p.add_argument("--suite", default="", help="comma-separated: collectives, dtensor, ddp, fsdp2, fsdp2-keep, fsdp2-mp, tp, tp-sp, "
                        "fsdp2-tp (4+ ranks), pp (default all)")
    p.add_argument("--filter", default="", help="comma-separated globs over collective or model names")
    p.add_argument("--steps", type=int, default=3, help="training steps of the parity setups (default 3)")
    p.set_defaults(func=cmd_distributed)
