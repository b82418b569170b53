"""Local workers forked from a preloaded zygote: the same outcomes as spawned ones, each run's environment kept."""

from __future__ import annotations

import os

from conformance.outcome import Status
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases
from runner.supervisor import Supervisor
from runner.zygote import forkable


def _cases():
    return [c for c in op_cases(OpSelection(patterns=("tanh", "add"), dtypes=("float32",), directions=("forward",),
                                            max_samples=2)) if c.config["source"] == "opinfo"]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))


def test_workers_fork_from_one_zygote_with_the_runs_faults_and_threads():
    settings = RunSettings(target="neuron", timeout_s=300, warmup=("op",), threads=2,
                           env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": "raise@aten::add"})
    with Supervisor(settings, jobs=2, persistent=True) as supervisor:
        outcomes = {o.case_id: o for o in supervisor.run(_cases())}
        infos = [w.info for w in supervisor.workers()]
        parents = {_parent(i["pid"]) for i in infos}
    by_name = {c.name: outcomes[c.id] for c in _cases()}
    assert by_name["tanh"].status is Status.PASS, by_name["tanh"].message
    assert by_name["add"].status is Status.ERROR and "injected fault in aten::add" in by_name["add"].message
    assert len(infos) == 2 and all(i["threads"] == 2 for i in infos), infos
    assert len(parents) == 1 and os.getpid() not in parents, "both workers are forked by one zygote"


def test_a_second_run_with_other_faults_gets_its_own_zygote():
    """The zygote imported torch with its run's environment; another environment is another zygote."""
    add = next(c for c in _cases() if c.name == "add")
    for faults, status in (("", Status.PASS), ("raise@aten::add", Status.ERROR)):
        settings = RunSettings(target="neuron", timeout_s=300, warmup=("op",), env={"NEURON_VALIDATE_FAULTS": faults})
        with Supervisor(settings, jobs=1) as supervisor:
            outcome = supervisor.run_one(add)
        assert outcome.status is status, (faults, outcome.message)


def test_only_what_survives_a_fork_is_forked():
    assert forkable(RunSettings(target="neuron", warmup=("op", "model")))
    assert forkable(RunSettings(target="cpu:compile", warmup=("op",)))
    assert not forkable(RunSettings(target="neuron", warmup=("op",), backend_modules=("my_backend",)))
    assert not forkable(RunSettings(target="cuda", warmup=("op",)))  # a device runtime may not survive a fork
    assert forkable(RunSettings(target="neuron", warmup=("script-side",)))  # what a spawned side has, imported
    assert not forkable(RunSettings(target="neuron", warmup=("script",)))  # a whole check starts its own runs
    assert not forkable(RunSettings(target="neuron"))


def test_a_zygote_left_idle_by_another_environment_is_closed():
    """A long-lived run (the pytest plugin's) whose environment changes keeps one zygote, not one per change."""
    from runner.transports import ProcessTransport

    transport = ProcessTransport()
    try:
        for faults in ("", "raise@aten::add"):
            handle = transport.start(RunSettings(target="neuron", warmup=("op",), env={"NEURON_VALIDATE_FAULTS": faults}))
            assert handle.zygote is not None
            handle.stop()
        assert len(transport._zygotes) == 1
    finally:
        transport.close()


def test_a_worker_killed_with_its_zygote_is_lost_not_a_crash():
    """A zygote killed from outside (an OOM killer) takes its workers along: the supervisor must rerun their
    cases, never charge a SIGKILL to them."""
    import signal
    import time

    from runner.transports import Death, ProcessTransport

    transport = ProcessTransport()
    try:
        handle = transport.start(RunSettings(target="neuron", warmup=("op",)))
        deadline = time.monotonic() + 120
        while not any(r[0] == "ready" for r in handle.receive() if isinstance(r, tuple)):
            assert time.monotonic() < deadline, "the forked worker never became ready"
            time.sleep(0.05)
        os.kill(handle.zygote.process.pid, signal.SIGKILL)
        deaths: list = []
        while not deaths:
            assert time.monotonic() < deadline, "the worker's death was never reported"
            deaths = [r for r in handle.receive() if isinstance(r, Death)]
            time.sleep(0.05)
        assert deaths[0].lost and "zygote" in deaths[0].lost, deaths
    finally:
        transport.close()
