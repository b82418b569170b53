"""The buildability survey: does every registered entry build and train at its default tiny size?

    python -m model_zoo.survey --out model_zoo/data/arch_status.json [-j 2] [--only 'hf/*'] [--timeout 60]

For each entry, as a case of kind ``survey`` on the runner's supervisor (a
timeout, a memory cap, a crash cannot stop the survey; see probing.py),
the survey builds the base config (float32, default batch and size, train, eager), runs
forward, the loss and backward, then runs them again and builds the model a
second time, and requires both to be bitwise equal: the harness compares a
reference and a target run, so a model that draws from the global RNG in its
forward, or builds differently twice, would fail every comparison.

Progress goes to ``OUT.jsonl`` as each entry finishes, and a rerun skips the
entries already there (``--redo`` to run them again), so the survey resumes
after an interruption; the JSON file is rewritten every 25 entries so partial
results are usable while it runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from conformance.case import Case
from conformance.outcome import Outcome, Status
from runner.executors import Executor

from .errors import one_line
from .probing import run_probes
from .status import STATUS_PATH


def _digest(tensors: list[Any]) -> str:
    from conformance.serialize import value_bytes  # torch: imported only where tensors are hashed

    h = hashlib.sha1()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(value_bytes(t))
    return h.hexdigest()


def _train_once(built: Any) -> tuple[float, str, int, int]:
    import torch

    model = built.model
    model.zero_grad(set_to_none=True)
    train = built.config is None or built.config.mode != "eval"
    with torch.enable_grad() if train else torch.no_grad():
        outputs = model(**built.inputs)
        loss = built.loss_fn(outputs, built.inputs)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"loss_fn returned {type(loss).__name__}, not a scalar tensor")
    if not torch.isfinite(loss).all():
        raise FloatingPointError(f"non-finite loss {loss.item()}")
    if train:
        loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    with_grad = sum(g is not None for g in grads)
    if train and with_grad and not any(bool(g.abs().sum() > 0) for g in grads if g is not None):
        # e.g. a codec whose quantizer rounds random-weight activations to one code: nothing to compare
        raise ArithmeticError("degenerate: every parameter gradient is zero")
    return float(loss.item()), _digest([loss] + grads), with_grad, len(params)


def survey_one(name: str) -> dict[str, Any]:
    """Builds and trains ``name`` twice; returns its status record (raises on failure)."""
    import torch

    from . import build, default_config, get_entry
    from .errors import ModelBuildError

    config = default_config(name, mode="train")
    if get_entry(name).unsupported_reason(config.to_dict()):  # e.g. FlexAttention: no CPU backward
        config = config.replace(mode="eval")
    start = time.perf_counter()
    try:
        built = build(config)
    except ModelBuildError as exc:
        return {"status": "unsupported" if "not supported" in str(exc) else "error", "stage": "build",
                "reason": str(exc).split(": ", 1)[-1] if str(exc).startswith(name) else str(exc)}
    build_s = time.perf_counter() - start
    n_params = sum(p.numel() for p in built.model.parameters())
    weights = _digest(list(built.model.state_dict().values()))  # before training moves batch-norm statistics
    start = time.perf_counter()
    try:
        torch.manual_seed(1)
        loss, digest, with_grad, trainable = _train_once(built)
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        return {"status": "error", "stage": "train", "reason": one_line(exc), "build_s": round(build_s, 3),
                "params": n_params}
    run_s = time.perf_counter() - start
    torch.manual_seed(2)  # a different global RNG state must not matter
    _, digest2, _, _ = _train_once(built)
    again = build(config)
    weights2 = _digest(list(again.model.state_dict().values()))
    inputs_same = _digest([v for v in built.inputs.values() if isinstance(v, torch.Tensor)]) == \
        _digest([v for v in again.inputs.values() if isinstance(v, torch.Tensor)])
    record = {"status": "ok", "build_s": round(build_s, 3), "run_s": round(run_s, 3), "params": n_params,
              "loss": loss, "params_with_grad": with_grad, "trainable_tensors": trainable,
              "config_id": config.config_id, "size": config.size, "batch": config.batch, "mode": config.mode}
    problems = []
    if digest != digest2:
        problems.append("forward/backward differs between two runs (global RNG or nondeterministic kernel)")
    if weights != weights2:
        problems.append("two builds give different weights")
    if not inputs_same:
        problems.append("two builds give different inputs")
    if problems:
        record.update(status="nondeterministic", reason="; ".join(problems))
    return record


# ---------------------------------------------------------------- isolation
def _probe_function(probe: str):
    """What a survey case runs, by its category: the build-and-train check here, or timm's size probe."""
    if probe == "timm-probe":
        from .families import timm_probe

        return timm_probe.probe
    return survey_one


def execute_survey_case(case: Case, ctx) -> Outcome:
    """Runs the case's probe on the entry ``case.name``; its record is the evidence (a raise is the record too)."""
    try:
        value = _probe_function(case.category)(case.name)
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        import traceback

        return Outcome(case_id=case.id, status=Status.ERROR, message=one_line(exc),
                       evidence={"traceback": traceback.format_exc(limit=-3)})
    return Outcome(case_id=case.id, status=Status.PASS, message="probed", evidence={"record": value})


def _versions() -> dict[str, Any]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "timm", "transformers", "diffusers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def write_status(out: Path, records: dict[str, dict[str, Any]], *, elapsed: float, complete: bool) -> None:
    by_family: dict[str, Counter] = {}
    for name, rec in records.items():
        by_family.setdefault(name.split("/", 1)[0], Counter())[rec["status"]] += 1
    data = {
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(), "complete": complete, "survey_seconds": round(elapsed, 1),
        "check": "float32, default batch and size, train forward+backward twice (bitwise equal), built twice (bitwise equal)",
        "summary": {fam: dict(c) for fam, c in sorted(by_family.items())},
        "archs": dict(sorted(records.items())),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=STATUS_PATH)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="fnmatch patterns of entry names")
    parser.add_argument("--exclude", nargs="*", default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--rss-gb", type=float, default=9.0)
    parser.add_argument("--progress", type=Path, default=None, help="progress log (default: OUT with .jsonl)")
    parser.add_argument("--primary-only", action="store_true", help="skip task variants (hf/<type>:<task>)")
    parser.add_argument("--redo", action="store_true", help="rerun entries already in the progress log")
    parser.add_argument("--redo-failed", action="store_true", help="rerun the entries that did not pass")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    from . import registry

    names = registry.list_models(args.only, args.exclude, primary_only=args.primary_only)
    progress = args.progress or args.out.with_suffix(".jsonl")
    records: dict[str, dict[str, Any]] = {}
    if args.out.exists():
        try:
            records.update(json.loads(args.out.read_text()).get("archs", {}))
        except json.JSONDecodeError:
            pass
    if progress.exists():
        for line in progress.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[row.pop("name")] = row
    known = set(registry.list_models())
    records = {n: r for n, r in records.items() if n in known}
    todo = [n for n in names if args.redo or n not in records
            or (args.redo_failed and records[n].get("status") != "ok")]
    print(f"survey: {len(names)} selected, {len(todo)} to run, {len(records)} known", file=sys.stderr, flush=True)
    start = time.monotonic()
    prior = float(json.loads(args.out.read_text()).get("survey_seconds", 0)) if args.out.exists() else 0.0
    with progress.open("a") as log:
        probes = run_probes("build", todo, jobs=args.jobs, timeout=args.timeout, rss_limit_mb=int(args.rss_gb * 1024))
        for i, (name, ok, value, status, reason, seconds) in enumerate(probes, 1):
            rec = dict(value) if ok else {"status": status, "stage": "run", "reason": reason}
            rec["seconds"] = round(seconds, 2)
            records[name] = rec
            log.write(json.dumps({"name": name, **rec}) + "\n")
            log.flush()
            print(f"[{i}/{len(todo)}] {name}: {rec['status']} {rec.get('reason', '')} ({seconds:.1f}s)", flush=True)
            if i % 25 == 0:
                write_status(args.out, records, elapsed=prior + time.monotonic() - start, complete=False)
    complete = all(n in records for n in registry.list_models())
    write_status(args.out, records, elapsed=prior + time.monotonic() - start, complete=complete)
    counts = Counter(r["status"] for n, r in records.items() if n in set(names))
    print(f"survey: {dict(counts)} in {time.monotonic() - start:.0f}s -> {args.out}", file=sys.stderr)
    return 0


EXECUTOR = Executor(kind="survey", execute=execute_survey_case)

if __name__ == "__main__":
    raise SystemExit(main())
