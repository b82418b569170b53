"""``neuron-conformance models``: the model zoo on reference and target.

    neuron-conformance models --list [--family F] [--filter GLOB]
    neuron-conformance models --target neuron [--family F] [--filter GLOB] [--exclude GLOB] [--where AXIS=V,...]
                              [--sample N --seed S | --base] [--build ID] [-j N] [--shard i/N] [--resume]

Without ``--sample`` every enumerated configuration of the selection runs;
with it, a deterministic stratified subset in which every buildable
architecture appears at least once; with ``--base``, one base configuration
(float32, train forward+backward, eager) of every selected entry, whether the
survey built it or not, which is how per-family pass rates are measured.
``--where`` keeps only some values of an axis (``--where execution=eager
--where dtype=float32,bfloat16``). A nightly of N configurations runs as
``--sample N --seed S --build ID --shard i/K`` on K drivers (every driver
selects the same N and runs its share; ``merge`` joins them), or as one
driver with ``--executor ray --address HOST:PORT``; ``--resume`` picks up a
build after its driver died (docs/scale_out.md).
"""

from __future__ import annotations

from .common import EXIT_OK, UsageError, apply_environment
from .suite import add_suite_options, plan_run, run_cases


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _print_counts(counts: dict) -> None:
    from rich.table import Table

    from .progress import console

    table = Table(title=f"model zoo: {counts['total']:,} configurations, {counts['architectures']:,} architectures "
                        f"({counts['entries']:,} entries with task heads)")
    table.add_column("family")
    table.add_column("architectures", justify="right")
    table.add_column("entries", justify="right")
    table.add_column("configurations", justify="right")
    for family, f in sorted(counts["families"].items()):
        table.add_row(family, f"{f['architectures']:,}", f"{f['entries']:,}", f"{f['total']:,}")
    console.print(table)
    axes = Table(title="configurations per axis value")
    axes.add_column("axis")
    axes.add_column("values")
    for axis, values in counts["axes"].items():
        axes.add_row(axis, ", ".join(f"{v}: {n:,}" for v, n in sorted(values.items(), key=lambda kv: str(kv[0]))))
    console.print(axes)


def _where(items: list[str]) -> dict | None:
    """``["execution=eager", "dtype=float32,bfloat16"]`` -> {"execution": ["eager"], "dtype": [...]} (numbers as ints)."""
    where: dict[str, list] = {}
    for item in items or ():
        axis, sep, values = item.partition("=")
        if not sep or not axis.strip() or not _split(values):
            raise UsageError(f"--where {item!r}: expected AXIS=VALUE[,VALUE...], e.g. execution=eager")
        where.setdefault(axis.strip(), []).extend(int(v) if v.isdigit() else v for v in _split(values))
    return where or None


def cmd_models(args) -> int:
    apply_environment(args)
    plan = None if getattr(args, "list", False) else plan_run(args)  # listing needs no device
    import model_zoo
    from model_zoo.execute import model_case

    families = _split(args.family) or None
    patterns = _split(args.filter) or None
    exclude = _split(args.exclude) or None
    where = _where(args.where)
    try:
        if families:
            known = set(model_zoo.registry.families())
            for f in families:
                if f not in known:
                    raise model_zoo.UnknownModelError(f"unknown family {f!r} (families: {', '.join(sorted(known))})")
        if patterns:
            for p in patterns:
                if not model_zoo.list_models([p]):
                    model_zoo.get_entry(p)  # raises with the closest names
        if args.list:
            _print_counts(model_zoo.count_configs(families, patterns, exclude=exclude, where=where))
            return EXIT_OK
        if args.base and args.sample is not None:
            raise UsageError("--base and --sample are exclusive: --base runs one base config per architecture")
        if args.base and where:
            raise UsageError("--base and --where are exclusive: --base runs the one base config of each architecture")
        if args.base:
            configs = model_zoo.base_configs(families, patterns, exclude=exclude)
        elif args.sample is not None:
            if args.sample < 1:
                raise UsageError(f"--sample {args.sample}: must be at least 1")
            configs = model_zoo.sample_configs(args.sample, args.seed, families, patterns, exclude=exclude,
                                               where=where)
        else:
            configs = list(model_zoo.enumerate_configs(families, patterns, exclude=exclude, where=where))
    except (model_zoo.ModelZooError, ValueError) as exc:  # ValueError: an unknown axis in --where
        raise UsageError(str(exc)) from None
    cases = [model_case(c) for c in configs]
    if not cases:
        raise UsageError("the selection holds no model configurations (check --family, --filter and --exclude)")
    return run_cases(args, plan, cases, kind_label="models", timeout=600.0, group="family")


def register(sub) -> None:
    p = sub.add_parser("models", help="model zoo suite")
    add_suite_options(p)
    p.add_argument("--family", default="", help="comma-separated families (timm, hf, diffusion, ...)")
    p.add_argument("--filter", default="", help="comma-separated globs over architecture names, e.g. 'timm/resnet*'")
    p.add_argument("--exclude", default="", help="comma-separated globs to leave out")
    p.add_argument("--where", action="append", default=[], metavar="AXIS=V,...",
                   help="keep only these values of an axis (dtype, batch, size, mode, execution, attn, knobs); repeatable")
    p.add_argument("--sample", type=int, default=None, help="a stratified subset of N configurations")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample")
    p.add_argument("--base", action="store_true",
                   help="one base config (float32, train, eager) per architecture, built or not: coverage figures")
    p.add_argument("--list", action="store_true", help="print counts per family and axis and exit")
    p.set_defaults(func=cmd_models)
