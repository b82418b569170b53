"""Precision-aware verdicts: a device's documented precision is not a bug, and a fault still is.

The noise floor comes from the CPU reference run again with the ops the
precision model names perturbed at its unit roundoff; the target passes within
a multiple of that spread, is ``inconclusive`` where the reference itself keeps
no significant bit, and is a ``mismatch`` beyond.
"""

from __future__ import annotations

import json

import pytest
import torch

from conformance.outcome import Status
from diff.compare import compare
from diff.judge import Judge
from diff.precision import (EXACT, OpPrecision, PerturbMode, PrecisionModel, PrecisionModelError, load_model,
                            model_from_profile, RUNS, perturbed_runs)
from diff.tolerances import Tolerance
from emulator.profiles import resolve_profile
from tests.conftest import run_cli

FP32 = Tolerance(rtol=1.3e-6, atol=1e-5)


def test_models_follow_the_profile():
    assert not model_from_profile(resolve_profile("exact"))
    default = model_from_profile(resolve_profile("neuron-2.27"))
    assert default.for_op("aten::tanh").reason == "activation tables"
    assert default.for_op("aten::mm") is None, "float matmuls are exact under --auto-cast none"
    assert default.for_op("aten::mm", floating=False).reason == "integer matmul in fp32"
    bf16 = model_from_profile(resolve_profile("matmult-bf16"))
    assert bf16.for_op("aten::mm").where == "inputs" and bf16.for_op("aten::tanh") is None


def test_a_json_file_replaces_the_model_and_bad_files_say_why(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"name": "mine", "ops": [{"pattern": "aten::exp", "rel": 0.001, "reason": "tables"}]}))
    model = load_model(path)
    assert model.name == "mine" and model.for_op("aten::exp").rel == 0.001
    assert model.to_dict()["ops"][0]["pattern"] == "aten::exp"
    path.write_text("{not json")
    with pytest.raises(PrecisionModelError, match="not valid JSON"):
        load_model(path)
    path.write_text(json.dumps({"ops": [{"pattern": "aten::exp", "rel": 2.0}]}))
    with pytest.raises(PrecisionModelError, match="rel"):
        load_model(path)


def _tanh_chain(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(torch.tanh(x) * 3) * 2


TABLES = PrecisionModel(name="tables", ops=(OpPrecision(pattern="aten::tanh", rel=2.0**-14, abs=2.0**-14,
                                                         reason="activation tables"),))


def test_a_difference_the_precision_explains_passes_and_a_fault_does_not():
    x = torch.linspace(-3, 3, 401)
    expected = _tanh_chain(x)
    device_like = expected + 2.0**-15 * torch.sin(x * 37)  # table-sized errors
    judge = Judge(tolerance=FP32, precision=TABLES)
    verdict = judge(device_like, expected, noise=lambda: perturbed_runs(lambda: _tanh_chain(x), TABLES))
    assert verdict and verdict.within_precision, verdict.message
    assert "within device precision (activation tables)" in verdict.message and "expected bits agree" in verdict.message

    faulty = expected * 1.01  # a 1% fault
    verdict = judge(faulty, expected, noise=lambda: perturbed_runs(lambda: _tanh_chain(x), TABLES))
    assert verdict.status is Status.MISMATCH and "beyond device precision" in verdict.message

    few = expected.clone()
    few[200] += 0.05  # a fault in one element out of 401
    verdict = judge(few, expected, noise=lambda: perturbed_runs(lambda: _tanh_chain(x), TABLES))
    assert verdict.status is Status.MISMATCH


@torch.library.custom_op("nv_test::tanh_chain_any_device", mutates_args=())
def _tanh_chain_any_device(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(torch.tanh(x) * 3)


@torch.library.custom_op("nv_test::tanh_chain_cpu_kernel", mutates_args=(), device_types="cpu")
def _tanh_chain_cpu_kernel(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(torch.tanh(x) * 3)


def test_the_noise_floor_reaches_inside_a_python_custom_op_that_every_device_runs_op_by_op():
    """``torch_nn::_linear_cross_entropy_batch_chunked`` is one dispatch but runs its log_softmax and mm on the
    device: the perturbed runs must perturb its inner ops, or the device's designed error there is a false
    mismatch. An op with a kernel of its own per device is left whole: its inner ops are not the device's."""
    x = torch.linspace(-3, 3, 401)
    inner = perturbed_runs(lambda: _tanh_chain_any_device(x), TABLES)
    assert all(not torch.equal(run, _tanh_chain_any_device(x)) for run in inner)
    assert inner.reasons == ("activation tables",), "the runs name the tables they met inside"
    whole = perturbed_runs(lambda: _tanh_chain_cpu_kernel(x), TABLES)
    assert all(torch.equal(run, _tanh_chain_cpu_kernel(x)) for run in whole) and whole.reasons == ()

    judge = Judge(tolerance=FP32, precision=TABLES)
    expected = _tanh_chain_any_device(x)
    device_like = expected + 2.0**-15 * torch.sin(x * 37)
    verdict = judge(device_like, expected, noise=lambda: perturbed_runs(lambda: _tanh_chain_any_device(x), TABLES))
    assert verdict and verdict.within_precision, verdict.message
    verdict = judge(expected * 1.01, expected,
                    noise=lambda: perturbed_runs(lambda: _tanh_chain_any_device(x), TABLES))
    assert verdict.status is Status.MISMATCH, "a fault inside the custom op is still beyond the floor"


def test_an_ill_conditioned_computation_is_inconclusive_with_its_condition_estimate():
    model = PrecisionModel(name="bf16 adds", ops=(OpPrecision(pattern="aten::add*", rel=2.0**-8, reason="bf16"),))
    x = torch.full((64,), 1.0e4, dtype=torch.float64)

    def cancel():  # (x + 1) - x: catastrophic cancellation; at bf16 nothing of the 1 survives
        return torch.add(x, 1.0) - x

    expected = cancel()
    verdict = Judge(tolerance=FP32, precision=model)(expected * 0.5, expected,
                                                     noise=lambda: perturbed_runs(cancel, model))
    assert verdict.status is Status.INCONCLUSIVE and not verdict, "never a pass"
    assert "condition estimate" in verdict.message and "significant bits" in verdict.message


def test_without_a_precision_model_nothing_changes():
    expected = torch.ones(10)
    judge = Judge(tolerance=FP32, precision=EXACT)
    called = []
    verdict = judge(expected * 1.001, expected, noise=lambda: called.append(1) or [])
    assert verdict.status is Status.MISMATCH and not called and verdict.noise is None


@pytest.mark.parametrize("spec", ["neuron-2.27", "exact:auto_cast=all", "exact:stochastic_rounding=true"])
def test_perturbed_runs_keep_each_op_within_its_range(spec):
    """A device's rounding and tables never take a saturated sigmoid past 1.0 (nor a softmax, a tanh, an exp
    below their bounds). Perturbed past it, pytorch/examples' siamese_network (a sigmoid into BCELoss) broke
    the band's reference runs: "all elements of input should be between 0 and 1", and the loss curves were
    judged against the narrowest band."""
    logits = torch.linspace(-40, 40, 257)
    target = (logits > 0).float()

    def run():
        probs = torch.sigmoid(logits)
        rows = torch.softmax(torch.stack([logits, -logits]), 0)
        return (torch.nn.functional.binary_cross_entropy(probs, target), probs, rows, torch.tanh(logits),
                torch.relu(logits), torch.exp(-logits.abs()))

    model = model_from_profile(resolve_profile(spec))
    runs = perturbed_runs(run, model)
    assert len(runs) == RUNS, "every perturbed run completes"
    for loss, probs, rows, tanh, relu, exp in runs:
        assert 0 <= probs.min() and probs.max() <= 1 and 0 <= rows.min() and rows.max() <= 1
        assert tanh.abs().max() <= 1 and relu.min() >= 0 and exp.min() >= 0
    assert any(not torch.equal(r[1], torch.sigmoid(logits)) for r in runs), "still perturbed inside the range"


def _within_half_rounding(loss, neuron) -> PrecisionModel:
    """Asserts that ``loss(device)`` differs between the CPU and the device by autocast's policies alone, within
    the spread of perturbed CPU runs, and that spread is the half type's rounding; returns the model used."""
    from diff.precision import SPREAD_MULTIPLE

    reference, target = loss("cpu"), loss(neuron.type)
    assert target != reference, "the two autocast policies differ"
    model = model_from_profile(resolve_profile("exact"))
    spread = max(abs(r - reference) for r in perturbed_runs(lambda: loss("cpu"), model))
    assert abs(target - reference) <= SPREAD_MULTIPLE * spread
    assert spread < 0.02 * abs(reference), "the half type's rounding, not more"
    return model


def test_half_precision_results_spread_as_two_correct_devices_round_them(neuron):
    """Under bfloat16 autocast the CPU computes log_softmax in bfloat16 and an accelerator (CUDA's list, which
    PrivateUse1 shares) in float32: a correct device's loss differs from the reference's by the half type's
    rounding. timm's train.py under ``--amp --amp-dtype bfloat16`` was NOT READY on a correct device (loss
    0.14% off, against a band of 0.12% from runs rounding in float32 alone). The perturbed runs now round such
    ops' half-precision results, and leave full-precision ones as they were."""
    torch.manual_seed(0)
    weight, x = torch.randn(64, 10) * 0.5, torch.randn(256, 64)
    targets = torch.softmax(torch.randn(256, 10), -1)

    def loss(device, dtype=torch.bfloat16):
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logits = x.to(device) @ weight.to(device)
            return float((-targets.to(device) * torch.log_softmax(logits, -1)).sum(-1).mean())

    model = _within_half_rounding(loss, neuron)
    assert all(r == loss("cpu", torch.float32) for r in perturbed_runs(lambda: loss("cpu", torch.float32), model))


def test_an_op_the_cpus_autocast_keeps_in_float32_spreads_as_the_device_rounds_it(neuron):
    """The other way round: ``F.cross_entropy`` is on the CPU autocast's float32 list whole, while on an
    accelerator it decomposes below autocast and its log_softmax runs in bfloat16. A correct device's loss
    differed by bfloat16 rounding (0.29%) against a band of 0.14% from runs that saw float32 tensors only:
    NOT READY for an attention classifier trained under bfloat16 autocast. The dispatch mode sees autocast
    off, so the function mode above it tells it when the torch call ran under the CPU's autocast."""
    torch.manual_seed(0)
    logits, labels = (torch.randn(256, 10) * 3).bfloat16(), torch.randint(0, 10, (256,))  # a head's output

    def loss(device, autocast=True):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            inputs = logits.to(device) if autocast else logits.float().to(device)
            return float(torch.nn.functional.cross_entropy(inputs, labels.to(device)))

    model = _within_half_rounding(loss, neuron)
    plain = loss("cpu", autocast=False)  # float32 throughout: nothing to round
    assert all(r == plain for r in perturbed_runs(lambda: loss("cpu", autocast=False), model))


def test_random_ops_with_tiny_outputs_are_not_failed_for_a_different_draw():
    assert compare(torch.tensor(3), torch.tensor(2), rule="distribution")
    assert compare(torch.tensor([1, 4]), torch.tensor([2, 2]), rule="distribution")
    assert not compare(torch.arange(8.0), torch.full((8,), 2.0), rule="distribution"), "constant over 8 draws"


def test_channel_dropout_is_judged_per_channel():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4, 4)
    a = torch.nn.functional.dropout3d(x, 0.5, training=True)
    torch.manual_seed(7)
    b = torch.nn.functional.dropout3d(x, 0.5, training=True)
    assert compare(a, b, rule="distribution_channels")


def _run_mm(tmp_path, faults: str = ""):
    jsonl = tmp_path / "out.jsonl"
    result = run_cli("neuron-conformance", "ops", "--ops", "mm", "--dtypes", "float32", "--strategies", "none",
                     "--hypothesis-examples", "0", "--emulator-profile", "matmult-bf16", "--results",
                     str(tmp_path / "r"), "--jsonl", str(jsonl), "-j", "1",
                     env={"NEURON_VALIDATE_FAULTS": faults} if faults else None)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    return {json.loads(line)["case"]["mode"]: json.loads(line)["outcome"] for line in jsonl.read_text().splitlines()}


def test_matmul_under_bf16_operands_is_within_precision_and_a_10x_fault_is_not(tmp_path):
    clean = _run_mm(tmp_path / "clean")
    for mode, outcome in clean.items():
        assert outcome["status"] == "pass", (mode, outcome["message"])
        assert "within device precision (bf16 matmul operands)" in outcome["message"], outcome["message"]
        assert outcome["evidence"]["precision_model"]["name"] == "neuron profile matmult-bf16"
    faulty = _run_mm(tmp_path / "faulty", "perturb@aten::mm,rel=0.16")  # 10x bf16's rtol of 1.6e-2
    assert faulty["forward"]["status"] == "mismatch", faulty["forward"]["message"]
    assert "beyond device precision" in faulty["forward"]["message"]


def test_headlines_separate_within_precision_from_pass_mismatch_and_inconclusive():
    from types import SimpleNamespace as Row

    from report.coverage import verdicts_by_family

    rows = [Row(kind="op", category="", status=Status.PASS, message="3 / 3 samples match"),
            Row(kind="op", category="", status=Status.PASS, message="3 / 3 samples match; 1 of them within device "
                                                                  "precision (bf16 matmul operands): 9 of 8 ..."),
            Row(kind="model", category="timm", status=Status.INCONCLUSIVE, message="inconclusive: ..."),
            Row(kind="model", category="timm", status=Status.MISMATCH, message="beyond device precision"),
            Row(kind="model", category="timm", status=Status.SKIP, message="")]
    table = verdicts_by_family(rows)
    assert table["ops"]["pass"] == 1 and table["ops"]["within precision"] == 1
    assert table["timm"]["inconclusive"] == 1 and table["timm"]["mismatch"] == 1 and table["timm"]["pass"] == 0


BF16_ADDS = PrecisionModel(name="bf16 adds", ops=(OpPrecision(pattern="aten::add", rel=2.0**-8, reason="bf16 adds"),))


def _judge_ill_conditioned_net(device) -> "Judgement":  # noqa: F821 - diff.judge.Judgement
    """A convolution, then (y + 1e4) - 1e4: at bf16 adds nothing of y survives, so the whole cannot be judged."""
    from diff.replay import replay_ops

    torch.manual_seed(0)
    conv, x = torch.nn.Conv1d(1, 4, 3, padding=1), torch.randn(2, 1, 16)

    def run(where=torch.device("cpu")):
        with torch.no_grad():
            y = torch.nn.functional.conv1d(x.to(where), conv.weight.to(where), conv.bias.to(where), padding=1)
            return (torch.add(y, 1e4) - 1e4) * 3

    judge = Judge(tolerance=FP32, device=device.type, precision=BF16_ADDS)
    return judge(run(device), run(), golden=lambda: run().double(),
                 noise=lambda: perturbed_runs(run, BF16_ADDS),
                 by_op=lambda: replay_ops(run, device=device, precision=BF16_ADDS,
                                          judge_for=lambda op: Judge(tolerance=FP32, device=device.type,
                                                                     precision=BF16_ADDS)))


def test_an_ill_conditioned_model_is_inconclusive_and_a_fault_in_it_is_found_op_by_op(neuron):
    import emulator

    emulator.set_faults("perturb@aten::add,rel=0.001")  # the device's adds, within the model's bf16
    verdict = _judge_ill_conditioned_net(neuron)
    assert verdict.status is Status.INCONCLUSIVE and not verdict, verdict.message
    assert "condition estimate" in verdict.message and "ops judged agrees" in verdict.message
    assert verdict.noise.condition > 1e3

    emulator.set_faults("perturb@aten::convolution,rel=0.05")  # a 5% fault the whole cannot show
    verdict = _judge_ill_conditioned_net(neuron)
    assert verdict.status is Status.MISMATCH, verdict.message
    assert "aten.convolution.default" in verdict.replay.first and "ill-conditioned as a whole" in verdict.message


def test_noise_that_moves_a_few_elements_far_lets_the_target_move_as_many_as_far():
    """A gradient behind a ReLU: a rounding near zero flips the mask of a few elements, other elements in
    every run, so each run fails the element rule against the others. The target may move as many elements
    (twice the most of any run) no farther than the runs reach (Faster R-CNN's fc7 weight gradient on a correct
    device was "beyond device precision" with a smaller deviation than the runs'). A dense 1% error, more
    flipped elements, or flips ten times as far, are still beyond."""
    from diff.precision import noise_floor

    model = model_from_profile(resolve_profile("neuron-2.27"))
    gen = torch.Generator().manual_seed(0)
    expected = torch.randn(4096, generator=gen, dtype=torch.float64)

    def flipped(size: float, count: int = 6) -> torch.Tensor:
        out = expected + 1e-7 * torch.randn(4096, generator=gen, dtype=torch.float64)
        out[torch.randperm(4096, generator=gen)[:count]] += size
        return out

    runs = [{"g": flipped(0.05)} for _ in range(2)]
    assert noise_floor({"g": flipped(0.05)}, {"g": expected}, runs, model).within
    assert not noise_floor({"g": expected * 1.01}, {"g": expected}, runs, model).within
    assert not noise_floor({"g": flipped(0.05, count=40)}, {"g": expected}, runs, model).within
    assert not noise_floor({"g": flipped(0.5)}, {"g": expected}, runs, model).within


def test_perturbed_runs_reach_inside_an_lstm_on_the_cpu():
    """The CPU runs an LSTM layer as one oneDNN kernel (aten::mkldnn_rnn_layer): the model's activation error
    never reached its sigmoids, and a correct device's LSTM (fused cells with table activations) was beyond
    the noise floor. The perturbed runs take PyTorch's op-by-op path, also once OpInfo's test utilities have
    called ``torch.backends.disable_global_flags()`` (then setting ``torch.backends.mkldnn.enabled`` raises:
    every perturbed run failed), and leave oneDNN on afterwards."""
    import torch.testing._internal.common_utils  # noqa: F401 - disables the global backend flags
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func._schema.name)
            return func(*args, **(kwargs or {}))

    lstm, x = torch.nn.LSTM(5, 12, batch_first=True), torch.randn(8, 7, 5)
    model = PrecisionModel(name="tables", ops=(OpPrecision(pattern="aten::sigmoid", rel=1e-3, noise="smooth"),))
    with Ops(), PerturbMode(model=model, seed=0) as mode:
        perturbed, _ = lstm(x)
    assert "aten::mkldnn_rnn_layer" not in seen and "aten::sigmoid_" in seen and mode.met
    with Ops():
        plain, _ = lstm(x)
    assert torch._C._get_mkldnn_enabled() and "aten::mkldnn_rnn_layer" in seen
    assert 0 < float((perturbed - plain).abs().max()) < 1e-2


def test_perturbed_runs_keep_what_is_written_through_views():
    """Under a model that perturbs every op (float32 rounding for a target that computes like the CPU, a
    profile that casts everything), a view is the same storage, not a perturbed copy: ``x[1:3] = 1``, a
    ``view(...).add_`` and DDP's gradients written into their bucket through views all reach the base. A copy
    lost those writes, and a DDP script's perturbed runs all-reduced an uninitialised bucket: NaN losses, or a
    band 12% wide that let a 5% matmul fault pass (tests/distributed: the CUDA DDP tutorial)."""
    from diff.curves import curve_precision

    every_op = curve_precision(EXACT)
    assert every_op.for_op("aten::view") is not None  # the model itself names views: the mode must leave them
    with PerturbMode(model=every_op, seed=3) as mode:
        x = torch.zeros(4)
        x[1:3] = 1.0
        grid = torch.zeros(2, 2)
        grid.view(4).add_(2.0)
        bucket = torch.empty(6)  # DDP's flat bucket, its gradients views of it
        first, second = bucket.split(3)
        first.copy_(torch.full((3,), 0.5))
        second.fill_(-0.25)
        computed = torch.tanh(torch.linspace(-1, 1, 101))
    assert mode.met, "the model perturbed nothing: the test tests nothing"
    assert torch.equal(x != 0, torch.tensor([False, True, True, False]))
    torch.testing.assert_close(grid, torch.full((2, 2), 2.0))
    torch.testing.assert_close(bucket, torch.tensor([0.5, 0.5, 0.5, -0.25, -0.25, -0.25]))
    exact = torch.tanh(torch.linspace(-1, 1, 101))
    assert not torch.equal(computed, exact), "computing ops still take the model's error"
    torch.testing.assert_close(computed, exact)
