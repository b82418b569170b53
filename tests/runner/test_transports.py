"""One fault set, identical outcomes on every transport: local workers, fresh processes and Ray actors.

The set: a crash (SIGSEGV), an abort (SIGABRT), a hang, a memory overrun, an
op that raises, and a case whose CPU reference crashes too (a host=1 fault
breaks the CPU's own erfinv kernel, as a broken library both sides share
would), beside a clean case. The faults live in the emulated device; the runner knows nothing of
them. Every transport must give each case the same status and message.
"""

from __future__ import annotations

import threading

import pytest

from conformance.outcome import Status
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases
from runner.reporters import StoreWriter
from runner.suite import run_suite
from runner.supervisor import Supervisor

from runner.transports import loopback_env, ray_init

loopback_env()  # before Ray is imported: it reads whether it may rewrite 127.0.0.1
ray = pytest.importorskip("ray")

FAULTS = ";".join(["crash@aten::sort", "abort@aten::cumsum", "hang@aten::topk", "hog@aten::mul,mb=6144",
                   "raise@aten::add", "crash@aten::erfinv,host=1"])


def fault_cases():
    return [c for c in op_cases(OpSelection(patterns=("tanh", "sort", "cumsum", "topk", "mul", "add", "erfinv"),
                                            dtypes=("float32",), directions=("forward",), max_samples=2))
            if c.config["source"] == "opinfo"]


EXPECTED = {
    "tanh": (Status.PASS, "2 / 2 samples match"),
    "sort": (Status.CRASH, "worker process died: SIGSEGV"),
    "cumsum": (Status.CRASH, "worker process died: SIGABRT"),
    "topk": (Status.TIMEOUT, "timed out after 20 s; the worker was stopped"),
    "mul": (Status.CRASH, "exceeded the memory cap of 2048 MiB: "),
    "add": (Status.ERROR, "sample 0: RuntimeError: neuron (emulated): injected fault in aten::add"),
    "erfinv": (Status.SKIP, "the CPU reference alone also dies (SIGSEGV) on this case"),
}


def settings(tmp_path, name: str) -> RunSettings:
    # 20 s: the hang waits that long. Each case here takes well under a second (two small samples), and
    # workers load op_db before they report ready, so the timeout never counts it: ample on a loaded machine.
    return RunSettings(target="neuron", timeout_s=20, rss_limit_mb=2048, warmup=("op",),
                       artifacts_dir=str(tmp_path / name / "artifacts"),
                       env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": FAULTS})


@pytest.fixture(scope="module")
def local_ray():
    # A local instance that also advertises NeuronCores, so actors request one each. Four logical CPUs: a
    # replacement actor must not wait for the one it replaces to hand its CPU back (slow on a loaded machine).
    ray_init(num_cpus=4, resources={"neuron_cores": 4})  # private, on 127.0.0.1
    yield
    ray.shutdown()


def test_one_fault_set_identical_outcomes_on_every_transport(local_ray, tmp_path):
    cases = fault_cases()
    names = {c.id: c.name for c in cases}
    results: dict[str, dict] = {}
    resources: dict[str, dict] = {}

    def run(name: str, **options) -> None:
        with Supervisor(settings(tmp_path, name), **options) as supervisor:
            results[name] = {names[o.case_id]: o for o in supervisor.run(cases)}
            resources[name] = getattr(supervisor.transport, "resources", {})

    threads = [threading.Thread(target=run, args=(name,), kwargs=options) for name, options in (
        ("pool", {}), ("fresh", {"fresh": True}), ("ray", {"transport": "ray"}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {"pool", "fresh", "ray"}, "a transport raised (see the captured output)"
    assert resources["ray"] == {"num_cpus": 1, "resources": {"neuron_cores": 1}}  # one NeuronCore per actor
    seen = {name: {op: (o.status, o.message) for op, o in outcomes.items()} for name, outcomes in results.items()}
    assert seen["pool"] == seen["fresh"] == seen["ray"], seen
    for op, (status, start) in EXPECTED.items():
        got_status, message = seen["pool"][op]
        assert got_status is status and message.startswith(start), (op, got_status, message)
    for name, outcomes in results.items():
        for op in ("sort", "cumsum", "topk", "mul"):  # the target's fault: a replacement worker wrote the reproducer
            assert outcomes[op].repro, (name, op, outcomes[op].evidence)
        assert outcomes["erfinv"].evidence["target_status"] == "crash"
        assert "fault_traceback" in outcomes["sort"].evidence


def test_suites_run_on_ray_into_the_same_store(local_ray, tmp_path):
    from results.store import ResultStore

    cases = [c for c in op_cases(OpSelection(patterns=("tanh", "add"), dtypes=("float32",), directions=("forward",),
                                             max_samples=2)) if c.config["source"] == "opinfo"]
    run = RunSettings(target="neuron", timeout_s=300, warmup=("op",), env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact"})
    with ResultStore.open(tmp_path / "runs") as store:
        summary = run_suite(cases, settings=run, build_id="ray-build", manifest={}, target_label="neuron (emulated)",
                            plugins=[StoreWriter(store)], jobs=2, executor="ray")
        rows = {row.case.name: row.outcome.status for row in store.results("ray-build")}
    assert summary.ran == 2 and rows == {"tanh": Status.PASS, "add": Status.PASS}
    assert ray.is_initialized(), "a transport that did not start Ray leaves it running"
