"""diff.sides.side_model: a side's copy of a model is made on its device directly, and is the same model.

The copy no longer goes through a CPU copy first. What must not change: the copy's values, which parameters
are shared and which are frozen, buffers and their dtypes, modules that do more in ``Module.to`` than move
tensors, parameter subclasses, and the original model, which the reference trains afterwards.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from diff.sides import run_model, side_model, to_device


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as a language model's head and embedding
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.rnn = nn.LSTM(8, 8, batch_first=True)  # its _apply rebuilds the flat weights

    def forward(self, ids):
        h = self.embed(ids)
        h, _ = self.rnn(self.frozen(h))
        return self.head(self.norm(h.mean(1)))


class Marked(nn.Parameter):
    """A parameter subclass: left to deepcopy and Module.to, as before."""


def test_the_copy_is_made_on_the_device_with_the_models_sharing_freezing_and_buffers(neuron):
    torch.manual_seed(0)
    model = Tied()
    model.extra = Marked(torch.randn(3))
    model.embed.weight.grad = torch.ones_like(model.embed.weight)  # a copy does not bring .grad, as deepcopy did not
    model.norm.running_mean.note = ["kept"]  # a buffer's own attribute, which deepcopy copied
    copy = side_model(model, neuron)

    assert copy.head.weight is copy.embed.weight
    assert copy.frozen.weight.requires_grad is False and copy.embed.weight.requires_grad
    assert copy.embed.weight.grad is None
    assert copy.norm.running_mean.note == ["kept"] and copy.norm.running_mean.note is not model.norm.running_mean.note
    assert isinstance(copy.extra, Marked) and copy.extra.device.type == "neuron"
    for (name, a), (_, b) in zip(model.state_dict().items(), copy.state_dict().items()):
        assert b.device.type == "neuron" and b.dtype == a.dtype, name
        assert torch.equal(a, b.cpu()), name
    assert all(type(p) in (nn.Parameter, Marked) for p in copy.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())  # the original stays where it was

    ids = torch.randint(0, 10, (4, 5))
    expected = model(ids)
    actual = copy(ids.to(neuron))  # the LSTM runs on its rebuilt flat weights
    torch.testing.assert_close(actual.cpu(), expected)


def test_training_the_copy_leaves_the_original_alone_and_a_cast_copy_casts_floating_tensors_only(neuron):
    torch.manual_seed(0)
    model = Tied()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = run_model(model, device=neuron, inputs=torch.randint(0, 10, (4, 5)), loss=lambda out, _: out.square().mean(),
                    steps=2, optimizer_factory=lambda params: torch.optim.SGD(params, lr=0.5), train=True,
                    keep_params=True)
    assert any(not torch.equal(before[k], v.cpu()) for k, v in run.params.items())
    for k, v in model.state_dict().items():
        assert torch.equal(before[k], v), k

    golden = side_model(model, torch.device("cpu"), torch.float64)
    assert golden.embed.weight.dtype == torch.float64 and golden.norm.running_var.dtype == torch.float64
    assert golden.norm.num_batches_tracked.dtype == torch.int64
    assert golden.embed.weight.data_ptr() != model.embed.weight.data_ptr()
    copy_on_cpu = side_model(model, torch.device("cpu"))
    assert copy_on_cpu.embed.weight.data_ptr() != model.embed.weight.data_ptr()  # a copy, even on the same device


class ClosesOverItsLayers(nn.Module):
    """minGPT's Block keeps ``self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))`` over ``m = self.mlp``;
    a forward hook made by a closure over a layer, likewise."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.ModuleDict(dict(fc=nn.Linear(4, 8), proj=nn.Linear(8, 4)))
        m = self.mlp
        self.mlpf = lambda x: m.proj(torch.relu(m.fc(x)))
        scale = self.mlp.proj
        self.register_forward_hook(lambda module, args, out: out * scale.weight.mean())

    def forward(self, x):
        return self.mlpf(x)


def test_a_copy_calls_its_own_layers_through_the_functions_the_model_keeps(neuron):
    """deepcopy keeps functions as they are: the copy's ``mlpf`` called the original's layers, on the original's
    device (minGPT's adder, localised: "MmBackward0 returned an invalid gradient at index 1 - expected device
    cpu but got neuron:0"), or, from a snapshot, with the live model's later weights."""
    torch.manual_seed(0)
    model = ClosesOverItsLayers().to(neuron)
    x = torch.randn(3, 4)
    expected = model(x.to(neuron)).cpu()

    reference = side_model(model, torch.device("cpu"))
    out = reference(x)
    out.sum().backward()  # every layer it ran is its own, on the CPU
    torch.testing.assert_close(out, expected.detach())
    assert all(p.grad is not None and p.grad.device.type == "cpu" for p in reference.parameters())
    assert all(p.grad is None for p in model.parameters())

    with torch.no_grad():  # the original trains on: the copy is not moved by it
        for p in model.parameters():
            p.add_(1.0)
    torch.testing.assert_close(reference(x), out)


def test_an_object_holding_tensors_is_copied_with_them_and_a_module_is_not():
    """transformers' caches are no pytree: to_device copies such an object, its tensors moved, so that the
    copy neither follows the original's later changes nor keeps tensors on the original's device."""
    class Cache:
        def __init__(self):
            self.layers = [{"keys": torch.ones(2), "values": torch.zeros(2)}]
            self.seen = 3

    cache, layer = Cache(), torch.nn.Linear(2, 2)
    moved = to_device({"past": cache, "layer": layer, "n": 4}, "cpu", torch.float64)
    assert moved["past"] is not cache and moved["past"].seen == 3 and moved["layer"] is layer and moved["n"] == 4
    keys = moved["past"].layers[0]["keys"]
    assert keys.dtype == torch.float64 and keys.tolist() == [1.0, 1.0]
    cache.layers[0]["keys"].add_(1)
    assert keys.tolist() == [1.0, 1.0]


def test_a_device_named_as_another_takes_its_tensor_method_too():
    """``x.cuda()`` and ``Module.cuda()`` in code replayed on the CPU (or a CPU reference taking the name for
    the CPU): the method of the named type's name moves to the side's device, as device arguments do."""
    from diff.sides import device_named_as

    with device_named_as("cpu", "cuda"):
        x = torch.ones(2).cuda()
        layer = torch.nn.Linear(2, 2).cuda()
        y = torch.zeros(2, device="cuda").cuda(0, non_blocking=True)
    assert x.device.type == layer.weight.device.type == y.device.type == "cpu"


def test_a_packed_sequence_moves_its_data_and_keeps_its_batch_sizes_on_the_cpu(neuron):
    """PyTorch keeps a PackedSequence's batch_sizes on the CPU on every device and refuses them elsewhere:
    moved with the rest, an RNN called with packed sequences could not be compared at all ("layers not
    compared: batch_sizes should always be on CPU")."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    packed = pack_padded_sequence(torch.randn(3, 4, 2), torch.tensor([2, 4, 1]), batch_first=True,
                                  enforce_sorted=False)
    moved = to_device(packed, neuron, torch.float64)
    assert moved.data.device.type == "neuron" and moved.data.dtype == torch.float64
    assert moved.sorted_indices.device.type == moved.unsorted_indices.device.type == "neuron"
    assert moved.batch_sizes.device.type == "cpu" and moved.batch_sizes is not packed.batch_sizes
    assert moved.batch_sizes.tolist() == packed.batch_sizes.tolist()
    gru = nn.GRU(2, 3, batch_first=True)
    on_device, _ = side_model(gru, neuron, torch.float64)(moved)
    on_cpu, _ = side_model(gru, "cpu", torch.float64)(to_device(packed, "cpu", torch.float64))
    torch.testing.assert_close(on_device.data.cpu(), on_cpu.data)
