"""The supervisor on local workers: isolation, the hard memory cap, the reference probe, the lifecycle.

(The same fault set on every transport: test_transports.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.outcome import Status
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases
from runner.supervisor import Job, Supervisor

REPO = Path(__file__).resolve().parents[2]


def case(op: str, **selection):
    (found,) = [c for c in op_cases(OpSelection(patterns=(op,), dtypes=("float32",), directions=("forward",),
                                                **selection)) if c.config["source"] == "opinfo"]
    return found


def settings(tmp_path, faults: str = "", **kw) -> RunSettings:
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": faults}
    return RunSettings(target="neuron", timeout_s=kw.pop("timeout_s", 300.0), warmup=("op",),
                       artifacts_dir=str(tmp_path / "artifacts"), env=env, **kw)


def test_the_memory_cap_is_hard_a_fast_allocation_cannot_overshoot_it(tmp_path):
    """A kernel that grabs 6 GiB at once under a 2 GiB cap: refused at the allocation, never resident."""
    mul = case("mul", max_samples=1)
    with Supervisor(settings(tmp_path, "hog@aten::mul,mb=6144", rss_limit_mb=2048)) as supervisor:
        (outcome,) = supervisor.run([mul])
    assert outcome.status is Status.CRASH, outcome
    assert outcome.message.startswith("exceeded the memory cap of 2048 MiB: "), outcome.message
    assert "can't allocate memory" in outcome.message
    # The probe ran the reference alone under the same cap, it fit, so the target is at fault and the
    # replacement worker wrote the reproducer.
    assert outcome.repro and Path(outcome.repro).is_file(), outcome.evidence
    assert outcome.evidence["memory_cap"] and outcome.evidence["peak_rss_mb"] < 2048, outcome.evidence
    # Before that, the case ran again with the reference's own share on top of the cap (the sides apart), and
    # overran there too: only then is it charged to the backend.
    apart = outcome.evidence["sides_apart"]
    assert apart["rss_limit_mb"] > 2048 and apart["message"].startswith("exceeded the memory cap of"), apart
    assert "infra_retries" not in outcome.evidence
    # Every worker it took is accounted for: the pool's, the one after the overrun, the one with the sides apart.
    assert supervisor.starts["pool"] >= 1 and supervisor.starts["sides apart"] == 1, supervisor.starts
    assert supervisor.starts["over the memory cap"] >= 1 and supervisor.warmup_seconds > 0, supervisor.starts


def test_a_worker_that_segfaults_under_the_shared_cap_runs_again_with_the_sides_apart(tmp_path):
    """sin's kernel dies of SIGSEGV while the worker's cap is below DIE_BELOW_MB (a library that does not check an
    allocation): the reference alone fits, so the case runs again with the reference's share on top of the cap
    and gets the verdict of that run, with the retry recorded. A kernel that crashes whatever its room is still
    a crash."""
    import os

    sin = case("sin", max_samples=2)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    tight = settings(tmp_path, rss_limit_mb=3072, backend_modules=("tests.fixtures.dies_under_tight_cap",))
    tight = replace(tight, env={**tight.env, **env})
    # The data limit a worker under this cap gets (the cap, plus what it had reserved and not touched): the
    # kernel dies below a little more than that, and lives with the reference's share (64 MiB at least) on top.
    with Supervisor(tight, persistent=True) as supervisor:
        supervisor.run_one(sin)
        limit = supervisor.workers()[0].info["memory_limit_bytes"]
    tight = replace(tight, env={**tight.env, "DIE_BELOW_BYTES": str(limit + (16 << 20))})
    with Supervisor(tight) as supervisor:
        (outcome,) = supervisor.run([sin])
    assert outcome.status is Status.PASS, outcome.message
    (retry,) = outcome.evidence["infra_retries"]
    assert retry["kind"] == "memory" and "the worker died (worker process died: SIGSEGV)" in retry["reason"], retry
    assert outcome.evidence["sides_apart"]["rss_limit_mb"] >= 3072 + 64

    crashing = replace(tight, env={**tight.env, "NEURON_VALIDATE_FAULTS": "crash@aten::sin", "DIE_BELOW_BYTES": "0"})
    with Supervisor(crashing) as supervisor:
        (outcome,) = supervisor.run([sin])
    assert outcome.status is Status.CRASH and "SIGSEGV" in outcome.message, outcome.message
    assert outcome.evidence["sides_apart"], "it died again with the sides apart"
    assert outcome.repro and Path(outcome.repro).is_file(), "a replacement worker wrote its reproducer"


def tight_cap_mlp(tmp_path, **env):
    """gaussian_mlp (eval) under a 3 GiB cap with tests/fixtures/overruns_under_tight_cap.py loaded (its knobs in
    ``env``), and the worker's data limit under that cap, measured with the fixture idle."""
    import os

    from model_zoo import default_config
    from model_zoo.execute import model_case

    mlp = model_case(default_config("robotics/gaussian_mlp", mode="eval"))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "NEURON_VALIDATE_EMULATOR_PROFILE": "exact", **env}
    tight = RunSettings(target="neuron", timeout_s=300.0, warmup=("model",), rss_limit_mb=3072, env=env,
                        artifacts_dir=str(tmp_path / "artifacts"),
                        backend_modules=("tests.fixtures.overruns_under_tight_cap",))
    with Supervisor(tight, persistent=True) as supervisor:
        (outcome,) = supervisor.run([mlp])
        assert outcome.status is Status.PASS, outcome.message  # OVERRUN_BELOW_BYTES unset: the kernel's own
        return mlp, tight, supervisor.workers()[0].info["memory_limit_bytes"]


def overrunning_below(settings: RunSettings, limit: int) -> RunSettings:
    """The same settings with the fixture's kernel overrunning while the worker's data limit is below ``limit``."""
    return replace(settings, env={**settings.env, "OVERRUN_BELOW_BYTES": str(limit)})


def passed_apart(case, settings: RunSettings):
    """Runs the case alone: it must pass after one memory retry with the sides apart. Returns the record of that
    (``evidence["sides_apart"]``) and the supervisor's worker starts."""
    with Supervisor(settings) as supervisor:
        (outcome,) = supervisor.run([case])
    assert outcome.status is Status.PASS, outcome.message
    (retry,) = outcome.evidence["infra_retries"]
    assert retry["kind"] == "memory" and "shared by the reference and the target" in retry["reason"], retry
    return outcome.evidence["sides_apart"], supervisor.starts


def test_a_target_over_the_shared_cap_goes_apart_without_probing_the_reference(tmp_path):
    """A model case whose target kernel asks for more memory than the shared cap leaves: the target runs first,
    overruns, and its CPU reference then runs to the end in the same worker. That run shows the reference fits
    alone and measures its share, so the case runs again with the sides apart at once (no probe, no worker in
    between) and gets that run's verdict, with the retry recorded. A target that overruns even with the cap to
    itself is still the backend's crash."""
    mlp, tight, limit = tight_cap_mlp(tmp_path)
    apart, starts = passed_apart(mlp, overrunning_below(tight, limit + (16 << 20)))
    assert apart["reference_measured"] == "measured in the shared run" and apart["reference_mb"] > 0, apart
    assert apart["rss_limit_mb"] >= 3072 + 64 and "exceeded the memory cap of 3072 MiB" in apart["first"], apart
    assert starts.get("over the memory cap", 0) == 0 and starts["sides apart"] == 1, starts

    with Supervisor(overrunning_below(tight, 1 << 62)) as supervisor:
        (outcome,) = supervisor.run([mlp])
    assert outcome.status is Status.CRASH and outcome.message.startswith("exceeded the memory cap of 3072 MiB"), \
        outcome.message
    assert outcome.evidence["sides_apart"]["message"].startswith("exceeded the memory cap of"), outcome.evidence
    assert "infra_retries" not in outcome.evidence
    assert outcome.repro and Path(outcome.repro).is_file(), "a pool worker wrote its reproducer"


def test_a_reference_over_the_shared_cap_goes_apart_without_a_probe_and_is_probed_only_if_it_overruns_again(tmp_path):
    """The CPU's own atanh asks for more memory than the shared cap leaves (a reference phase at the cap's edge, as
    the zoo's largest models are): the target ran to the end under the cap first, so it is known to fit, and the
    case runs again with the sides apart at once, the reference given a whole cap of its own (no probe, no worker
    in between). A reference that overruns even then is probed alone before anything is charged: it is the
    CPU's, a ``skip``, never the backend's crash."""
    # atanh: in the forward only (the build draws its actions with tanh)
    mlp, tight, limit = tight_cap_mlp(tmp_path, TIGHT_CAP_SIDE="reference", TIGHT_CAP_OP="atanh")
    apart, starts = passed_apart(mlp, overrunning_below(tight, limit + (16 << 20)))
    assert apart["reference_measured"].startswith("not measured: the target had run to the end"), apart
    assert apart["rss_limit_mb"] == 2 * 3072 and "exceeded the memory cap of 3072 MiB" in apart["first"], apart
    assert starts.get("over the memory cap", 0) == 0 and starts["sides apart"] == 1, starts

    with Supervisor(overrunning_below(tight, 1 << 62)) as supervisor:
        (outcome,) = supervisor.run([mlp])
    assert outcome.status is Status.SKIP and outcome.evidence.get("reference_at_fault"), outcome
    assert "exceeds the memory cap" in outcome.message, outcome.message
    assert outcome.evidence["sides_apart"]["message"].startswith("exceeded the memory cap of 6144 MiB"), outcome
    assert supervisor.starts["sides apart"] == 1 and supervisor.starts["pool"] == 2, "a worker of the pool probed it"


def test_a_target_keeps_the_whole_cap_beside_its_references_model(tmp_path):
    """Both sides of a model case run in one worker: while the target runs, the cap is raised by the reference's
    resident share (its built model), so a target that fits the cap by itself passes at once, with no retry.
    The room is that share, not more: a kernel that needs more than the cap beside it overruns there and is
    judged with the sides apart."""
    import os

    from model_zoo import build, default_config
    from model_zoo.execute import model_bytes, model_case

    config = default_config("timm/resnet18", mode="eval")
    resnet = model_case(config)
    room = model_bytes(build(config).model)
    assert room > 40 << 20, room
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "TIGHT_CAP_OP": "relu_"}
    tight = RunSettings(target="neuron", timeout_s=300.0, warmup=("model",), rss_limit_mb=3072, env=env,
                        backend_modules=("tests.fixtures.overruns_under_tight_cap",))
    with Supervisor(tight, persistent=True) as supervisor:
        supervisor.run_one(resnet)
        limit = supervisor.workers()[0].info["memory_limit_bytes"]
    # The kernel needs a data limit 24 MiB above the worker's own: more than the cap alone, less than the cap
    # with the reference's model (45 MiB) on top.
    needs = replace(tight, env={**env, "OVERRUN_BELOW_BYTES": str(limit + (24 << 20))})
    with Supervisor(needs) as supervisor:
        (outcome,) = supervisor.run([resnet])
    assert outcome.status is Status.PASS, outcome.message
    assert "infra_retries" not in outcome.evidence and "sides_apart" not in outcome.evidence, outcome.evidence
    assert outcome.evidence["memory_allowance_mb"]["target"] >= room / 2**20, outcome.evidence
    assert supervisor.starts == {"pool": 1}, supervisor.starts

    beyond = replace(tight, env={**env, "OVERRUN_BELOW_BYTES": str(limit + room + (48 << 20))})
    with Supervisor(beyond) as supervisor:
        (outcome,) = supervisor.run([resnet])
    assert outcome.status is Status.PASS, outcome.message
    assert outcome.evidence["sides_apart"]["first"].startswith("exceeded the memory cap of 3072 MiB"), outcome.evidence


def test_a_cap_below_the_worker_itself_is_refused_in_one_line(tmp_path):
    from runner.supervisor import TransportError

    with pytest.raises(TransportError, match=r"--rss-limit-mb 64: below what a worker holds before its first case"):
        list(Supervisor(settings(tmp_path, rss_limit_mb=64)).run([case("mul", max_samples=1)]))


def test_fresh_processes_run_followups_and_repro_only_jobs(tmp_path):
    """The gate's way: a process per job; a job may ask only for the reproducer of an earlier outcome."""
    sort, add = case("sort", max_samples=1), case("add", max_samples=1)
    with Supervisor(settings(tmp_path, "crash@aten::sort"), jobs=2, fresh=True) as supervisor:
        queue = deque([Job(case=sort, attempt=1), Job(case=add, attempt=1)])
        seen = {}
        for job, outcome in supervisor.run_jobs(queue):
            seen[(job.case.name, job.attempt)] = outcome
            if job.case.name == "add" and job.attempt == 1:
                queue.append(Job(case=add, attempt=2))  # appended while running, as the gate does
        crashed = seen[("sort", 1)]
        assert crashed.status is Status.CRASH and crashed.message == "worker process died: SIGSEGV"
        assert seen[("add", 1)].status is Status.PASS and seen[("add", 2)].status is Status.PASS
        assert "Fatal Python error: Segmentation fault" in crashed.evidence["fault_traceback"]
        (job, again), = list(Supervisor(settings(tmp_path), fresh=True).run_jobs([Job(case=sort, repro_of=crashed)]))
    assert job.repro_of is crashed and again.repro and Path(again.repro).is_file()


def test_a_case_with_its_own_environment_needs_fresh_processes(tmp_path):
    with pytest.raises(ValueError, match="needs fresh processes"):
        list(Supervisor(settings(tmp_path)).run([Job(case=case("add"), env={"X": "1"})]))


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=r"jobs=0 \(type=int\): must be >= 1"):
        Supervisor(settings(tmp_path), jobs=0)


def test_workers_die_with_a_killed_run(tmp_path):
    """SIGKILL of the run alone (not its process group) must not leave workers computing."""
    import psutil

    script = tmp_path / "run.py"
    script.write_text(
        "import time\n"
        "from conformance.settings import RunSettings\n"
        "from runner.supervisor import Supervisor\n"
        "if __name__ == '__main__':\n"
        "    supervisor = Supervisor(RunSettings(target='cpu'), jobs=2, persistent=True)\n"
        "    slots = [supervisor._spawn() for _ in range(2)]\n"
        "    ready = set()\n"
        "    while len(ready) < 2:\n"
        "        ready |= {i for i, s in enumerate(slots) for r in s.handle.receive() if r[0] == 'ready'}\n"
        "        time.sleep(0.1)\n"
        "    print(' '.join(str(s.handle.pid) for s in slots), flush=True)\n"
        "    time.sleep(600)\n")
    # Killed, the run cannot remove its crash folder: it goes into the test's own temporary folder.
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                           env={**os.environ, "TMPDIR": str(tmp_path)})
    pids = [int(p) for p in run.stdout.readline().split()]
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    run.kill()
    run.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_a_reference_that_raises_in_a_used_worker_runs_again_in_a_fresh_one(tmp_path):
    """A library an earlier case left broken (oneDNN's "could not create a primitive", 64 skips in a row in one
    long-lived worker) makes the next cases' references raise: each is run again in a fresh worker, and the
    broken worker is retired. A reference that raises in the fresh worker too is still the case's skip."""
    import os

    from model_zoo import default_config
    from model_zoo.execute import model_case

    sin = case("sin", max_samples=1)
    mlp = model_case(default_config("robotics/gaussian_mlp", mode="train"))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    base = replace(settings(tmp_path, backend_modules=("tests.fixtures.poisoned_by_an_earlier_case",)),
                   warmup=("op", "model"))
    clean = replace(base, env={**base.env, **env})
    with Supervisor(clean) as supervisor:
        first, second = supervisor.run([sin, mlp])
    assert first.status is Status.PASS and second.status is Status.PASS, (first.message, second.message)
    (retry,) = second.evidence["infra_retries"]
    assert retry["kind"] == "worker state" and "could not create a primitive" in retry["reason"], retry
    assert supervisor.starts.get("reference raised") == 1, supervisor.starts

    broken = replace(clean, env={**clean.env, "POISONED": "1"})
    with Supervisor(broken) as supervisor:
        (alone,) = supervisor.run([mlp])  # a worker's first request: its skip stands at once
        first, second = supervisor.run([sin, mlp])
    assert alone.status is Status.SKIP and "infra_retries" not in alone.evidence, alone.evidence.keys()
    assert second.status is Status.SKIP and "could not create a primitive" in second.message, second.message
    assert len(second.evidence["infra_retries"]) == 1, "one fresh worker, then the skip stands"


def test_a_cases_warnings_are_counted_into_its_evidence_not_printed(tmp_path, capfd):
    """OpInfo's linear_cross_entropy samples warn "``options`` ignored" on every call: a sweep printed hundreds
    of such lines over its progress. They are the case's evidence, counted, and the worker prints none."""
    lce = case("nn.functional.linear_cross_entropy.chunked_none", max_samples=4)
    with Supervisor(settings(tmp_path)) as supervisor:
        (outcome,) = supervisor.run([lce])
    assert outcome.status is Status.PASS, outcome.message
    (counted,) = outcome.evidence["warnings"]
    assert counted.startswith("UserWarning: linear_cross_entropy: ``options`` ignored"), counted
    assert "options`` ignored" not in capfd.readouterr().err


SUPERVISOR_MAIN = '''import torch  # at the top of the main module: multiprocessing's spawn imports it again in each child
import sys
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases
from runner.supervisor import Supervisor

if __name__ == "__main__":
    (tanh,) = [c for c in op_cases(OpSelection(patterns=("tanh",), dtypes=("float32",), directions=("forward",),
                                               max_samples=1)) if c.config["source"] == "opinfo"]
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": "raise@aten::tanh"}
    # Forked from a zygote; spawned (a backend module named). A named module turns the device's autoload off in the
    # worker's environment: the device is there only because this module's torch import registered it first.
    for modules in ((), ("math",)):
        settings = RunSettings(target="neuron", timeout_s=300.0, warmup=("op",), env=env, backend_modules=modules)
        with Supervisor(settings) as supervisor:
            (outcome,) = supervisor.run([tanh])
        print(outcome.status.value, outcome.message[:200])
'''


def test_workers_take_the_runs_profile_and_faults_when_the_main_module_imported_torch(tmp_path):
    """A program whose main module imports torch at the top, then runs cases with faults in the run's environment:
    spawn imports that module again in the zygote and in spawned workers, so the device registers there with the
    program's environment before the worker applies the run's. The run's fault must still be active."""
    import os

    main = tmp_path / "harness_main.py"
    main.write_text(SUPERVISOR_MAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for name in ("NEURON_VALIDATE_FAULTS", "NEURON_VALIDATE_EMULATOR_PROFILE"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, str(main)], capture_output=True, text=True, timeout=600, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error ") and "injected fault in aten::tanh" in line
                                   for line in lines), result.stdout


def test_a_golden_that_needs_more_than_the_cap_leaves_the_verdict_to_the_reference_not_to_the_memory_cap(tmp_path):
    """The CPU's float64 golden overruns the cap (its atanh asks for more memory, in float64 only); the float32
    sides fit. A target 1% off is then judged against the reference alone, as the judge does whenever no golden
    can be had: a mismatch, with the golden's refusal in the evidence. It is not the case's memory crash, which
    the sides apart could never cure and which would be charged to the backend."""
    mlp, tight, _ = tight_cap_mlp(tmp_path, TIGHT_CAP_SIDE="reference", TIGHT_CAP_OP="atanh",
                                  TIGHT_CAP_DTYPE="float64")
    capped = overrunning_below(tight, 1 << 62)
    faulty = replace(capped, env={**capped.env, "NEURON_VALIDATE_FAULTS": "perturb@aten::atanh,rel=0.01"})
    with Supervisor(faulty) as supervisor:
        (outcome,) = supervisor.run([mlp])
    assert outcome.status is Status.MISMATCH, (outcome.status, outcome.message)
    assert "allocate memory" in outcome.evidence["golden_error"], outcome.evidence.get("golden_error")
    assert outcome.message.startswith("judged against the CPU reference alone"), outcome.message
    assert not outcome.evidence.get("infra_retries") and not outcome.evidence.get("memory_cap"), outcome.evidence
