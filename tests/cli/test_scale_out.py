"""A nightly sharded over drivers: every shard selects the same configurations, runs its share, and the merged
build holds the whole selection once; shards of another build are refused before anything is copied."""

from __future__ import annotations

import json

from conformance.case import Case
from conformance.outcome import Outcome, Status
from report.coverage import headline
from results.store import ResultStore, db_path
from runner.reporters import Eta
from tests.conftest import run_cli

SELECTION = ("--filter", "robotics/gaussian_mlp", "--where", "execution=eager", "--where", "dtype=float32",
             "--sample", "6", "--seed", "3")
ENV = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": ""}


def models(results, *extra: str):
    return run_cli("neuron-conformance", "models", *SELECTION, "--results", str(results), "--build", "nightly",
                   "-j", "1", *extra, env=ENV)


def test_shards_merge_into_one_whole_build_and_another_build_is_refused(tmp_path):
    for i in (1, 2):
        r = models(tmp_path / f"shard{i}", "--shard", f"{i}/2")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    merged = tmp_path / "merged"
    r = run_cli("neuron-conformance", "merge", "--into", str(merged), str(tmp_path / "shard1"), str(tmp_path / "shard2"))
    assert r.returncode == 0, r.stderr
    with ResultStore.open(merged, create=False) as store:
        rows = store.statuses("nightly")
        whole = headline(rows, store.build("nightly").manifest)
    assert len(rows) == len({r.case_id for r in rows}) == 6
    assert {r.status for r in rows} == {Status.PASS}
    assert whole.completeness is not None and whole.completeness.missing == 0, whole.completeness
    assert whole.families[0].architectures[0].name == "robotics/gaussian_mlp"

    # One shard alone covers part of the selection, and says so.
    with ResultStore.open(tmp_path / "shard1", create=False) as store:
        part = headline(store.statuses("nightly"), store.build("nightly").manifest).completeness
    assert part.selected == 6 and 0 < part.missing < 6 and "missing" in str(part)

    # A shard of another build under the same id (another profile and selection) is refused; nothing is copied.
    other = tmp_path / "other"
    with ResultStore.open(tmp_path / "shard1", create=False) as store:
        manifest = json.loads(json.dumps(store.build("nightly").manifest))
    manifest["emulator_profile"]["name"] = "neuron-2.27"
    manifest["selection"]["digest"] = "0" * 24
    with ResultStore.open(other) as store:
        store.ensure_build("nightly", target="neuron", label="neuron", manifest=manifest)
        store.record("nightly", Case(kind="model", name="robotics/gaussian_mlp", config={"seed": 99}),
                     Outcome(case_id="x", status=Status.MISMATCH, message="other build"))
    r = run_cli("neuron-conformance", "merge", "--into", str(merged), str(other))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not the build nightly" in r.stderr and "emulator profile" in r.stderr and "nothing was merged" in r.stderr
    with ResultStore.open(merged, create=False) as store:
        assert len(store.statuses("nightly")) == 6

    # Resuming the build with another selection is refused too, before anything runs.
    r = run_cli("neuron-conformance", "models", "--filter", "robotics/gaussian_mlp", "--sample", "3", "--results",
                str(merged), "--build", "nightly", "--resume", env=ENV)
    assert r.returncode == 2 and "another selection of cases" in r.stderr, r.stderr
    assert db_path(merged).exists()


def test_eta_counts_resumed_cases_as_done_and_rates_from_the_outcomes():
    now = [100.0]
    eta = Eta(10, resumed=4, clock=lambda: now[0])
    assert eta.line("models") == "models: 4 / 10 (40.0%), 4 stored before (elapsed 0m00s)"
    for _ in range(3):  # one case every 30 s
        now[0] += 30
        eta.add()
    assert eta.rate_per_min == 2.0
    assert eta.line("models") == ("models: 7 / 10 (70.0%), 2.0 cases/min, about 1m30s left, 4 stored before "
                                  "(elapsed 1m30s)")
