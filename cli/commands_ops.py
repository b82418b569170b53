"""``neuron-conformance ops``: operator conformance, OpInfo x dtypes x forward/backward, plus the input strategies."""

from __future__ import annotations

from .common import EXIT_OK, UsageError, apply_environment
from .suite import add_suite_options, plan_run, run_cases


def cmd_ops(args) -> int:
    apply_environment(args)
    plan = None if getattr(args, "list", False) else plan_run(args)  # listing needs no device
    from op_tests.strategies import STRATEGIES
    from op_tests.sources import DIRECTIONS, OpSelection, UnknownOpError, all_cases

    directions = tuple(d.strip() for d in args.directions.split(",") if d.strip())
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    strategies = STRATEGIES if strategies == ("all",) else () if strategies == ("none",) else strategies
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip()) if args.dtypes else ()
    try:
        cases = all_cases(OpSelection(
            patterns=tuple(p.strip() for p in args.ops.split(",") if p.strip()) or ("*",),
            exclude=tuple(p.strip() for p in (args.exclude or "").split(",") if p.strip()),
            dtypes=dtypes, directions=directions or DIRECTIONS, max_samples=args.max_samples, seed=args.seed,
            hypothesis_examples=args.hypothesis_examples, strategies=strategies,
        ))
    except (UnknownOpError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not cases:
        raise UsageError("the selection holds no cases (check --ops, --dtypes and --directions)")
    if args.list:
        for c in cases:
            print(c.id, c.title)
        return EXIT_OK
    return run_cases(args, plan, cases, kind_label="ops", timeout=300.0, warmup=("op",))


def register(sub) -> None:
    p = sub.add_parser("ops", help="operator conformance suite")
    add_suite_options(p)
    p.add_argument("--ops", default="*", help="comma-separated globs over OpInfo names (name or name.variant)")
    p.add_argument("--exclude", default="", help="comma-separated globs to leave out")
    p.add_argument("--dtypes", default="", help="comma-separated dtypes (default: all the op supports)")
    p.add_argument("--directions", default="forward,backward", help="forward, backward or both")
    p.add_argument("--max-samples", type=int, default=0, help="at most this many samples per case (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hypothesis-examples", type=int, default=16,
                   help="hypothesis examples per element-wise op x float dtype x direction (0: none)")
    p.add_argument("--strategies", "--families", dest="strategies", default="all", metavar="NAME,...",
                   help="input strategies that hunt accelerator bugs: sizes, extremes, mixed, layouts, variants, ties, "
                        "accumulation; 'all' (default) or 'none' (--families: its old name)")
    p.add_argument("--list", action="store_true", help="print the selected cases and exit")
    p.set_defaults(func=cmd_ops)
