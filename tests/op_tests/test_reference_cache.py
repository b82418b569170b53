"""A second build's run takes inputs and reference outputs from the cache and still judges the target.

Real runs through the worker pool: a clean build fills the cache, a second
clean build and a faulty build run from it. The cached inputs must be the
very inputs generation makes (values, dtype, shape, strides, storage offset),
and faults in the target must be caught exactly as without the cache.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_leaves

from conformance.outcome import Status
from runner.refcache import ReferenceCache, reference_key
from conformance.settings import RunSettings
from runner.reporters import OnOutcome, StoreWriter
from runner.suite import run_suite
from op_tests.samples import generate_samples, restore_samples, sample_parts
from op_tests.sources import OpSelection, case_op, op_cases
from results.store import ResultStore
from tests.conftest import built_once

FAULTS = "perturb@aten::mul,rel=1.3e-5;wrong_shape@aten::cumsum"  # 10x float32 rtol; a wrong output shape
# Ops whose samples fit a cache entry (unary element-wise ops have a 4 MB sample, over the entry bound).
PATTERNS = ("mul", "cumsum", "add", "as_strided", "transpose", "sum", "index_select")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return built_once(tmp_path_factory, "refcache", _runs)


def _runs(root):
    cases = op_cases(OpSelection(patterns=PATTERNS, dtypes=("float32",), max_samples=4))
    cache = str(root / "reference_cache.sqlite")
    got = {}
    with ResultStore.open(root) as store:
        for build, faults in (("cold", ""), ("warm", ""), ("faulty", FAULTS)):
            cached = {}
            settings = RunSettings(target="neuron", timeout_s=300, artifacts_dir=str(root / "artifacts"),
                                   reference_cache=cache,
                                   env={"NEURON_VALIDATE_FAULTS": faults, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"})
            run_suite(cases, settings=settings, plugins=[StoreWriter(store), OnOutcome(lambda case, outcome: cached.__setitem__(case.id, outcome.cached_reference))], build_id=build, manifest={}, target_label="neuron",
                      jobs=2)
            got[build] = ({row.case.id: row.outcome for row in store.results(build)}, cached)
    return cases, cache, got


def test_a_rerun_comes_from_the_cache_with_the_same_verdicts(runs):
    cases, _, got = runs
    cold, cold_cached = got["cold"]
    warm, warm_cached = got["warm"]
    assert not any(cold_cached.values())
    assert all(warm_cached.values())
    assert {k: o.status for k, o in warm.items()} == {k: o.status for k, o in cold.items()}
    assert all(o.status in (Status.PASS, Status.SKIP) for o in warm.values())


def test_cached_inputs_are_the_generated_inputs(runs):
    cases, cache_path, _ = runs
    cache = ReferenceCache(cache_path, reference=reference_key("cpu", torch.get_num_threads()))
    restored_cases = 0
    for case in cases:
        restored = restore_samples(cache.get(case.id))
        if restored is None:
            continue
        restored_cases += 1
        generated = generate_samples(case_op(case), case)
        assert len(restored) == len(generated)
        for r, g in zip(restored, generated):
            r_leaves, g_leaves = tree_leaves(sample_parts(r)), tree_leaves(sample_parts(g))
            assert len(r_leaves) == len(g_leaves)
            for a, b in zip(r_leaves, g_leaves):
                if isinstance(b, torch.Tensor):
                    assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) == \
                           (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad), case.title
                    assert torch.equal(a.detach(), b.detach()), case.title
                else:
                    assert a == b or (a != a and b != b), case.title
    assert restored_cases == len(cases)


def test_faults_are_caught_from_the_cached_reference(runs):
    cases, _, got = runs
    faulty, cached = got["faulty"]
    by_name = {(c.name, c.mode): c.id for c in cases}
    mul, cumsum = faulty[by_name[("mul", "forward")]], faulty[by_name[("cumsum", "forward")]]
    assert cached[by_name[("mul", "forward")]] and cached[by_name[("cumsum", "forward")]]
    assert mul.status is Status.MISMATCH and "Mismatched elements" in mul.message
    assert faulty[by_name[("mul", "backward")]].status is Status.MISMATCH  # mul's backward uses mul too
    assert cumsum.status is Status.MISMATCH and "shape" in cumsum.message
    assert faulty[by_name[("add", "forward")]].status is Status.PASS
