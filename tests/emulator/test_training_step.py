"""A full training step (forward, backward, optimizer step) of real models.

Under ``exact`` the emulated device must be bit-identical to CPU eager; under
``matmult-bf16`` the difference must be of bfloat16 scale: present, and
bounded. The bands below were measured (resnet18 at 64x64, batch 2: loss
2.5e-5, gradients 0.12 relative L2 norm, parameters 1.7e-3; tiny Llama:
9e-6, 3.2e-3, 4e-5) and carry roughly 3x headroom. bfloat16 keeps 8
significant bits (epsilon 3.9e-3); batch norm over two images amplifies the
rounding of convolution operands in the gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch

import emulator


def _step(model, batch, loss_fn, device):
    m = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    loss = loss_fn(m, {k: v.to(device) for k, v in batch.items()})
    loss.backward()
    grads = [p.grad.detach().cpu().clone() for p in m.parameters()]
    opt.step()
    return loss.detach().cpu(), grads, [p.detach().cpu().clone() for p in m.parameters()]


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    fa = torch.cat([x.flatten().double() for x in a])
    fb = torch.cat([x.flatten().double() for x in b])
    return float((fa - fb).norm() / fb.norm())


def _resnet():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    batch = {"x": torch.randn(2, 3, 64, 64), "y": torch.tensor([1, 7])}
    return model, batch, lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["y"])


def _causal_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=99, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    batch = {"ids": torch.randint(0, 99, (2, 16))}
    return model, batch, lambda m, b: m(input_ids=b["ids"], labels=b["ids"]).loss


MODELS = {"timm/resnet18": _resnet, "hf/llama-causal-lm": _causal_lm}
# (loss relative error, gradient relative L2, parameter relative L2) upper bounds under matmult-bf16
BF16_BANDS = {"timm/resnet18": (1e-4, 0.4, 6e-3), "hf/llama-causal-lm": (5e-5, 1e-2, 2e-4)}


@pytest.mark.parametrize("name", MODELS)
def test_exact_training_step_is_bit_identical(profile, name):
    model, batch, loss_fn = MODELS[name]()
    profile("exact")
    cpu_loss, cpu_grads, cpu_params = _step(model, batch, loss_fn, "cpu")
    dev_loss, dev_grads, dev_params = _step(model, batch, loss_fn, "neuron")
    assert torch.equal(cpu_loss, dev_loss)
    assert all(torch.equal(a, b) for a, b in zip(cpu_grads, dev_grads))
    assert all(torch.equal(a, b) for a, b in zip(cpu_params, dev_params))


@pytest.mark.parametrize("name", MODELS)
def test_matmult_bf16_training_step_differs_by_bf16_scale(profile, name):
    model, batch, loss_fn = MODELS[name]()
    profile("matmult-bf16")
    cpu_loss, cpu_grads, cpu_params = _step(model, batch, loss_fn, "cpu")
    dev_loss, dev_grads, dev_params = _step(model, batch, loss_fn, "neuron")
    loss_err = abs(float(dev_loss - cpu_loss) / float(cpu_loss))
    grad_err = _relative(dev_grads, cpu_grads)
    param_err = _relative(dev_params, cpu_params)
    print(f"{name} matmult-bf16: loss {loss_err:.2e}, grads {grad_err:.2e}, params {param_err:.2e}")
    loss_max, grad_max, param_max = BF16_BANDS[name]
    assert 0 < loss_err < loss_max
    assert 2**-16 < grad_err < grad_max, "gradients differ, by bfloat16-scale error"
    assert 0 < param_err < param_max
    emulator.set_profile("exact")
