"""A migration check of one script, from options to verdict: what ``neuron-validate`` and the scripts suite run.

1. **Observe.** Each side runs as a case of kind ``script-side`` on the
   runner's supervisor, in a fresh process of its own: one process for the
   functions convention (it drives every side), two for an unchanged training
   script (the CPU reference with the backend's autoload off, and the
   target), at once on half the cores each. A side that dies or hangs is
   classified by the supervisor like any case: on the target it is a finding,
   on the reference it is the script's problem. Live progress (training
   steps, phases) arrives through the supervisor.
2. **Check.** Findings from the observations (checks.py), and the verdict.
3. **Report.** ``report.json``, ``report.html``, plots; and the check as a
   case of kind ``script`` with its Outcome, for the results store, the gate
   and the dashboard.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from conformance.case import Case
from conformance.outcome import Outcome, Status
from conformance.settings import RunSettings
from conformance.target import TargetSpec
from diff.curves import CurveComparison, CurveTolerance
from diff.judge import classify_error
from runner.supervisor import Job, Supervisor

from .checks import CheckContext, curve_comparison, run_checks
from .common import HARNESS_OUTPUTS_ENV, PRELOAD_ENV, ChildSpec, ScriptProblem, harness_outputs
from .report import build_report, write_reports
from .script import FUNCTIONS, ScriptInfo, device_type_of
from .verdict import NOT_READY, READY_WITH_WARNINGS, Finding, verdict_of

ProgressFn = Callable[[str, dict], None]  # (side, event)
# The CPU reference must see no accelerator: no backend registers at `import torch` in its process.
CPU_SIDE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NEURON_VALIDATE_EMULATOR_AUTOLOAD": "0"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidateOptions:
    script: ScriptInfo
    target: str
    reference: str = "cpu"
    mode: str = "eager"
    steps: int | None = None
    steps_given: bool = False
    seed: int = 0
    out: Path = Path("runs/validate")
    script_args: tuple[str, ...] = ()
    timeout_s: float = 900.0
    backend_modules: tuple[str, ...] = ()
    localize: bool = True
    curve_tolerance: CurveTolerance = CurveTolerance()
    rss_limit_mb: int = 0  # 0: no memory cap for the script's processes
    argv: tuple[str, ...] = ()
    nproc: int = 1  # ranks per side (a torchrun-style training script)
    # The device type the script names for its device (the target's, or cuda): each side's own device there
    device_alias: str | None = None


@dataclass(kw_only=True)
class Validation:
    """A finished check: the report (as written to report.json), its verdict, and the case it is in the store."""

    case: Case
    outcome: Outcome
    report: dict
    findings: list[Finding] = field(default_factory=list)
    verdict: str = NOT_READY
    curves: CurveComparison | None = None


def script_case(options: ValidateOptions) -> Case:
    """The stored case of a check: the script by its path from here, with what changes what it runs."""
    return Case(kind="script", name=options.script.display, category=options.script.convention, mode=options.mode,
                config={"args": list(options.script_args), "steps": options.steps, "seed": options.seed},
                seed=options.seed)


# ---------------------------------------------------------------- observing
def _side_case(options: ValidateOptions, side: str, *, perturb_seed: int | None = None,
               precision: dict | None = None, label: str | None = None, draws: str = "shared",
               own_stream: tuple[int, ...] = ()) -> Case:
    """One side's case; ``label`` names it (and its folder) where one side runs twice (the target on its own
    random stream: side "target", label "target-own")."""
    label = label or side
    spec = ChildSpec(perturb_seed=perturb_seed, precision=precision,
        script=options.script.path, convention=options.script.convention, side=side, target=options.target,
        reference=options.reference, mode=options.mode, steps=options.steps, steps_given=options.steps_given,
        seed=options.seed, out=str(Path(options.out) / "work" / label), script_args=options.script_args,
        localize=options.localize and options.nproc == 1 and label == side, backend_modules=options.backend_modules,
        nproc=options.nproc, draws=draws, own_stream=own_stream, device_alias=options.device_alias)
    return Case(kind="script-side", name=options.script.path, mode=label, config=spec.to_config())


def _describe_failure(outcome: Outcome, last: dict) -> str:
    phase = last.get("phase", "start-up")
    step = last.get("step")
    during = f"during {phase}" + (f" (step {step})" if step else "")
    if outcome.status is Status.TIMEOUT:
        return f"did not finish within {outcome.evidence.get('timeout_s', 0):g} s ({during})"
    signal = outcome.evidence.get("signal", "")
    if outcome.status is Status.CRASH and signal.startswith("SIG"):
        return f"the process was killed by {signal} {during}"
    return f"{outcome.message} {during}"


def run_sides(options: ValidateOptions, on_progress: ProgressFn | None = None) -> dict:
    """Runs the sides and returns the merged observations; ScriptProblem for the script's own faults."""
    import time

    start = time.monotonic()
    if options.device_alias is None:
        options = replace(options, device_alias=_script_device(options, options.script.names_device,
                                                               cuda=options.script.written_for_cuda))
    os.environ[HARNESS_OUTPUTS_ENV] = harness_outputs()  # the sides inherit it: a shell redirection is ours
    training = options.script.convention != FUNCTIONS
    cores = os.cpu_count() or 1
    settings = RunSettings(target=options.target, reference=options.reference,
                           backend_modules=options.backend_modules, timeout_s=options.timeout_s,
                           rss_limit_mb=options.rss_limit_mb, threads=max(1, cores // 2) if training else 0,
                           env={PRELOAD_ENV: ",".join(options.script.libraries)} if options.script.libraries else {})
    if training:
        cpu_env = CPU_SIDE_ENV if options.reference.split(":")[0] == "cpu" else {}
        jobs = [Job(case=_side_case(options, "reference"), env=cpu_env), Job(case=_side_case(options, "target"))]
    else:
        jobs = [Job(case=_side_case(options, "both"))]
    last: dict[str, dict] = {}

    def progress(case: Case, event: dict) -> None:
        last[case.mode] = event
        if on_progress is not None:
            on_progress(event.get("side", case.mode), event)

    seen: dict[str, dict | None] = {}
    failed: dict[str, str] = {}
    with Supervisor(settings, jobs=len(jobs), fresh=True, on_progress=progress) as supervisor:
        for job, outcome in supervisor.run_jobs(jobs):
            side = job.case.mode
            if outcome.status is Status.PASS:
                seen[side] = outcome.evidence["observations"]
            else:
                seen[side] = None
                failed[side] = _describe_failure(outcome, last.get(side, {}))
            if side == "reference" and _fails(options, seen[side]):
                break  # the script's problem: the target's side is stopped, not waited for
    reference = seen.get("reference")
    if options.device_alias is None and (alias := _script_device(options, _error_names(reference),
                                                                 cuda=_cuda_missing(reference))):
        return run_sides(replace(options, device_alias=alias), on_progress)
    for data in seen.values():
        if data is not None and data.get("script_problem"):
            raise ScriptProblem(data["script_problem"])
    if not training:
        data = seen.get("both")
        if data is None:
            death = failed.get("both", "no result")
            event = last.get("both", {})
            if event.get("side") == "target" or event.get("phase") in ("localize", "compile"):
                data = {"convention": FUNCTIONS, "notes": [], "reference": {"ran": True},
                        "target": {"ran": False, "crash": death}}
            else:
                raise ScriptProblem(f"the script's process died on the reference side: {death}")
    else:
        ref_data, tgt_data = seen.get("reference"), seen.get("target")
        if ref_data is None:
            raise ScriptProblem(f"the script's process died on the reference ({options.reference}): "
                                f"{failed.get('reference', 'no result')}")
        ref = ref_data.get("reference", {})
        if tgt_data is None:
            tgt_data = {"target": {"ran": False, "crash": failed.get("target", "no result")}, "notes": []}
        data = {k: v for k, v in tgt_data.items() if k not in ("reference", "side", "manifest")}
        data["convention"] = "training"
        data["reference"] = ref
        data["target"] = tgt_data.get("target", {})
        data["manifest"] = {"target": tgt_data.get("manifest"), "reference": ref_data.get("manifest")}
        data["notes"] = list(ref_data.get("notes", [])) + list(tgt_data.get("notes", []))
        _check_training_script(options, data)
        _band_sides(options, settings, data, progress)
    data["device_alias"] = options.device_alias
    data["seconds"] = time.monotonic() - start
    return data


def _script_device(options: ValidateOptions, names: Callable[[str], bool], *, cuda: bool) -> str | None:
    """The device type the script names for its device, where every side must take it for its own
    (validate.named_device): the target's, for a script moved to Trainium (``names`` says whether its source,
    or the error it raised on the reference, names a device type; an argument after ``--`` may name it too:
    ``--device neuron``), or ``cuda`` for a script written for CUDA (``cuda``: its source picks CUDA with no
    other way to choose a device, or CUDA's absence failed it on the reference). None where neither."""
    device = TargetSpec.parse(options.target).device
    if options.reference.split(":")[0] != "cpu" or device == "cpu":
        return None
    spelled = (a.rpartition("=")[2] for a in options.script_args)
    if names(device) or any(device_type_of(a) == device for a in spelled):
        return device
    return "cuda" if cuda and device != "cuda" else None


_NO_CUDA = ("nvidia driver", "torch not compiled with cuda", "no cuda gpus are available", "cuda is not available",
            "processgroupnccl is only supported with gpus")


def _reference_error(data: dict | None) -> str:
    return ((((data or {}).get("reference") or {}).get("error") or {}).get("message") or "")


def _error_names(data: dict | None) -> Callable[[str], bool]:
    """Whether the reference's failure names a device type: "Expected one of cpu, cuda, ... device string:
    neuron", or a backend that has not registered a module (``torch.autocast("neuron")``)."""
    message = _reference_error(data)
    return lambda device: re.search(rf"\b{re.escape(device)}\b", message) is not None


def _cuda_missing(data: dict | None) -> bool:
    """Whether the reference failed for want of CUDA ("Found no NVIDIA driver on your system"): a script
    hard-wired to CUDA."""
    message = _reference_error(data).lower()
    return any(words in message for words in _NO_CUDA)


STREAM_RUNS = 3  # reference trainings with other random streams: the band of the device's own stream


def _band_sides(options: ValidateOptions, settings: RunSettings, data: dict, progress) -> None:
    """The sides that give the curves their bands, once the reference and the target have run.

    * ``perturbed-K`` (NOISE_RUNS of them, where ``diff.curves.band_precision`` asks for them: a target with a
      precision model, or one that computes like the CPU whose curve is not the reference's): the reference
      with the target's precision (float32 rounding for the latter) perturbing its ops, drawing the same
      numbers: the band of the target's curve, whose draws were the reference's (diff.draws).
    * where the target drew random numbers on the device: ``target-own``, the target on its own random
      stream, and ``stream-K`` (STREAM_RUNS), the reference with those draws taken from other streams (and
      perturbed likewise): the band of the device's own stream, judged as a distribution.

    A side that gives no curve, or a shorter one, runs once more; if it still does not, that is a harness
    finding (``data["harness"]``), never a wider band.
    """
    from diff.curves import NOISE_RUNS, band_precision
    from diff.draws import DrawLog, compare_streams, first_parting
    from diff.precision import EXACT, PrecisionModel

    ref, tgt = data["reference"], data["target"]
    if not (ref.get("curve") and tgt.get("curve")):
        return
    ref_draws, tgt_draws = DrawLog.from_dict(ref.get("draws")), DrawLog.from_dict(tgt.get("draws"))
    parting = first_parting(ref_draws, tgt_draws)
    if parting is not None and ((parting.target is None and tgt.get("error"))
                                or (parting.reference is None and ref.get("error"))):
        parting = None  # a side that failed drew nothing more from there: its failure is the finding
    on_device = tuple(tgt_draws.on_device)
    data["draws"] = {"reference": len(ref_draws), "target": len(tgt_draws), "on_device": len(on_device),
                     "ops_on_device": sorted({tgt_draws.draws[i].op for i in on_device}),
                     "parting": parting.describe() if parting else None,
                     "unshared": sorted(tgt_draws.unshared),
                     "log_bytes": len(json.dumps(ref.get("draws") or {}))}
    model = band_precision(PrecisionModel.from_dict(data["precision_model"]) if data.get("precision_model") else EXACT,
                           ref["curve"]["losses"], tgt["curve"]["losses"])
    cpu_env = CPU_SIDE_ENV if options.reference.split(":")[0] == "cpu" else {}
    jobs = []
    if model:
        jobs += [Job(case=_side_case(options, "reference", label=f"perturbed-{k}", precision=model.to_dict(),
                                     perturb_seed=options.seed * 1_000_003 + k), env=cpu_env)
                 for k in range(NOISE_RUNS)]
    own_stream = bool(on_device) and options.nproc == 1 and parting is None and not tgt.get("error")
    if own_stream:
        jobs.append(Job(case=_side_case(options, "target", label="target-own", draws="own")))
        jobs += [Job(case=_side_case(options, "reference", label=f"stream-{k}", own_stream=on_device,
                                     perturb_seed=options.seed * 1_000_003 + 101 + k,
                                     precision=model.to_dict() if model else None), env=cpu_env)
                 for k in range(STREAM_RUNS)]
    elif on_device and options.nproc > 1:
        data["notes"].append("the ranks drew random numbers on the device: their own streams are not judged apart "
                             "under --nproc (every rank took the reference's draws)")
    sides, failures = _sides_with_curves(jobs, settings, progress, steps=len(ref["curve"]["losses"]))
    # A reference side that gave no curve is the harness's problem; the target on its own stream failing
    # (a random kernel that raises or crashes) is the target's.
    data.setdefault("harness", []).extend(f"side {label}: {why} (after a second try)"
                                          for label, why in failures.items() if label != "target-own")
    data["perturbed_curves"] = [sides[j.case.mode]["curve"] for j in jobs if j.case.mode.startswith("perturbed-")
                                and j.case.mode in sides]
    data["perturbed_expected"] = NOISE_RUNS if model else 0
    if own_stream:
        own = sides.get("target-own") or {}
        differences = compare_streams(ref_draws, DrawLog.from_dict(own.get("draws")), on_device) if own else []
        data["own_stream"] = {"target": own.get("curve"), "expected": STREAM_RUNS, "seconds": own.get("seconds"),
                              "failure": failures.get("target-own"),
                              "streams": [sides[j.case.mode]["curve"] for j in jobs if j.case.mode.startswith("stream-")
                                          and j.case.mode in sides],
                              "draw_differences": [d.describe() for d in differences]}


def _sides_with_curves(jobs: list[Job], settings: RunSettings, progress, *,
                       steps: int) -> tuple[dict[str, dict], dict[str, str]]:
    """Each job's side observations by its label, and why each job without a full curve has none (one that
    died or gave no curve without an error ran once more first; one whose script raised did not: that is
    its result)."""
    curves: dict[str, dict] = {}
    why: dict[str, str] = {}
    raised: set[str] = set()
    for attempt in range(2):
        todo = [j for j in jobs if j.case.mode not in curves and j.case.mode not in raised]
        if not todo:
            break
        with Supervisor(settings, jobs=min(len(todo), max(2, os.cpu_count() or 1)), fresh=True,
                        on_progress=progress) as supervisor:
            for job, outcome in supervisor.run_jobs(todo):
                label = job.case.mode
                if outcome.status is not Status.PASS:
                    why[label] = f"{outcome.status.value}: {outcome.message}"
                    continue
                observed = outcome.evidence["observations"]
                side = observed.get(ChildSpec.from_config(job.case.config).side) or {}
                curve = side.get("curve")
                if curve and len(curve.get("losses", ())) >= steps:
                    curves[label] = side
                    continue
                error = (side.get("error") or {}).get("message")
                if error:
                    raised.add(label)
                why[label] = (f"it raised: {error}" if error else
                              f"it gave {len(curve['losses'])} of {steps} steps" if curve else "it gave no loss curve")
    return curves, {j.case.mode: why.get(j.case.mode, "no result") for j in jobs if j.case.mode not in curves}


def _fails(options: ValidateOptions, data: dict | None) -> bool:
    """Whether a reference result alone already makes the check a script problem."""
    if data is None or data.get("script_problem"):
        return True
    if options.script.convention == FUNCTIONS:
        return False
    try:
        _check_training_script(options, {"reference": data.get("reference", {})})
    except ScriptProblem:
        return True
    return False


def _check_training_script(options: ValidateOptions, data: dict) -> None:
    """A training script that fails on the reference, names no model, or never trains when asked is the script's fault."""
    ref = data["reference"]
    error = ref.get("error")
    if error:
        where = f" ({error['source']['text']})" if error.get("source") else ""
        if error.get("import_error"):
            raise ScriptProblem(f"the script fails to import: {error['message']}{where}")
        hint = ""
        message = error["message"].lower()
        if options.device_alias and (options.device_alias in message or "privateuse1" in message):
            hint = (f"; the script names the {options.device_alias} device itself, which the reference takes for "
                    "the CPU, and this use of it has no CPU counterpart (a generator or a stream made on the "
                    "device): pick the device with torch.accelerator or a --device option")
        elif "neuron" in message:
            hint = ("; the script names the neuron device directly: pick it with torch.accelerator or a "
                    "--device option so that the reference can run on the CPU")
        elif any(m in message for m in ("nvidia driver", "cuda", "torch not compiled with cuda")):
            hint = ("; the script is hard-wired to CUDA: if it takes a device option, pass the placeholder "
                    "{device} for it after -- (for example: -- --device={device}), which each side replaces with "
                    "its own device; otherwise pick the device with torch.accelerator.current_accelerator()")
        raise ScriptProblem(f"the script fails on the reference ({options.reference}): {error['message']}{where}{hint}")
    if not ref.get("model") and not ref.get("curve"):
        if ref.get("called_in_transforms"):
            names = ", ".join(ref["called_in_transforms"])
            raise ScriptProblem(
                f"no model to compare: the script calls its model ({names}) only inside torch.func transforms "
                "(vmap, grad, jacrev, functional_call under them), whose inputs are functorch's wrappers with no "
                "values of their own to compare; call the model once outside a transform (on one batch, for "
                "example) and that call is compared")
        said = _last_output_line(Path(options.out) / "work" / "reference")
        raise ScriptProblem("no model found: the script defines no get_model() and get_inputs() (or model and "
                            "example_inputs), and running it called no torch.nn.Module with parameters"
                            + (f"; its last output on the reference: {said!r}" if said else ""))
    if options.steps_given and options.steps and not ref.get("curve"):
        started = (ref.get("outputs") or {}).get("processes") or 0
        raise ScriptProblem(
            f"--steps {options.steps}: the script never called backward(), so there is no loss curve to compare"
            + (f"; it started {started} process{'es' if started > 1 else ''} of its own (multiprocessing), "
               "where it may train, and the harness follows only the script's own process; "
               "pass --steps 0 to check the rest" if started else ""))


def _last_output_line(side_folder: Path) -> str:
    """The last line a side's script printed (rank 0's on a --nproc side): why it ended without training
    ("Unable to locate sufficient 2 gpus to run this example. Exiting.", pytorch/examples' FSDP2)."""
    logs = [side_folder / "stdout.txt", *sorted(side_folder.glob("ranks/*/attempt_*/0/stdout.log"))]
    for log in reversed(logs):
        try:
            lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1][:200]
    return ""


# ---------------------------------------------------------------- the check
# Which outcome a not-ready check is, by the check of its first error.
ERROR_STATUS = {"runs": Status.ERROR, "numerics": Status.MISMATCH, "loss-curves": Status.MISMATCH,
                "host-fallback": Status.CPU_FALLBACK, "placement": Status.ERROR}


def outcome_of(case: Case, verdict: str, findings: list[Finding], report_path: str | None, seconds: float) -> Outcome:
    """The check as an Outcome: ready (with or without warnings) passes; not ready fails as its first error says."""
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity == "warning"]
    evidence = {"verdict": verdict, "findings": [f.to_dict() for f in findings][:50],
                "artifacts": {"report": report_path} if report_path else {}}
    if not errors:
        message = verdict + (f": {len(warnings)} warning{'s' if len(warnings) != 1 else ''}, first: {warnings[0].title}"
                             if verdict == READY_WITH_WARNINGS else "")
        return Outcome(case_id=case.id, status=Status.PASS, message=message, evidence=evidence, duration_s=seconds)
    first = errors[0]
    status = ERROR_STATUS.get(first.check, Status.ERROR)
    if first.check == "runs":  # the target raised (unsupported or an error, as the judge classifies it) or died
        status = Status.CRASH if first.title.startswith("crashes") else classify_error(first.title)
    where = f" ({first.where})" if first.where else ""
    more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
    evidence["error"] = first.title
    return Outcome(case_id=case.id, status=status, message=f"{verdict}: {first.title}{where}{more}", evidence=evidence,
                   duration_s=seconds)


def validate_script(options: ValidateOptions, *, target, reference, on_progress: ProgressFn | None = None) -> Validation:
    """Observes, checks and reports one script; raises ScriptProblem when the script itself is at fault.

    ``target`` and ``reference`` are the resolved conformance.target.Targets (for labels and manifests).
    """
    case = script_case(options)
    obs = run_sides(options, on_progress)
    ctx = CheckContext(target=target.describe(), reference=reference.describe(), device=target.device.type,
                       mode=options.mode, emulated=target.is_emulated, curve_tolerance=options.curve_tolerance)
    findings = run_checks(obs, ctx)
    verdict = verdict_of(findings)
    curves = curve_comparison(obs, options.curve_tolerance)
    report = build_report(obs=obs, findings=findings, verdict=verdict, script=options.script, options=options,
                          argv=list(options.argv), curves=curves,
                          labels={"target": target.describe(), "reference": reference.describe()})
    write_reports(report, Path(options.out), curves)
    outcome = outcome_of(case, verdict, findings, str(Path(options.out) / "report.json"), obs.get("seconds") or 0.0)
    return Validation(case=case, outcome=outcome, report=report, findings=findings, verdict=verdict, curves=curves)


def problem_outcome(options: ValidateOptions, problem: ScriptProblem) -> tuple[Case, Outcome]:
    """A script that cannot be checked: a skip, with the reason, so the store and the dashboard show it."""
    case = script_case(options)
    return case, Outcome(case_id=case.id, status=Status.SKIP, message=f"the script cannot be checked: {problem}",
                         evidence={"script_problem": str(problem)})
