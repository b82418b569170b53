"""Model cases: faults injected into the device are found in the models that use
the faulty op and not in the others; clean runs pass under ``exact``."""

from __future__ import annotations

import pytest

from model_zoo.execute import model_case
from conformance.outcome import Status
from conformance.settings import RunSettings
from runner.reporters import StoreWriter
from runner.suite import run_suite
from results.store import ResultStore
from tests.conftest import built_once

ARCHS = ("hf/bert", "hf/gpt2:causal_lm", "timm/legacy_seresnet18")
PERTURBED, SILENT_FALLBACK = "aten::gelu", "aten::native_layer_norm"


def _run(tmp_path, build, faults=""):
    from model_zoo import default_config

    cases = [model_case(default_config(arch, mode="train")) for arch in ARCHS]
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": faults}
    # Both builds share one reference cache: the faulty build's reference comes from the clean build's run.
    settings = RunSettings(target="neuron", timeout_s=600, artifacts_dir=str(tmp_path / "artifacts"), env=env,
                           reference_cache=str(tmp_path / "reference_cache.sqlite"))
    with ResultStore.open(tmp_path) as store:
        run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id=build, manifest={}, target_label="neuron", jobs=2)
        return {row.case.name: row.outcome for row in store.results(build)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return built_once(tmp_path_factory, "models", _runs)


def _runs(path):
    clean = _run(path, "clean")
    faulty = _run(path, "faulty", f"perturb@{PERTURBED},rel=0.01;host_fallback@{SILENT_FALLBACK}")
    return clean, faulty


def test_clean_models_pass_under_exact(runs):
    clean, _ = runs
    for arch, outcome in clean.items():
        assert outcome.status is Status.PASS, (arch, outcome.message)
        assert outcome.evidence["compared"] > 3, "outputs, loss and gradients are all compared"


def test_faults_are_found_exactly_where_the_ops_are_used(runs):
    clean, faulty = runs
    for arch in ARCHS:
        used = set(clean[arch].evidence["executed_ops"])
        uses_perturbed = any(op.split(".")[0] == PERTURBED for op in used)
        uses_fallback = any(op.split(".")[0] == SILENT_FALLBACK for op in used)
        outcome = faulty[arch]
        if uses_perturbed:
            assert outcome.status is Status.MISMATCH, (arch, outcome.message)
        elif uses_fallback:
            assert outcome.status is Status.CPU_FALLBACK, (arch, outcome.message)
            assert SILENT_FALLBACK in outcome.evidence["fallback_ops"]
        else:
            assert outcome.status is Status.PASS, (arch, outcome.message)
    # the selection covers all three situations
    kinds = {faulty[a].status for a in ARCHS}
    assert kinds == {Status.MISMATCH, Status.CPU_FALLBACK, Status.PASS}
    # ... the transformers judged against the reference the clean build ran and cached (keyed by config, seed,
    # torch and threads); the ResNet's gradients are over the cache's bound for one entry and run again
    assert not any(clean[a].cached_reference for a in ARCHS)
    assert [a for a in ARCHS if faulty[a].cached_reference] == ["hf/bert", "hf/gpt2:causal_lm"]


def test_one_worker_compiles_every_configuration_of_one_model_class(tmp_path):
    """Past dynamo's recompile limit (8) one model class would silently run eagerly and pass a compiler bug."""
    from model_zoo.space import enumerate_configs

    configs = [c for c in enumerate_configs(patterns="robotics/gaussian_mlp",
                                            where={"dtype": ["float32"], "execution": ["compile"]})
               if c.mode in ("train", "eval")][:10]
    assert len(configs) == 10
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact",
           "NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.01,mode=compile"}
    settings = RunSettings(target="neuron:compile", timeout_s=600, artifacts_dir=str(tmp_path / "artifacts"), env=env)
    with ResultStore.open(tmp_path) as store:
        run_suite([model_case(c) for c in configs], settings=settings, plugins=[StoreWriter(store)], build_id="b",
                  manifest={}, target_label="neuron:compile", jobs=1)
        outcomes = [row.outcome for row in store.results("b")]
    assert len(outcomes) == 10
    for outcome in outcomes:
        assert outcome.status is Status.MISMATCH, outcome.message
        assert outcome.evidence["compiled_graphs"] >= 1


def test_host_execution_the_backend_does_not_report_is_cpu_fallback(tmp_path):
    """tanh run on the host by a backend module, unknown to the device's tracking: the model case says so."""
    import os

    from tests.conftest import REPO

    config = default_config_for("robotics/gaussian_mlp")
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "HOST_OPS": "tanh",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    settings = RunSettings(target="neuron", timeout_s=600, artifacts_dir=str(tmp_path / "artifacts"), env=env,
                           backend_modules=("tests.fixtures.host_ops",))
    with ResultStore.open(tmp_path) as store:
        run_suite([model_case(config)], settings=settings, plugins=[StoreWriter(store)], build_id="b", manifest={},
                  target_label="neuron", jobs=1)
        (row,) = store.results("b")
    assert row.outcome.status is Status.CPU_FALLBACK, row.outcome.message
    assert row.outcome.evidence["host_copies"]["aten::tanh"] >= 2
    assert "aten::tanh" not in row.outcome.evidence["fallback_ops"]


def default_config_for(arch):
    from model_zoo import default_config

    return default_config(arch, mode="train")


# Batch norm over two 48x48 images: its base configuration keeps no significant bit under the default profile's
# activation tables (condition estimate ~1e8), while at batch 8 the noise floor leaves bits to judge.
ILL_CONDITIONED = "timm/ghostnetv3_050"


def _judge_base(tmp_path, build: str, bugs: str = ""):
    import os

    from tests.conftest import REPO

    config = default_config_for(ILL_CONDITIONED)
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "neuron-2.27", "ACCEL_BUGS": bugs,
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    settings = RunSettings(target="neuron", timeout_s=900, artifacts_dir=str(tmp_path / build), env=env,
                           backend_modules=("tests.fixtures.accelerator_bugs",))
    with ResultStore.open(tmp_path) as store:
        run_suite([model_case(config)], settings=settings, plugins=[StoreWriter(store)], build_id=build, manifest={},
                  target_label="neuron", jobs=1)
        (row,) = store.results(build)
    assert row.case.id == model_case(config).id, "the case keeps its id: its configuration is unchanged"
    return config, row.outcome


def test_an_ill_conditioned_configuration_is_judged_on_a_larger_input_where_a_fault_still_shows(tmp_path):
    config, clean = _judge_base(tmp_path, "clean")
    assert clean.status is Status.PASS, clean.message
    judged = clean.evidence["judged_on"]
    assert judged["batch"] == 4 * config.batch and judged["size"] == config.size
    assert clean.message.startswith(f"judged on batch {4 * config.batch}, size {config.size}")
    assert "ill-conditioned under the device's precision" in clean.message
    case_floor = clean.evidence["case_noise_floor"]
    assert case_floor["inconclusive"] and case_floor["condition"] > 1e6, "measured, by the case's own noise floor"
    assert clean.evidence["case_op_replay"]["judged"] > 0 and not clean.evidence["case_op_replay"]["first"]
    assert not clean.evidence["noise_floor"]["inconclusive"], "the larger input leaves bits to judge"

    # A batch-norm kernel wrong past 4 samples: exact on the case's own 2 images (so every op agrees there),
    # caught on the larger input.
    _, faulty = _judge_base(tmp_path, "faulty", bugs="batch_norm_first_tile")
    assert faulty.status is Status.MISMATCH, faulty.message
    assert faulty.evidence["judged_on"]["batch"] == 4 * config.batch
    assert not faulty.evidence["case_op_replay"]["first"], "the case's own input cannot show this bug"


def test_a_model_whose_reference_cannot_fit_the_cap_is_skipped_before_either_side_runs(tmp_path):
    """Parameters and their gradients over the worker's cap: the CPU reference alone must overrun it, so the case
    is a skip at once (no target run up to the cap, no reference probe, no worker restarts), and a cap it fits
    under runs the case as before."""
    from model_zoo import build, default_config
    from model_zoo.execute import execute_model_case, over_the_cap, reference_floor_mb
    from runner.worker import make_context

    config = default_config("timm/legacy_seresnet18", mode="train")
    model = build(config).model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    floor = reference_floor_mb(build(config), config)
    assert floor == pytest.approx((2 * params + buffers) / 2**20)
    assert reference_floor_mb(build(config.replace(mode="eval")), config.replace(mode="eval")) == \
        pytest.approx((params + buffers) / 2**20)
    half = config.replace(dtype="bfloat16")
    assert reference_floor_mb(build(half), half) < floor * 0.6, "bfloat16 parameters are half as wide"

    cap = int(floor) - 1
    ctx = make_context(RunSettings(target="neuron", rss_limit_mb=cap, env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}))
    outcome = execute_model_case(model_case(config), ctx)
    assert outcome.status is Status.SKIP, outcome.message
    assert f"over the memory cap of {cap:,} MiB" in outcome.message and outcome.evidence["reference_at_fault"]
    assert "target" not in ctx._resolved, "the target never ran"
    roomy = make_context(RunSettings(target="neuron", rss_limit_mb=int(floor) + 4096))
    assert over_the_cap(model_case(config), build(config), config, roomy) is None, "a cap it fits runs the case"
    # A worker with the sides apart has more than the run's cap; the case is judged against the run's, so it is
    # the same skip whichever way it came there (a build that overran in a full worker went apart).
    apart = make_context(RunSettings(target="neuron", rss_limit_mb=int(floor) + 4096, run_cap_mb=cap))
    assert over_the_cap(model_case(config), build(config), config, apart).status is Status.SKIP


def test_a_model_whose_weights_to_device_leaves_behind_is_the_models_skip_not_the_targets_error():
    """transformers' OneFormer keeps three Conv2d in a plain list: ``.to(device)`` leaves them on the CPU and any
    accelerator fails it ("expected device cpu but got neuron:0" was charged to the backend under exact). A plain
    list of modules that are registered anyway is fine."""
    import torch

    from model_zoo import default_config
    from model_zoo.built import left_behind_by_to
    from model_zoo.execute import build_case

    class Portable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
            self.both = [self.a, self.b]  # a convenience view of registered submodules

    class Stranded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Portable()
            self.heads = {"x": torch.nn.Linear(2, 2), "y": torch.nn.Conv2d(2, 2, 1)}
            self.norms = [torch.nn.ReLU()]  # no weights: nothing to leave behind

    assert left_behind_by_to(Portable()) == []
    assert left_behind_by_to(Stranded()) == ["heads (2 Conv2d, Linear)"]

    case = model_case(default_config("hf/oneformer", mode="train"))
    _, outcome = build_case(case)
    assert outcome.status is Status.SKIP and "input_projections (3 Conv2d)" in outcome.message, outcome.message
