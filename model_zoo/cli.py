"""Command line for the zoo: list the space, draw a sample, build one config.

    python -m model_zoo --list [--family timm] [--pattern 'hf/*'] [--json]
    python -m model_zoo --names [--pattern ...] [--exclude ...] [--primary-only]
    python -m model_zoo --sample 2000 --seed 0 [--where execution=eager] [--out sample.jsonl]
    python -m model_zoo --build timm/resnet18 [--dtype bfloat16 --mode train ...]

``--list`` prints the number of configurations per family and per axis
value; ``--sample`` prints one config per line as JSON (with its id), ready
for ``ModelConfig.from_dict``. Exit codes: 0 good, 1 a build failed, 2 bad usage.
The harness's ``neuron-conformance models`` command calls ``main`` with the
same arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from . import registry
from .config import ATTN_IMPLS, DTYPES, EXECUTIONS, MODES
from .errors import ModelZooError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model_zoo", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="counts per family and axis")
    what.add_argument("--names", action="store_true", help="registered names, one a line")
    what.add_argument("--sample", type=int, metavar="N", help="a stratified sample of at least N configs")
    what.add_argument("--build", metavar="ARCH", help="build one config and run a training step")
    p.add_argument("--family", action="append", dest="families", help="restrict to a family (repeatable)")
    p.add_argument("--pattern", action="append", dest="patterns", help="fnmatch pattern of names (repeatable)")
    p.add_argument("--exclude", action="append", help="fnmatch pattern to leave out (repeatable)")
    p.add_argument("--primary-only", action="store_true", help="--names: leave out task variants")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--where", action="append", default=[], metavar="AXIS=V1,V2",
                   help="--sample: restrict an axis, e.g. execution=eager or mode=train,eval")
    p.add_argument("--out", help="--sample: write JSON lines here instead of stdout")
    p.add_argument("--json", action="store_true", help="--list: print the counts as JSON")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--mode", choices=MODES, default="train")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--execution", choices=EXECUTIONS, default="eager")
    p.add_argument("--attn", choices=ATTN_IMPLS, default="default")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--size", type=int, default=0)
    for knob in ("layers", "hidden", "heads", "experts"):
        p.add_argument(f"--{knob}", type=int, default=None)
    return p


def _where(items: list[str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item in items:
        axis, sep, values = item.partition("=")
        if not sep or not values:
            raise ValueError(f"--where {item!r}: expected AXIS=V1,V2")
        out[axis] = [int(v) if v.isdigit() else v for v in values.split(",")]
    return out


def _print_counts(counts: dict[str, Any], out: Any) -> None:
    print(f"{counts['total']:,} configurations over {counts['entries']:,} entries "
          f"({counts['architectures']:,} architectures)", file=out)
    print(f"{'family':<12}{'entries':>9}{'archs':>8}{'configs':>12}", file=out)
    for fam, c in sorted(counts["families"].items()):
        print(f"{fam:<12}{c['entries']:>9,}{c['architectures']:>8,}{c['total']:>12,}", file=out)
    for axis, values in counts["axes"].items():
        shown = sorted(values.items(), key=lambda kv: -kv[1])
        text = ", ".join(f"{k}: {v:,}" for k, v in shown[:12])
        more = f", ... ({len(shown) - 12} more)" if len(shown) > 12 else ""
        print(f"  {axis:<10} {text}{more}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from . import build, count_configs, default_config, sample_configs

    try:
        if args.list:
            counts = count_configs(args.families, args.patterns, exclude=args.exclude)
            if args.json:
                json.dump(counts, sys.stdout, indent=1)
                print()
            else:
                _print_counts(counts, sys.stdout)
            return 0
        if args.names:
            for name in registry.list_models(args.patterns, args.exclude, primary_only=args.primary_only):
                if not args.families or name.split("/", 1)[0] in args.families:
                    print(name)
            return 0
        if args.sample is not None:
            configs = sample_configs(args.sample, args.seed, args.families, args.patterns, exclude=args.exclude,
                                     where=_where(args.where))
            out = open(args.out, "w") if args.out else sys.stdout
            try:
                for cfg in configs:
                    out.write(json.dumps({"config_id": cfg.config_id, **cfg.to_dict()}) + "\n")
            finally:
                if args.out:
                    out.close()
            print(f"{len(configs)} configs", file=sys.stderr)
            return 0
        config = default_config(args.build, dtype=args.dtype, mode=args.mode, steps=args.steps,
                                execution=args.execution, attn=args.attn, batch=args.batch, size=args.size,
                                layers=args.layers, hidden=args.hidden, heads=args.heads, experts=args.experts)
        start = time.perf_counter()
        built = build(config)
        built_s = time.perf_counter() - start
        outputs = built.model(**built.inputs)
        loss = built.loss_fn(outputs, built.inputs)
        if config.mode != "eval":
            loss.backward()
        params = sum(p.numel() for p in built.model.parameters())
        print(f"{config} [{config.config_id}]: {params:,} params, built in {built_s:.2f}s, loss {loss.item():.4g}"
              f" ({built.notes})")
        return 0
    except ModelZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if args.build else 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
