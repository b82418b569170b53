"""The executors of user scripts, for the runner's workers.

- ``script-side``: one side of a check (validate/run.py makes these cases): the functions
  convention's process, or one side of an unchanged training script. The script's own
  stdout and stderr go to the side's folder; the observations come back as the outcome's
  evidence.
- ``script``: a whole check, as one case of a suite (``neuron-conformance scripts DIR``) or a
  gate's rerun: its sides run in fresh processes of their own, and its outcome is the verdict.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path

from conformance.case import Case
from conformance.outcome import Outcome, Status
from runner.executors import Executor

from .common import PRELOAD_ENV, ChildSpec, ScriptProblem, json_ready
from .script import FUNCTIONS, ScriptError, inspect_script
from .workdir import own_working_directory


@contextmanager
def _output_to(folder: str):
    """The process's stdout and stderr (file descriptors 1 and 2, so C code's output too) into files."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(Path(folder) / "stdout.txt", "w") as out, open(Path(folder) / "stderr.txt", "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def execute_side(case: Case, ctx) -> Outcome:
    spec = ChildSpec.from_config(case.config)

    def progress(**event) -> None:
        ctx.progress(event)

    warnings.simplefilter("default")  # as `python SCRIPT` shows them
    with _output_to(spec.out):
        if spec.convention == FUNCTIONS:  # one process runs every side: nothing to collide with
            from .functions import observe

            observations = observe(spec, progress)
        elif spec.nproc > 1:
            observations = observe_ranks(spec, progress)
        else:
            from .training import observe

            with own_working_directory(spec.out) as files:
                observations = observe(spec, progress)
            if isinstance(observations.get(spec.side), dict):
                observations[spec.side]["outputs"] = files
    return Outcome(case_id=case.id, status=Status.PASS, message=f"{spec.side} side observed",
                   evidence={"observations": json_ready(observations)})


def _observe_rank(config: dict) -> dict:
    """One rank of a torchrun-style script's side (in a process of PyTorch's elastic launcher)."""
    from .training import observe

    spec = ChildSpec.from_config(config)
    rank = os.environ.get("RANK", "0")
    with own_working_directory(os.path.join(spec.out, f"rank{rank}")):
        observations = json_ready(observe(spec, lambda **event: None))
    error = (observations.get(spec.side) or {}).get("error")
    if error and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The others may wait for this rank, in the group's rendezvous or a collective, until the group's
        # timeout (30 min): as under torchrun, a rank whose script failed fails, and the launcher stops the
        # others. What it observed goes to the side's report from its file.
        with open(_failed_rank_file(spec.out, rank), "w") as f:
            json.dump(observations, f)
        raise RuntimeError(f"{error.get('type', 'Error')}: {error.get('message', '')}")
    return observations


def _failed_rank_file(out: str, rank) -> str:
    return os.path.join(out, f"rank{rank}-failed.json")


EMULATOR_DEVICES_ENV = "NEURON_VALIDATE_EMULATOR_DEVICES"  # the emulated device's count (emulator/csrc/runtime.cpp)


def observe_ranks(spec: ChildSpec, progress) -> dict:
    """A side of ``--nproc N``: the script on N ranks (RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous set,
    as torchrun sets them); rank 0's observations, with the loss curve averaged over the ranks (each rank's
    loss is its own batch's)."""
    from distributed.launch import RankFailure, run_ranks

    progress(side=spec.side, phase=f"run on {spec.nproc} ranks")
    for rank in range(spec.nproc):  # a failure an earlier run of this side left (the retry with cuda taken)
        with suppress(FileNotFoundError):
            os.remove(_failed_rank_file(spec.out, rank))
    # A device per rank, as on a Trainium host's NeuronCores: a script takes device LOCAL_RANK
    # (torch.cuda.set_device(local_rank), .to(local_rank)), which one emulated device shared by every rank lacks.
    saved = os.environ.get(EMULATOR_DEVICES_ENV)
    os.environ[EMULATOR_DEVICES_ENV] = str(max(spec.nproc, int(saved or 1)))  # the ranks' fork server reads it
    try:
        ranks = run_ranks(_observe_rank, spec.nproc, spec.to_config(), logs=os.path.join(spec.out, "ranks"),
                          fresh=True)
    except RankFailure as failure:
        return _failed_side(spec, failure)
    finally:
        if saved is None:
            os.environ.pop(EMULATOR_DEVICES_ENV, None)
        else:
            os.environ[EMULATOR_DEVICES_ENV] = saved
    observations = ranks[0]
    curves = [(r.get(spec.side) or {}).get("curve") for r in ranks]
    side = observations.get(spec.side) or {}
    if all(curves) and len({len(c["losses"]) for c in curves}) == 1:
        losses = [sum(c["losses"][k] if c["losses"][k] is not None else float("nan") for c in curves) / len(curves)
                  for k in range(len(curves[0]["losses"]))]
        side["curve"] = {**curves[0], "losses": losses}
    observations.setdefault("notes", []).append(
        f"{spec.nproc} ranks on this side: the loss curve is the mean of the ranks' losses; layers are not compared")
    return observations


def _failed_side(spec: ChildSpec, failure) -> dict:
    """The side's observations where a rank failed: those of the rank whose script failed first (_observe_rank:
    the others may fail after it, in a collective it left; the launcher names the first rank to end, which may
    be one it stopped), else the launcher's message alone (a rank that died)."""
    written = {r: os.stat(_failed_rank_file(spec.out, r)).st_mtime_ns for r in range(spec.nproc)
               if os.path.exists(_failed_rank_file(spec.out, r))}
    failed = min(written, key=written.get) if written else failure.rank
    try:
        with open(_failed_rank_file(spec.out, failed)) as f:
            observations = json.load(f)
    except (OSError, ValueError):
        return {"convention": "training", "notes": [], "side": spec.side,
                spec.side: {"ran": False, "error": {"type": failure.message.split(":")[0], "message": str(failure),
                                                    "source": None, "phase": "run", "import_error": False}}}
    side = observations.get(spec.side) or {}
    if failed:
        side["error"] = {**side["error"], "message": f"rank {failed}: {side['error'].get('message', '')}"}
    observations.setdefault("notes", []).append(
        f"{spec.nproc} ranks on this side: rank {failed}'s script failed, and the others were stopped")
    return observations


def execute_script(case: Case, ctx) -> Outcome:
    """A whole check of the script ``case.name`` against the run's target; its report goes to the artifacts."""
    from diff.curves import CurveTolerance

    from .run import ValidateOptions, problem_outcome, validate_script

    try:
        script = inspect_script(case.name)
    except ScriptError as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"the script cannot be checked: {exc}")
    settings = ctx.settings
    out = (ctx.artifacts or Path("runs") / "artifacts") / "scripts" / case.id
    steps = case.config.get("steps")
    options = ValidateOptions(
        script=script, target=settings.target, reference=settings.reference, mode=case.mode or "eager",
        steps=steps, steps_given=steps is not None, seed=int(case.config.get("seed", 0)), out=out,
        script_args=tuple(case.config.get("args", ())), timeout_s=settings.timeout_s,
        backend_modules=settings.backend_modules, curve_tolerance=CurveTolerance(),
        rss_limit_mb=settings.rss_limit_mb, argv=(case.name,))
    try:
        validation = validate_script(options, target=ctx.target, reference=ctx.reference,
                                     on_progress=lambda side, event: ctx.progress({**event, "side": side}))
    except ScriptProblem as exc:
        return problem_outcome(options, exc)[1]
    outcome = validation.outcome
    if outcome.case_id != case.id:  # the suite's case carries what the check ran: they must agree
        outcome.evidence["case_mismatch"] = validation.case.id
        outcome.case_id = case.id
    return outcome


def _preload_side() -> None:
    """What a side imports at once, loaded before its worker is forked (runner.zygote, which has imported
    torch and ``torch._dynamo``), so that a check pays it once for each side's zygote rather than in each of
    its eight sides: the side's own recording modules, and the model libraries the script imports
    (:data:`PRELOAD_ENV`: transformers alone takes 3 s). One the script would fail to import is left to fail
    there, in the script's own words."""
    import importlib

    from . import functions, training  # noqa: F401

    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the script's import raises it again, as the script's problem
            pass


SIDE_EXECUTOR = Executor(kind="script-side", execute=execute_side, resolves_targets=False, shows_warnings=True,
                         warmup=_preload_side)
EXECUTOR = Executor(kind="script", execute=execute_script, shows_warnings=True)
