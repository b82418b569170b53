"""One way for op tests to run a list of cases on the emulated device, through the real suite and store."""

from __future__ import annotations

from conformance.settings import RunSettings
from results.store import ResultStore
from runner.reporters import StoreWriter
from runner.suite import run_suite


def run_cases(results, cases, build: str, env: dict, backend_modules=()) -> list:
    """``cases`` run with two workers into the store under ``results`` as build ``build``; (case, outcome) pairs.
    ``env`` reaches the workers (ACCEL_BUGS, the emulator's profile); ``backend_modules`` load there."""
    settings = RunSettings(target="neuron", timeout_s=300, artifacts_dir=str(results / build),
                           backend_modules=backend_modules, env=env)
    with ResultStore.open(results) as store:
        run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id=build, manifest={},
                  target_label="neuron", jobs=2)
        return [(r.case, r.outcome) for r in store.results(build)]
