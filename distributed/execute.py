"""Runs one distributed case: its ranks on the target, and the judge on what they bring back.

The case's worker launches ``world_size`` ranks (launch.py). A rank that
raises makes the case an ``error`` (or ``unsupported``, by the judge's
classification), a rank killed by a signal a ``crash``; a rank that hangs
hangs the case, which the supervisor turns into its ``timeout``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from conformance.case import Case
from conformance.outcome import Outcome, Status
from diff.judge import Judge, classify_error
from diff.precision import model_for, perturbed_values
from diff.tolerances import TolerancePolicy
from runner.executors import Executor

from .launch import RankFailure, run_ranks, start_fork_server

# The worst first: what a case's outcome is when its samples disagree.
SEVERITY = (Status.CRASH, Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED, Status.INCONCLUSIVE, Status.SKIP)


def distributed_case(suite: str, name: str, world_size: int, *, seed: int = 0, steps: int = 0) -> Case:
    config: dict[str, Any] = {"suite": suite, "world_size": world_size}
    if steps:
        config["steps"] = steps
    return Case(kind="distributed", name=name, category=suite, mode=f"world{world_size}", config=config, seed=seed)


def execute_distributed_case(case: Case, ctx) -> Outcome:
    settings = ctx.settings
    target = ctx.target
    world = int(case.config["world_size"])
    suite = case.config["suite"]
    logs = str(ctx.artifacts / "ranks" / case.id) if ctx.artifacts is not None else None
    t0 = time.perf_counter()
    try:
        if suite in SAMPLE_SUITES:
            ranks = run_ranks(_sample_rank_main(suite), world, case.name, case.seed, str(target.spec),
                              tuple(settings.backend_modules), logs=logs)
        else:
            from .parity import rank_main

            ranks = run_ranks(rank_main, world, suite, case.name, case.seed, int(case.config.get("steps", 0)),
                              str(target.spec), tuple(settings.backend_modules), logs=logs)
    except RankFailure as failure:
        status = Status.CRASH if failure.signal else classify_error(failure.message)
        return Outcome(case_id=case.id, status=status, message=str(failure),
                       evidence={"rank": failure.rank, "error": failure.message, "signal": failure.signal,
                                 "logs": logs}, timings={"target": time.perf_counter() - t0})
    timings = {"target": time.perf_counter() - t0}
    t0 = time.perf_counter()
    if suite in SAMPLE_SUITES:
        outcome = judge_samples(case, ranks, target)
    else:
        from .parity import judge_parity

        outcome = judge_parity(case, ranks, target)
    outcome.timings = {**timings, "comparison": time.perf_counter() - t0}
    outcome.evidence["world_size"] = world
    outcome.evidence["logs"] = logs
    return outcome


SAMPLE_SUITES = ("collectives", "dtensor")  # judged sample by sample against the same code on a CPU group


def _sample_rank_main(suite: str):
    if suite == "collectives":
        from .collectives import rank_main
    else:
        from .dtensor import rank_main
    return rank_main


def _precision_op(case: Case) -> str:
    """The op whose precision entry explains a sample: a DTensor op's ATen op, else the collective."""
    if case.config["suite"] == "dtensor":
        from .dtensor import DTENSOR_CASES

        ops = DTENSOR_CASES[case.name].ops
        return ops[0] if ops else "c10d::redistribute"
    return f"c10d::{case.name.split('.')[0]}"


def judge_samples(case: Case, ranks: list[dict], target) -> Outcome:
    """Every sample of every rank through the judge; the case's verdict is the worst sample's."""
    precision = model_for(target)
    entry = precision.for_op(_precision_op(case)) if precision else None
    verdicts: list[tuple[Status, str]] = []
    compared = identical = 0
    for rank, results in enumerate(ranks):
        for key, result in results.items():
            where = f"rank {rank}, {key.replace('/', ' x ')}"
            if "skip" in result:
                verdicts.append((Status.SKIP, f"{where}: fails on the CPU reference: {result['skip']}"))
                continue
            if "error" in result:
                verdicts.append((classify_error(result["error"], result.get("error_type")), f"{where}: {result['error']}"))
                continue
            wrong = [d for d in result["devices"] if d != target.device.type]
            if wrong:
                verdicts.append((Status.MISMATCH, f"{where}: outputs on {', '.join(wrong)}, not {target.device.type}"))
                continue
            dtype = key.split("/")[0]
            judge = Judge(tolerance=TolerancePolicy().for_dtype(f"c10d::{case.name}"), precision=precision)
            seed = case.seed * 1_000_003 + rank
            verdict = judge(result["target"], result["reference"], path="output",
                            noise=(lambda r=result["reference"]: perturbed_values(r, entry, seed=seed))
                            if entry is not None else None)
            compared += 1
            identical += _bit_for_bit(result["target"], result["reference"])
            if not verdict:
                verdicts.append((verdict.status, f"{where}: {verdict.message}"))
            elif verdict.within_precision:
                verdicts.append((Status.PASS, f"{where} ({dtype}): {verdict.message}"))
    failing = [v for v in verdicts if v[0] is not Status.PASS]
    evidence: dict[str, Any] = {"samples": compared, "bit_for_bit": identical, "findings": [m for _, m in failing[:20]]}
    if precision:
        evidence["precision_model"] = precision.to_dict()
    if not failing:
        within = [m for s, m in verdicts if s is Status.PASS]
        message = f"{compared} samples on {len(ranks)} ranks match gloo on the CPU ({identical} bit for bit)"
        if within:
            message += f"; {len(within)} within device precision, e.g. {within[0]}"
        return Outcome(case_id=case.id, status=Status.PASS, message=message, evidence=evidence)
    status = next(s for s in SEVERITY if any(v[0] is s for v in failing))
    first = next(m for s, m in failing if s is status)
    count = sum(1 for s, _ in failing if s is status)
    return Outcome(case_id=case.id, status=status, evidence=evidence,
                   message=f"{count} of {compared or len(verdicts)} samples: {first}")


def _bit_for_bit(actual: list, expected: list) -> bool:
    """Same dtypes, shapes and bits (NaN where NaN is): what a correct backend gives where the order of the
    arithmetic is the reference's."""
    return len(actual) == len(expected) and all(
        a.dtype == b.dtype and a.shape == b.shape
        and torch.equal(a.nan_to_num(0.0) if a.is_floating_point() else a, b.nan_to_num(0.0) if b.is_floating_point() else b)
        and torch.equal(a.isnan(), b.isnan())
        for a, b in zip(actual, expected))


def probe_distributed_reference(case: Case, ctx) -> None:
    """The reference side alone: the same ranks on the CPU with gloo (a case that dies there is no finding)."""
    from conformance.target import resolve_target

    world = int(case.config["world_size"])
    if case.config["suite"] in SAMPLE_SUITES:
        run_ranks(_sample_rank_main(case.config["suite"]), world, case.name, case.seed, "cpu", ())
    else:
        from .parity import rank_main

        run_ranks(rank_main, world, case.config["suite"], case.name, case.seed, int(case.config.get("steps", 0)),
                  "cpu", ())
    resolve_target("cpu")


EXECUTOR = Executor(kind="distributed", execute=execute_distributed_case, probe_reference=probe_distributed_reference,
                    warmup=start_fork_server)
