"""robotics: policies that map observations to actions, trained by behaviour cloning.

* ``visuomotor_act``: an ACT-style policy (Zhao et al. 2023): a conv encoder
  turns the camera image into tokens, a transformer encoder mixes them with
  the proprioceptive state, and a transformer decoder with learned queries
  predicts a chunk of future actions.
* ``gaussian_mlp``: a state-only tanh-Gaussian policy (the SAC actor); the
  behaviour-cloning loss is the negative log-likelihood of the demonstrated
  action.

Demonstrations are synthetic but consistent: the target actions are a fixed
smooth function of the observation, so the loss can fall. ``size`` is the
image side (visuomotor) or the state dimension (MLP).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..built import BuiltModel, finish_model, input_generator, output_loss, sgd_factory
from ..config import ModelConfig
from ..registry import ModelEntry, register_model

STATE_DIM, ACTION_DIM, CHUNK = 8, 6, 4


def demo_actions(state: torch.Tensor, steps: int) -> torch.Tensor:
    """A fixed 'expert': actions that drift smoothly from a function of the state."""
    base = torch.tanh(state[..., :ACTION_DIM] * 1.5)
    drift = torch.linspace(0, 0.3, steps).view(1, steps, 1)
    return (base.unsqueeze(1) + drift).clamp(-1, 1)


class VisuomotorACT(nn.Module):
    def __init__(self, *, hidden: int, layers: int, heads: int) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, hidden, 3, 2, 1), nn.ReLU())
        self.state = nn.Linear(STATE_DIM, hidden)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0,
                                                                        batch_first=True), layers, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(hidden, heads, 2 * hidden, dropout=0.0,
                                                                        batch_first=True), layers)
        self.queries = nn.Parameter(torch.randn(CHUNK, hidden) * 0.02)
        self.head = nn.Linear(hidden, ACTION_DIM)

    def forward(self, image: torch.Tensor, state: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = self.backbone(image).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.state(state).unsqueeze(1), feats], 1)
        memory = self.encoder(tokens)
        queries = self.queries.unsqueeze(0).expand(image.shape[0], -1, -1)
        pred = self.head(self.decoder(queries, memory))
        return {"loss": nn.functional.l1_loss(pred.float(), actions.float()), "actions": pred}


class GaussianMLP(nn.Module):
    def __init__(self, *, state_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        dims = [state_dim] + [hidden] * layers
        self.trunk = nn.Sequential(*[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        self.mean, self.log_std = nn.Linear(hidden, ACTION_DIM), nn.Linear(hidden, ACTION_DIM)

    def forward(self, state: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(state)
        mean, log_std = self.mean(h), self.log_std(h).clamp(-5, 2)
        target = torch.atanh(actions.clamp(-0.999, 0.999))
        nll = 0.5 * ((target - mean) / log_std.exp()).pow(2) + log_std + 0.5 * math.log(2 * math.pi)
        return {"loss": nll.float().sum(-1).mean(), "mean": torch.tanh(mean), "log_std": log_std}


def _visuomotor(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
    hidden, heads = config.hidden or 32, config.heads or 4
    model = finish_model(VisuomotorACT(hidden=hidden, layers=config.layers or 1, heads=heads), config)
    dtype = next(model.parameters()).dtype

    def batch(step: int) -> dict[str, Any]:
        gen = input_generator(config, step)
        state = torch.randn(config.batch, STATE_DIM, generator=gen)
        image = torch.randn(config.batch, 3, config.size, config.size, generator=gen) * 0.5
        return {"image": image.to(dtype), "state": state.to(dtype), "actions": demo_actions(state, CHUNK).to(dtype)}

    return BuiltModel(model=model, inputs=batch(0), loss_fn=output_loss, optimizer_factory=sgd_factory,
                      modality="image+state", notes="ACT-style action-chunking transformer", config=config, batch_fn=batch)


def _gaussian(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
    model = finish_model(GaussianMLP(state_dim=config.size, hidden=config.hidden or 32, layers=config.layers or 2), config)
    dtype = next(model.parameters()).dtype

    def batch(step: int) -> dict[str, Any]:
        gen = input_generator(config, step)
        state = torch.randn(config.batch, config.size, generator=gen)
        return {"state": state.to(dtype), "actions": demo_actions(state, 1)[:, 0].to(dtype)}

    return BuiltModel(model=model, inputs=batch(0), loss_fn=output_loss, optimizer_factory=sgd_factory,
                      modality="state", notes="tanh-Gaussian MLP policy, behaviour cloning NLL", config=config,
                      batch_fn=batch)


register_model("robotics/visuomotor_act", modality="image+state", tasks=("policy",), sizes=(16, 32), batches=(2, 1),
               knob_values={"layers": (2,), "hidden": (64,), "heads": (2,)})(_visuomotor)
register_model("robotics/gaussian_mlp", modality="state", tasks=("policy",), sizes=(8, 16), batches=(2, 1),
               knob_values={"layers": (1, 4), "hidden": (64,)})(_gaussian)
