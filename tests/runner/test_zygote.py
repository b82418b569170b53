"""Local workers forked from a preloaded zygote: the same outcomes as spawned ones, each run's environment kept."""

from __future__ import annotations

import os

from conformance.outcome import Status
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases
from runner.supervisor import Supervisor
from runner.zygote import ZygotePool, forkable


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


def test_runs_with_other_faults_and_profiles_fork_from_one_zygote_and_each_worker_has_its_own():
    """Faults and the numerics profile are set by each worker as it starts: runs that differ only there fork from
    one zygote, each worker has its run's, and neither stays behind in the zygote for the next run."""
    from runner.zygote import ZYGOTES

    cases = [c for c in _cases() if c.name in ("add", "tanh")]
    preloads = ZYGOTES.preloads
    for faults, profile, add_status in (("", "", Status.PASS), ("raise@aten::add", "", Status.ERROR),
                                        ("", "exact", Status.PASS), ("", "", Status.PASS)):
        settings = RunSettings(target="neuron", timeout_s=300, warmup=("op",),
                               env={"NEURON_VALIDATE_FAULTS": faults, "NEURON_VALIDATE_EMULATOR_PROFILE": profile})
        with Supervisor(settings, jobs=1) as supervisor:
            by_name = {next(c.name for c in cases if c.id == o.case_id): o for o in supervisor.run(cases)}
        assert by_name["add"].status is add_status, (faults, profile, by_name["add"].message)
        tanh = by_name["tanh"]
        assert tanh.status is Status.PASS, tanh.message
        # The default profile computes tanh from an activation table, judged by its precision model; exact does not.
        assert ("within device precision" in tanh.message) == (profile != "exact"), (profile, tanh.message)
    assert ZYGOTES.preloads - preloads <= 1, "the four runs forked from one zygote"


def test_only_what_survives_a_fork_is_forked():
    assert forkable(RunSettings(target="neuron", warmup=("op", "model")))
    assert forkable(RunSettings(target="cpu:compile", warmup=("op",)))
    assert not forkable(RunSettings(target="neuron", warmup=("op",), backend_modules=("my_backend",)))
    assert not forkable(RunSettings(target="cuda", warmup=("op",)))  # a device runtime may not survive a fork
    assert forkable(RunSettings(target="neuron", warmup=("script-side",)))  # what a spawned side has, imported
    assert not forkable(RunSettings(target="neuron", warmup=("script",)))  # a whole check starts its own runs
    assert not forkable(RunSettings(target="neuron"))


def test_a_long_lived_process_keeps_a_few_idle_zygotes_not_one_per_environment():
    """A long-lived run (the pytest plugin's) whose environment changes keeps its last ``keep_idle`` zygotes."""
    from runner.transports import ProcessTransport

    pool = ZygotePool(keep_idle=1)
    transport = ProcessTransport(zygotes=pool)
    try:
        for value in ("0", "1"):  # a variable torch reads as it is imported: another zygote
            handle = transport.start(RunSettings(target="neuron", warmup=("op",),
                                                 env={"TORCH_SHOW_CPP_STACKTRACES": value}))
            assert handle.zygote is not None
            handle.stop()
        assert pool.preloads == 2 and pool.held() == 1
    finally:
        pool.close()


def test_runs_in_one_process_share_a_zygote_and_each_worker_has_its_own_builds_compile_cache(tmp_path):
    """A migration check's supervisors, or a test session's runs, fork from one zygote where only what is read
    while cases run differs (here the compile cache, one folder per build). Each worker still gets its own
    run's value, as a spawned one would: a second build compiles again, and a run with no build folder
    inherits none from the zygote."""
    from runner.zygote import ZYGOTES

    (tanh,) = [c for c in _cases() if c.name == "tanh"]
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact:compile_seconds_per_graph=0.01"}
    compiled, preloads = [], ZYGOTES.preloads
    for artifacts in (tmp_path / "build-1", tmp_path / "build-1", tmp_path / "build-2", None):
        settings = RunSettings(target="neuron:compile", timeout_s=300, warmup=("op",), env=env,
                               artifacts_dir=str(artifacts) if artifacts else None)
        with Supervisor(settings, jobs=1) as supervisor:
            outcome = supervisor.run_one(tanh)
        assert outcome.status is Status.PASS, outcome.message
        compiled.append(outcome.evidence["compile"]["compiler"]["compiled"])
    assert compiled == [1, 0, 1, 1], "reused within a build only, and a run without a build folder keeps none"
    assert ZYGOTES.preloads - preloads <= 1, "the four runs forked from one zygote"


def test_a_worker_killed_with_its_zygote_is_lost_not_a_crash():
    """A zygote killed from outside (an OOM killer) takes its workers along: the supervisor must rerun their
    cases, never charge a SIGKILL to them."""
    import signal
    import time

    from runner.transports import Death, ProcessTransport

    pool = ZygotePool()
    transport = ProcessTransport(zygotes=pool)
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
        pool.close()


def test_an_idle_zygote_waits_without_polling():
    """Zygotes outlive their runs (the process keeps two idle ones): one with no workers must cost no processor
    time, or a test session's kept zygotes slow every test beside them."""
    import time

    import psutil

    from runner.transports import ProcessTransport

    pool = ZygotePool()
    transport = ProcessTransport(zygotes=pool)
    try:
        handle = transport.start(RunSettings(target="neuron", warmup=("op",)))
        handle.stop()
        zygote = psutil.Process(handle.zygote.process.pid)
        deadline = time.monotonic() + 60
        while not handle.zygote.idle:  # its worker reaped
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = sum(zygote.cpu_times()[:2])
        time.sleep(3.0)
        spent = sum(zygote.cpu_times()[:2]) - before
        assert spent < 0.015, f"an idle zygote spent {spent:.2f} s of processor time in 3 s (polling: about 0.03)"
    finally:
        pool.close()


def test_a_forked_worker_starts_where_the_supervisor_is_now(tmp_path, monkeypatch):
    """A zygote may be a run or a test older than the worker it forks: the worker takes the supervisor's working
    directory (and ``sys.path``) of the moment, as a spawned one would (a user script given by a relative path)."""
    import time

    from runner.transports import ProcessTransport

    transport = ProcessTransport()  # the process's zygotes
    settings = RunSettings(target="neuron", warmup=("op",))
    first = transport.start(settings)
    first.stop()
    monkeypatch.chdir(tmp_path)
    second = transport.start(settings)
    try:
        deadline = time.monotonic() + 120
        while not any(r[0] == "ready" for r in second.receive() if isinstance(r, tuple)):
            assert time.monotonic() < deadline, "the forked worker never became ready"
            time.sleep(0.05)
        assert second.zygote is first.zygote
        assert os.readlink(f"/proc/{second.pid}/cwd") == str(tmp_path)
    finally:
        second.stop()


def test_a_run_under_a_long_temporary_folder_forks_its_workers(tmp_path):
    """The worker's end of its pipe went to the zygote pickled, which multiprocessing shares through a listening
    socket in the temporary folder: under a TMPDIR of about 75 characters or more (pytest's 100th session folder
    and a test's own) every run failed with "OSError: AF_UNIX path too long". It goes over the zygote's socket."""
    from tests.conftest import run_cli

    temp = tmp_path / ("t" * 100)
    temp.mkdir()
    run = run_cli("neuron-conformance", "ops", "--ops", "tanh", "--dtypes", "float32", "--directions", "forward",
                  "--results", str(tmp_path / "runs"), env={"TMPDIR": str(temp)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cases ran in" in run.stdout, run.stdout[-2000:]
