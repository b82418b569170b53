"""diff.localize finds the first diverging layer and op on a real, deliberately broken device.

Faults act on one ATen op wherever it runs, so the models here give exactly
one block a distinctive op (arctan, sigmoid) and break that op: the
localiser must name the block, the op and this file's line, forward and
backward, and must stay quiet under the exact profile.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn as nn

import emulator
from diff.localize import ROOT, ReferenceFailure, localize

WIDTH = 16


class Block(nn.Module):
    def __init__(self, odd: str | None = None):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH)
        self.fc2 = nn.Linear(2 * WIDTH, WIDTH)
        self.odd = odd

    def forward(self, x):
        h = self.fc1(x)
        if self.odd == "atan":
            h = torch.atan(h)  # ATAN_LINE
        elif self.odd == "sigmoid":
            h = torch.sigmoid(h)  # SIGMOID_LINE
        else:
            h = torch.relu(h)
        return x + self.fc2(h)


class Net(nn.Module):
    def __init__(self, odd: str | None = "atan", act: nn.Module | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(Block(odd if i == 2 else None) for i in range(4))
        self.act = act or nn.Identity()
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.act(x))


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line(" not in line)


def _run(model, **kwargs):
    torch.manual_seed(0)
    x = torch.randn(8, WIDTH)
    return localize(model, (x,), target_device="neuron", loss_fn=lambda out: out.pow(2).mean(),
                    source_files=[__file__], **kwargs)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Net()


def test_exact_profile_matches_everywhere(neuron, model):
    result = _run(model)
    assert result, result.summary()
    assert result.first is None and result.ops is None
    assert all(layer.ok for layer in result.layers)
    assert {layer.phase for layer in result.layers} == {"forward", "backward"}
    assert result.outputs and result.gradients and result.golden and result.reference_deterministic


def test_forward_fault_names_the_block_the_op_and_the_line(neuron, model):
    emulator.set_faults("perturb@aten::atan,rel=0.01")
    result = _run(model)
    assert not result
    # fc2 is the first module whose output differs, but it computes correctly from the
    # reference's inputs: the error enters in blocks.2's own code, at aten::atan.
    assert result.first_forward.module == "blocks.2.fc2"
    assert result.culprit == "blocks.2"
    op = result.ops.first
    assert op.op == "aten::atan" and op.module == "blocks.2"
    assert op.source.file == __file__ and op.source.line == _line("ATAN_LINE")
    assert 0.009 < op.scale_error < 0.011
    assert "blocks.2" in result.summary() and "aten::atan" in result.summary()
    # error grows from nothing before the block to the output
    forward = [x for x in result.layers if x.phase == "forward"]
    before = forward[: [x.module for x in forward].index("blocks.2.fc2")]
    assert all(x.ok for x in before) and not forward[-1].ok and forward[-1].module == ROOT


def test_backward_only_fault_is_found_in_the_backward_pass(neuron):
    torch.manual_seed(0)
    emulator.set_faults("perturb@aten::sigmoid_backward,rel=0.05,phase=backward")
    result = _run(Net(odd="sigmoid"))
    assert result.outputs, "the forward pass is untouched"
    assert not result.gradients
    assert result.first_forward is None and result.first_backward is not None
    assert result.culprit == "blocks.2"
    assert result.ops.phase == "backward" and result.ops.first.op == "aten::sigmoid_backward"
    assert result.ops.first.source.line == _line("SIGMOID_LINE"), "backward ops point at their forward line"


def test_fault_inside_a_leaf_module_names_that_module(neuron):
    torch.manual_seed(0)
    emulator.set_faults("perturb@aten::gelu,rel=0.02")
    result = _run(Net(odd=None, act=nn.GELU()))
    assert result.culprit == "act" and result.ops.first.op == "aten::gelu"
    assert result.ops.first.source.file == __file__, "a torch module's op is placed at the user's call"


def test_target_raising_names_the_module_and_op(neuron, model):
    emulator.set_faults("raise@aten::atan")
    result = _run(model)
    failure = result.target_failure
    assert failure is not None and not result
    assert failure.module == "blocks.2" and failure.op == "aten::atan"
    assert failure.source.line == _line("ATAN_LINE")
    assert "injected fault" in failure.message


def test_reference_failure_is_the_scripts_problem(neuron):
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(5, 2))
    with pytest.raises(ReferenceFailure, match=r"raised on the reference in 1 .*mat1 and mat2") as info:
        localize(model, (torch.randn(2, 4),), target_device="neuron")
    assert info.value.module == "1"


def test_trace_sees_cpu_tensors_created_in_forward(neuron):
    class Leaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            mask = torch.ones(4)  # CPU_LINE
            return self.lin(x) * mask

    result = localize(Leaky(), (torch.randn(2, 4),), target_device="neuron", source_files=[__file__])
    created = [e for e in result.trace if e.factory and e.output_devices == ("cpu",)]
    assert [e.op for e in created] == ["aten::ones"] and created[0].source.line == _line("CPU_LINE")
    mixed = [e for e in result.trace if e.cpu_inputs and "neuron" in e.input_devices]
    assert [e.op for e in mixed] == ["aten::mul"] and mixed[0].module == "(model)"


class _Noisy(nn.Module):
    """Draws on the device in forward (a VAE's reparameterisation, dropout), then computes on the draw."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        z = self.lin(x) + torch.randn_like(x)
        return self.out(torch.sigmoid(nn.functional.dropout(z, 0.3, training=True)))


def test_random_draws_are_shared_so_the_comparison_stays_deterministic(neuron):
    """Every side takes the reference's draws: nothing is left unjudged and a clean device passes."""
    torch.manual_seed(0)
    result = localize(_Noisy(), (torch.randn(2, 4),), target_device="neuron")
    assert result.reference_deterministic and result
    assert result.draws == 2 and result.compared_layers == len(result.layers)
    assert not result.host_copies  # the draws taken on the CPU for the target are the harness's copies


def test_a_fault_downstream_of_a_draw_is_judged_like_any_other(neuron):
    emulator.set_faults("perturb@aten::sigmoid,rel=0.01")
    torch.manual_seed(0)
    result = localize(_Noisy(), (torch.randn(2, 4),), target_device="neuron", source_files=[__file__])
    assert not result and result.ops is not None and result.ops.first.op == "aten::sigmoid"


class _DynamicDepth(nn.Module):
    """PyTorch's dynamic_net example: a depth drawn with Python's ``random`` at every call, and NumPy's noise."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        y = self.first(x)
        for _ in range(random.randint(0, 6)):
            y = torch.tanh(self.shared(y))
        return y * float(np.random.uniform(0.5, 1.5))


def test_a_model_that_draws_from_pythons_and_numpys_generators_draws_alike_on_every_side(neuron):
    """Each side starts Python's and NumPy's generators where the caller's were, so two CPU runs agree and every
    layer is judged (before: "numerics inconclusive", nothing after the first layer judged); the caller's
    generators are left where they were, as if nothing had run; a fault in the repeated layer is still named."""
    torch.manual_seed(0)
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    result = localize(_DynamicDepth(), (torch.randn(2, 4),), target_device="neuron")
    assert (random.random(), np.random.random()) == expected
    assert result.reference_deterministic and result and result.compared_layers == len(result.layers) > 2
    emulator.set_faults("perturb@aten::tanh,rel=0.01")
    random.seed(5)
    result = localize(_DynamicDepth(), (torch.randn(2, 4),), target_device="neuron", source_files=[__file__])
    assert result.reference_deterministic and not result and result.ops.first.op == "aten::tanh"


def test_gradient_of_the_output_stands_in_for_an_unknown_loss(neuron, model):
    """An unchanged training script's loss is not known: the gradient it sent into the output is used."""
    emulator.set_faults("perturb@aten::atan,rel=0.01")
    torch.manual_seed(0)
    x = torch.randn(8, WIDTH)
    result = localize(model, (x,), target_device="neuron", grad_output=[torch.ones(8, 3)], source_files=[__file__])
    assert result.gradients is not None and any(x.phase == "backward" for x in result.layers)
    assert result.culprit == "blocks.2"


def test_to_dict_is_json_ready(neuron, model):
    import json

    emulator.set_faults("perturb@aten::atan,rel=0.01")
    data = json.loads(json.dumps(_run(model).to_dict()))
    assert data["culprit"] == "blocks.2" and data["ops"]["first"]["op"] == "aten::atan"
    assert data["layers"][0]["phase"] == "forward"


DEVICE = "neuron"  # what a script's module-level ``device`` names


class _StartsOnTheDevice(nn.Module):
    """The seq2seq tutorial's decoder: its forward makes the start state on the script's ``device`` and moves
    a table's lookup there, whatever device the copy runs on. It holds a generator made on the device (the
    copy for the CPU made it a CPU generator, whose state the device's did not fit: "layers not compared")."""

    def __init__(self):
        super().__init__()
        self.table, self.cell, self.out = nn.Embedding(10, 6), nn.GRUCell(6, 6), nn.Linear(6, 3)
        self.noise = torch.Generator(device=DEVICE).manual_seed(3)  # held, copied as it is on every side

    def forward(self, ids):
        h = torch.zeros(ids.shape[0], 6, device=DEVICE)
        for t in range(ids.shape[1]):
            h = self.cell(self.table(ids[:, t]).to(DEVICE), h)
        return self.out(h)


def test_a_model_whose_forward_names_the_device_is_compared_on_every_side(neuron):
    """Replayed on the CPU, such a model made tensors on the target's device: the reference raised, the
    layers were not compared, and a 1% matmul fault passed on the loss curves alone. Device arguments of the
    target's type name each side's device; the fault is named at its layer."""
    torch.manual_seed(0)
    ids = torch.randint(0, 10, (4, 5))
    clean = localize(_StartsOnTheDevice(), (ids,), target_device="neuron", loss_fn=lambda out: out.pow(2).mean())
    assert clean and clean.outputs and clean.gradients and clean.golden, clean.summary()
    emulator.set_faults("perturb@aten::addmm,rel=0.01")
    faulty = localize(_StartsOnTheDevice(), (ids,), target_device="neuron", loss_fn=lambda out: out.pow(2).mean())
    assert not faulty and faulty.ops.first.op == "aten::addmm", faulty.summary()


class _LstmClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.fc = nn.LSTM(5, 12, batch_first=True), nn.Linear(12, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


def test_an_lstm_is_judged_against_the_device_precision_inside_it(neuron, profile):
    """The CPU runs an LSTM layer as one oneDNN kernel, whose sigmoids and tanhs the perturbed runs could not
    reach, while the device runs fused cells whose activations use its tables: a correct device's LSTM
    classifier was "beyond device precision" at the Linear after it (NOT READY). The perturbed runs take
    PyTorch's op-by-op path. A 1% sigmoid fault in the device's cells is found at the LSTM, and no op is
    named where the two sides run other kernels (the drill named ``aten::detach`` before, then ``transpose``)."""
    from diff.precision import model_from_profile

    profile("neuron-2.27")

    def run():
        torch.manual_seed(0)  # a model and batch whose fc output the device's tables move by 3.5e-5 (relative)
        model = _LstmClassifier()
        return localize(model, (torch.randn(8, 7, 5),), target_device="neuron", loss_fn=lambda out: out.pow(2).mean(),
                        precision=model_from_profile(emulator.profile()))

    clean = run()
    assert clean, clean.summary()
    emulator.set_faults("perturb@aten::sigmoid,rel=0.01")
    faulty = run()
    assert not faulty and faulty.first_forward.module == "rnn", faulty.summary()
    assert faulty.ops.first is None and "aten::_thnn_fused_lstm_cell" in faulty.ops.note, faulty.ops.to_dict()


def test_a_random_op_that_writes_its_noise_and_returns_a_new_result_is_shared(neuron):
    """rrelu in training writes its noise in place and returns a new output: taken on the CPU for the target,
    that output stayed on the CPU ("AddmmBackward0 returned an invalid gradient ... expected device cpu but
    got neuron:0": the target raised, NOT READY) and in float32 on the golden side ("no float64 golden")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.RReLU(), nn.Linear(32, 4))
    result = localize(model, (torch.randn(32, 16) * 2,), target_device="neuron", loss_fn=lambda out: out.pow(2).mean())
    assert result and result.target_failure is None and result.golden, result.summary()
    assert result.draws == 1 and result.gradients
