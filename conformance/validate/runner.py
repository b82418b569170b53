"""Runs the user's script in child processes and gathers their observations.

The functions convention needs one child (the worker drives every side);
a training script runs once per side, the reference with backend autoload
off so that it sees the CPU, both at once on half the cores each. Children
write progress lines that the parent polls for live status, and a
``result.json`` when they finish. A child that dies (a crash in the target
backend), hangs past the timeout, or leaves no result still yields an
observation: a crash on the target side is a finding, on the reference side
it is the script's problem.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .common import RESULT_FILE, ChildSpec, ScriptProblem
from .script import FUNCTIONS, ScriptInfo

ProgressFn = Callable[[str, dict], None]  # (side, event)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
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


@dataclass(slots=True)
class _Child:
    side: str
    spec: ChildSpec
    process: subprocess.Popen
    started: float
    progress_pos: int = 0
    last_event: dict = field(default_factory=dict)
    timed_out: bool = False
    stopped: bool = False  # killed because the reference failed
    stdout: object = None
    stderr: object = None


def _env(side: str, reference: str) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONWARNINGS", "default")
    if side == "reference" and reference.split(":")[0] == "cpu":
        # The script must see no accelerator: no backend registers at `import torch`.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        env["NEURON_VALIDATE_EMULATOR_AUTOLOAD"] = "0"
    return env


def _spawn(side: str, spec: ChildSpec, module: str, reference: str) -> _Child:
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in (RESULT_FILE, "progress.jsonl"):
        (out / name).unlink(missing_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(spec.to_json())
    stdout = open(out / "stdout.txt", "w")
    stderr = open(out / "stderr.txt", "w")
    process = subprocess.Popen([sys.executable, "-m", module, str(spec_path)], stdout=stdout, stderr=stderr,
                               stdin=subprocess.DEVNULL, env=_env(side, reference), start_new_session=True)
    return _Child(side=side, spec=spec, process=process, started=time.monotonic(), stdout=stdout, stderr=stderr)


def _poll_progress(child: _Child, on_progress: ProgressFn | None) -> None:
    path = Path(child.spec.progress)
    if not path.exists():
        return
    with open(path) as f:
        f.seek(child.progress_pos)
        data = f.read()
    # only whole lines
    end = data.rfind("\n")
    if end < 0:
        return
    child.progress_pos += end + 1
    for line in data[: end + 1].splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        child.last_event = event
        if on_progress is not None:
            on_progress(event.get("side", child.side), event)


def _kill(child: _Child) -> None:
    try:
        os.killpg(child.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.process.wait()


def _wait(children: list[_Child], timeout_s: float, on_progress: ProgressFn | None,
          reference_failed: Callable[[dict | None], bool] | None = None) -> None:
    """Waits for the children; once the reference has failed (``reference_failed(its result)``), stops the rest."""
    while True:
        alive = False
        for c in children:
            _poll_progress(c, on_progress)
            if c.process.poll() is None:
                alive = True
                if time.monotonic() - c.started > timeout_s:
                    c.timed_out = True
                    _kill(c)
        reference = next((c for c in children if c.side == "reference"), None)
        if (alive and reference_failed is not None and reference is not None and reference.process.poll() is not None
                and reference_failed(_read(reference, 0))):
            for c in children:
                if c.process.poll() is None:
                    c.stopped = True
                    _kill(c)
            alive = False
        if not alive:
            break
        time.sleep(0.1)
    for c in children:
        _poll_progress(c, on_progress)
        c.stdout.close()
        c.stderr.close()


def _describe_death(child: _Child, timeout_s: float) -> str:
    code = child.process.returncode
    phase = child.last_event.get("phase", "start-up")
    step = child.last_event.get("step")
    during = f"during {phase}" + (f" (step {step})" if step else "")
    if child.timed_out:
        return f"did not finish within {timeout_s:g} s ({during})"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the process was killed by {name} {during}"
    tail = ""
    err = Path(child.spec.out) / "stderr.txt"
    if err.exists():
        lines = [x for x in err.read_text(errors="replace").strip().splitlines() if x.strip()]
        tail = f": {lines[-1][:300]}" if lines else ""
    return f"the process exited with status {code} {during} without a result{tail}"


def _read(child: _Child, timeout_s: float) -> dict | None:
    path = Path(child.spec.out) / RESULT_FILE
    if child.timed_out or child.stopped or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def _spec(options: RunOptions, side: str, convention: str, out: Path, threads: int) -> ChildSpec:
    return ChildSpec(
        script=options.script.path, convention=convention, side=side, target=options.target,
        reference=options.reference, mode=options.mode, steps=options.steps, steps_given=options.steps_given,
        seed=options.seed, out=str(out), progress=str(out / "progress.jsonl"), script_args=options.script_args,
        localize=options.localize, backend_modules=options.backend_modules, threads=threads,
    )


def run_script(options: RunOptions, on_progress: ProgressFn | None = None) -> dict:
    """Runs the checks' children and returns the merged observations; ScriptProblem for the script's own faults."""
    work = Path(options.out) / "work"
    cores = os.cpu_count() or 1
    start = time.monotonic()
    if options.script.convention == FUNCTIONS:
        spec = _spec(options, "both", FUNCTIONS, work / "worker", threads=0)
        child = _spawn("both", spec, "conformance.validate.worker", options.reference)
        _wait([child], options.timeout_s, on_progress)
        data = _read(child, options.timeout_s)
        if data is None:
            death = _describe_death(child, options.timeout_s)
            if child.last_event.get("side") in ("target",) or child.last_event.get("phase") in ("localize", "compile"):
                data = {"convention": FUNCTIONS, "notes": [], "reference": {"ran": True},
                        "target": {"ran": False, "crash": death}}
            else:
                raise ScriptProblem(f"the script's process died on the reference side: {death}")
        if data.get("script_problem"):
            raise ScriptProblem(data["script_problem"])
    else:
        threads = max(1, cores // 2)
        ref_spec = _spec(options, "reference", "training", work / "reference", threads)
        tgt_spec = _spec(options, "target", "training", work / "target", threads)
        children = [_spawn("reference", ref_spec, "conformance.validate.bootstrap", options.reference),
                    _spawn("target", tgt_spec, "conformance.validate.bootstrap", options.reference)]
        _wait(children, options.timeout_s, on_progress, reference_failed=lambda d: _fails(options, d))
        ref_data, tgt_data = (_read(c, options.timeout_s) for c in children)
        for d in (ref_data, tgt_data):
            if d is not None and d.get("script_problem"):
                raise ScriptProblem(d["script_problem"])
        if ref_data is None:
            raise ScriptProblem(f"the script's process died on the reference ({options.reference}): "
                                f"{_describe_death(children[0], options.timeout_s)}")
        ref = ref_data.get("reference", {})
        if tgt_data is None:
            tgt_data = {"target": {"ran": False, "crash": _describe_death(children[1], options.timeout_s)},
                        "notes": []}
        data = {k: v for k, v in tgt_data.items() if k not in ("reference", "side", "manifest")}
        data["convention"] = "training"
        data["reference"] = ref
        data["target"] = tgt_data.get("target", {})
        data["manifest"] = {"target": tgt_data.get("manifest"), "reference": ref_data.get("manifest")}
        data["notes"] = list(ref_data.get("notes", [])) + list(tgt_data.get("notes", []))
        _check_training_script(options, data)
    data["seconds"] = time.monotonic() - start
    return data


def _fails(options: RunOptions, data: dict | None) -> bool:
    """Whether a reference result alone already makes the check a script problem."""
    if data is None or data.get("script_problem"):
        return True
    try:
        _check_training_script(options, {"reference": data.get("reference", {})})
    except ScriptProblem:
        return True
    return False


def _check_training_script(options: RunOptions, data: dict) -> None:
    """A training script that fails on the reference, names no model, or never trains when asked is the script's fault."""
    ref = data["reference"]
    error = ref.get("error")
    if error:
        where = f" ({error['source']['text']})" if error.get("source") else ""
        if error.get("import_error"):
            raise ScriptProblem(f"the script fails to import: {error['message']}{where}")
        hint = ""
        if "neuron" in error["message"].lower():
            hint = ("; the script names the neuron device directly: pick it with torch.accelerator or a "
                    "--device option so that the reference can run on the CPU")
        raise ScriptProblem(f"the script fails on the reference ({options.reference}): {error['message']}{where}{hint}")
    if not ref.get("model") and not ref.get("curve"):
        raise ScriptProblem("no model found: the script defines no get_model() and get_inputs() (or model and "
                            "example_inputs), and running it called no torch.nn.Module with parameters")
    if options.steps_given and options.steps and not ref.get("curve"):
        raise ScriptProblem(f"--steps {options.steps}: the script never called backward(), so there is no loss "
                            "curve to compare")
