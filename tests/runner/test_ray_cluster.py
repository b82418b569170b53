"""A Ray cluster that loses nodes mid-run: every case recorded once, with its own verdict.

A simulated cluster on 127.0.0.1 (a head with no CPUs, two worker nodes with
one CPU each, so one actor per node) runs an exact-profile op suite, and a
worker node is removed while a case is in flight on it, twice. The case in
flight is not a ``crash``: it runs again on the other node and is recorded
once, with its real verdict and the retry (node, reason) in the store. An
actor killed (SIGKILL, as an OOM killer does) on a node that stays is given
one more try elsewhere. A real ``crash@aten::sort`` in the same run is still
a crash.

"In flight" is made certain, not timed: the test stops (SIGSTOP) an idle
actor, hands the run a case for it, and removes its node once the supervisor
has sent it one. Nothing here asserts a duration.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import deque

import pytest

from conformance.outcome import Status
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases
from results.store import ResultStore
from runner.supervisor import Supervisor
from runner.transports import LOOPBACK, loopback_env, ray_init
from tests.conftest import run_cli

loopback_env()  # before Ray is imported: it reads whether it may rewrite 127.0.0.1
ray = pytest.importorskip("ray")

OPS = ("tanh", "sin", "cos", "exp", "neg", "abs", "sigmoid", "sort", "floor", "ceil", "rsqrt", "log")


def cases():
    return [c for c in op_cases(OpSelection(patterns=OPS, dtypes=("float32",), directions=("forward",),
                                            max_samples=1)) if c.config["source"] == "opinfo"]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK,
                                                      "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    ray_init(c.address)
    yield c
    ray.shutdown()
    c.shutdown()


def _node(cluster, node_id: str):
    (node,) = [n for n in cluster.worker_nodes if n.node_id == node_id]
    return node


def test_nodes_lost_mid_run_cost_no_verdict(cluster, tmp_path):
    selected = cases()
    assert len(selected) == len(OPS)
    settings = RunSettings(target="neuron", timeout_s=300, warmup=("op",),
                           env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": "crash@aten::sort"})
    # Every Ray address this cluster gave out is the loopback one.
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {LOOPBACK}
    pending = deque(selected)
    queue = deque([pending.popleft(), pending.popleft()])
    outcomes = []
    stopped = None  # the WorkerView of the actor stopped so that a case is surely in flight on its node
    actions = ["remove", "kill", "remove"]
    removed, killed = [], []
    with ResultStore.open(tmp_path / "runs") as store, \
            Supervisor(settings, jobs=2, transport="ray", address=cluster.address) as supervisor:
        store.ensure_build("b", target="neuron", label="neuron", manifest={})
        by_id = {c.id: c for c in selected}
        for _, outcome in supervisor.run_jobs(queue):
            outcomes.append(outcome)
            store.record("b", by_id[outcome.case_id], outcome)
            views = supervisor.workers()
            if stopped is None and actions:
                idle = [w for w in views if w.ready and w.case is None and "node" in w.info]
                if idle:
                    stopped = idle[0]
                    os.kill(stopped.info["pid"], signal.SIGSTOP)
            elif stopped is not None:
                now = [w for w in views if w.info.get("pid") == stopped.info["pid"]]
                if now and now[0].case is not None:  # sent after the stop: it cannot finish
                    action = actions.pop(0)
                    if action == "remove":
                        cluster.remove_node(_node(cluster, stopped.info["node"]))
                    with contextlib.suppress(ProcessLookupError):  # where the node's own shutdown has not
                        os.kill(stopped.info["pid"], signal.SIGKILL)
                    (removed if action == "remove" else killed).append((stopped.info["node"], now[0].case.id))
                    if action == "remove":
                        cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
                    stopped = None
            while len(queue) < 2 and pending:  # one case for each idle worker, the stopped one included
                queue.append(pending.popleft())
        retries = store.infra_retries("b")
        stored = {r.case.name: r.outcome for r in store.results("b")}
    assert not actions, f"the run ended before the test could {actions}"
    ids = [o.case_id for o in outcomes]
    assert sorted(ids) == sorted(c.id for c in selected), "a case lost or recorded twice"
    expected = {name: Status.PASS for name in OPS} | {"sort": Status.CRASH}
    assert {name: o.status for name, o in stored.items()} == expected, {n: o.message for n, o in stored.items()}
    assert stored["sort"].message == "worker process died: SIGSEGV"
    for node, case_id in removed:  # the case in flight on each lost node ran again, and says where it was lost
        assert any(r["node"] == node and r["kind"] in ("lost", "suspect") for r in retries[case_id]), retries
    for node, case_id in killed:
        assert any(r["node"] == node and r["kind"] == "suspect" for r in retries[case_id]), retries
    assert "infra_retries" not in stored["sort"].evidence


def test_without_an_address_the_executor_starts_its_own_instance_and_never_joins_one_it_finds(cluster):
    """Ray's plain ``ray.init()`` joins the cluster last started on the machine (this one)."""
    from runner.transports import RayTransport

    ray.shutdown()
    transport = RayTransport()
    try:
        joined = transport.connect()
        assert joined.get_runtime_context().gcs_address != cluster.address
        assert {n["NodeManagerAddress"] for n in joined.nodes()} == {LOOPBACK}
    finally:
        transport.close()
    assert not ray.is_initialized()


def test_an_unreachable_address_is_one_line_and_exit_2(tmp_path):
    r = run_cli("neuron-conformance", "ops", "--ops", "tanh", "--dtypes", "float32", "--executor", "ray",
                "--address", f"{LOOPBACK}:9", "--results", str(tmp_path / "runs"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "cannot start or reach a Ray cluster at --address 127.0.0.1:9" in r.stderr, r.stderr


def test_a_cluster_without_the_device_resource_is_one_line_and_exit_2(cluster, tmp_path):
    """One device per actor: a run that asks for a device resource the cluster does not offer never runs on CPUs."""
    r = run_cli("neuron-conformance", "ops", "--ops", "tanh", "--dtypes", "float32", "--executor", "ray",
                "--address", cluster.address, "--device-resource", "neuron_cores", "--results", str(tmp_path / "runs"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "offers no 'neuron_cores'" in r.stderr, r.stderr
