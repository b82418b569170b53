"""Build, forward and backward a representative set of zoo models, deterministically.

One or two per family and modality: timm CNN and ViT; transformers text
(causal and masked LM), state-space (Mamba), speech (wav2vec2 CTC, Whisper),
time series, vision-language; diffusers UNet, DiT and VAE; every built-in
family. Real models, random weights, tiny sizes.
"""

from __future__ import annotations

import pytest
import torch

from model_zoo import BuiltModel, ModelBuildError, build, default_config

REPRESENTATIVE = [
    "timm/resnet18", "timm/vit_tiny_patch16_224", "timm/convnext_atto",
    "hf/gpt2:causal_lm", "hf/bert:masked_lm", "hf/llama:sequence_classification", "hf/mamba", "hf/wav2vec2:ctc",
    "hf/whisper:speech_seq_2_seq", "hf/patchtst", "hf/time_series_transformer", "hf/llava:image_text_to_text",
    "hf/vit:image_classification", "hf/mixtral:causal_lm",
    "diffusion/unet2d_condition", "diffusion/dit", "diffusion/vae_kl", "diffusion/wan",
    "world/rssm", "world/rssm_pixels", "molecule/mpnn", "molecule/egnn", "robotics/visuomotor_act",
    "robotics/gaussian_mlp", "flex/document_mask",
]


def _train_step(built: BuiltModel) -> tuple[torch.Tensor, list[torch.Tensor]]:
    built.model.zero_grad(set_to_none=True)
    outputs = built.model(**built.inputs)
    loss = built.loss_fn(outputs, built.inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in built.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("arch", REPRESENTATIVE)
def test_build_forward_backward_is_deterministic(arch):
    config = default_config(arch, attn="sdpa" if arch.startswith("flex/") else "default")
    a, b = build(config), build(config)
    assert a.model.training and a.modality and a.config == config
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(p, q), name
    loss_a, grads_a = _train_step(a)
    torch.manual_seed(1234)  # the global RNG must not matter
    loss_b, grads_b = _train_step(b)
    assert loss_a.ndim == 0 and torch.isfinite(loss_a)
    assert torch.equal(loss_a, loss_b)
    assert len(grads_a) > 0 and len(grads_a) == len(grads_b)
    assert all(torch.equal(x, y) for x, y in zip(grads_a, grads_b))


def test_make_batch_is_deterministic_per_step_and_step_zero_is_inputs():
    built = build(default_config("hf/gpt2:causal_lm"))
    again = build(default_config("hf/gpt2:causal_lm"))
    assert torch.equal(built.make_batch(0)["input_ids"], built.inputs["input_ids"])
    assert torch.equal(built.make_batch(5)["input_ids"], again.make_batch(5)["input_ids"])
    assert not torch.equal(built.make_batch(1)["input_ids"], built.make_batch(2)["input_ids"])


def test_steps_mode_trains_with_the_optimizer_and_loss_falls():
    built = build(default_config("world/rssm", mode="steps", steps=20))
    opt = built.optimizer_factory(built.model.parameters())
    losses = []
    for step in range(20):
        inputs = built.make_batch(step)
        opt.zero_grad()
        loss = built.loss_fn(built.model(**inputs), inputs)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5])


def test_dtype_and_knobs_are_applied():
    built = build(default_config("hf/llama:causal_lm", dtype="bfloat16", layers=1, hidden=64, heads=2))
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
    assert built.model.config.num_hidden_layers == 1 and built.model.config.hidden_size == 64
    assert built.model.config.num_attention_heads == 2
    timm_model = build(default_config("timm/resnet18", dtype="float16")).model
    assert {p.dtype for p in timm_model.parameters()} == {torch.float16}


def test_eval_mode_and_dropout_neutralised():
    built = build(default_config("hf/bert:sequence_classification", mode="eval"))
    assert not built.model.training
    trained = build(default_config("hf/bert:sequence_classification"))
    assert all(m.p == 0 for m in trained.model.modules() if isinstance(m, torch.nn.Dropout))


def test_flex_attention_matches_dense_implementations_and_refuses_cpu_backward():
    outs = {}
    for attn in ("flex", "sdpa", "eager"):
        built = build(default_config("flex/alibi", attn=attn, mode="eval"))
        with torch.no_grad():
            outs[attn] = built.model(**built.inputs)["logits"]
    torch.testing.assert_close(outs["flex"], outs["sdpa"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs["flex"], outs["eager"], rtol=1e-4, atol=1e-5)
    with pytest.raises(ModelBuildError, match="no backward on CPU"):
        build(default_config("flex/alibi", attn="flex", mode="train"))


def test_unsupported_axis_values_raise_model_build_error():
    with pytest.raises(ModelBuildError, match="knob"):
        build(default_config("timm/resnet18", layers=3))
    with pytest.raises(ModelBuildError, match="attn"):
        build(default_config("world/rssm", attn="sdpa"))


def test_zoo_model_runs_bit_identically_on_the_emulated_device(neuron):
    built = build(default_config("timm/resnet18", mode="eval"))
    with torch.no_grad():
        ref = built.model(**built.inputs)
        out = built.model.to(neuron)(**{k: v.to(neuron) for k, v in built.inputs.items()})
    assert torch.equal(ref, out.cpu())
