"""world: a latent-dynamics world model with a recurrent state (a Dreamer-style RSSM).

An encoder embeds each observation; a GRU carries the deterministic state
``h`` through time, driven by the previous stochastic latent ``z`` and action;
a prior predicts ``z`` from ``h`` and a posterior from ``h`` and the embedding;
decoders reconstruct the observation and predict the reward from ``(h, z)``.
The loss is the usual ELBO: reconstruction + reward error + KL(posterior ||
prior). The reparameterisation noise is an input (``noise``), not a draw from
the global RNG, so a training step is deterministic. ``size`` is the
sequence length; ``rssm_pixels`` observes 16x16 images through a conv encoder.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..built import BuiltModel, finish_model, input_generator, output_loss, sgd_factory
from ..config import ModelConfig
from ..registry import ModelEntry, register_model

OBS_DIM, ACTION_DIM, LATENT, IMAGE = 12, 4, 8, 16


class RSSM(nn.Module):
    def __init__(self, *, hidden: int, layers: int, pixels: bool) -> None:
        super().__init__()
        self.pixels, self.hidden = pixels, hidden
        if pixels:
            self.encoder = nn.Sequential(nn.Conv2d(3, 16, 4, 2, 1), nn.ELU(), nn.Conv2d(16, 32, 4, 2, 1), nn.ELU(),
                                         nn.Flatten(), nn.Linear(32 * (IMAGE // 4) ** 2, hidden))
            self.decoder = nn.Sequential(nn.Linear(hidden + LATENT, 32 * (IMAGE // 4) ** 2),
                                         nn.Unflatten(-1, (32, IMAGE // 4, IMAGE // 4)),
                                         nn.ConvTranspose2d(32, 16, 4, 2, 1), nn.ELU(), nn.ConvTranspose2d(16, 3, 4, 2, 1))
        else:
            self.encoder = nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.ELU(), nn.Linear(hidden, hidden))
            self.decoder = nn.Sequential(nn.Linear(hidden + LATENT, hidden), nn.ELU(), nn.Linear(hidden, OBS_DIM))
        self.cells = nn.ModuleList(nn.GRUCell(LATENT + ACTION_DIM if i == 0 else hidden, hidden) for i in range(layers))
        self.prior = nn.Sequential(nn.Linear(hidden, hidden), nn.ELU(), nn.Linear(hidden, 2 * LATENT))
        self.posterior = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ELU(), nn.Linear(hidden, 2 * LATENT))
        self.reward = nn.Sequential(nn.Linear(hidden + LATENT, hidden), nn.ELU(), nn.Linear(hidden, 1))

    @staticmethod
    def _split(stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = stats.chunk(2, -1)
        return mean, nn.functional.softplus(raw) + 0.1

    def forward(self, observations: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                noise: torch.Tensor) -> dict[str, torch.Tensor]:
        b, t = actions.shape[:2]
        flat = observations.flatten(0, 1)
        embed = self.encoder(flat).view(b, t, -1)
        hs = [observations.new_zeros(b, self.hidden) for _ in self.cells]
        z = observations.new_zeros(b, LATENT)
        feats, kls = [], []
        for step in range(t):
            x = torch.cat([z, actions[:, step]], -1)
            for i, cell in enumerate(self.cells):
                hs[i] = cell(x, hs[i])
                x = hs[i]
            h = hs[-1]
            prior_mean, prior_std = self._split(self.prior(h))
            post_mean, post_std = self._split(self.posterior(torch.cat([h, embed[:, step]], -1)))
            z = post_mean + post_std * noise[:, step]
            kl = (torch.log(prior_std / post_std) + (post_std**2 + (post_mean - prior_mean) ** 2) / (2 * prior_std**2) - 0.5)
            kls.append(kl.sum(-1))
            feats.append(torch.cat([h, z], -1))
        feat = torch.stack(feats, 1)
        recon = self.decoder(feat.flatten(0, 1)).view_as(observations)
        reward = self.reward(feat).squeeze(-1)
        kl = torch.stack(kls, 1).mean()
        loss = (recon - observations).pow(2).mean() + (reward - rewards).pow(2).mean() + 0.1 * kl
        return {"loss": loss, "reconstruction": recon, "reward": reward, "kl": kl}


def _builder(pixels: bool) -> Callable[[ModelConfig, ModelEntry], BuiltModel]:
    def build(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
        model = finish_model(RSSM(hidden=config.hidden or 32, layers=config.layers or 1, pixels=pixels), config)
        dtype = next(model.parameters()).dtype

        def batch(step: int) -> dict[str, Any]:
            gen = input_generator(config, step)
            b, t = config.batch, config.size
            actions = torch.randn(b, t, ACTION_DIM, generator=gen).tanh()
            if pixels:
                obs = torch.randn(b, t, 3, IMAGE, IMAGE, generator=gen) * 0.5
            else:  # a smooth trajectory driven by the actions, so the dynamics are learnable
                obs = torch.cumsum(actions.repeat(1, 1, OBS_DIM // ACTION_DIM), 1) * 0.3
            rewards = obs.flatten(2).mean(-1)
            noise = torch.randn(b, t, LATENT, generator=gen)
            return {k: v.to(dtype) for k, v in {"observations": obs, "actions": actions, "rewards": rewards,
                                                 "noise": noise}.items()}

        return BuiltModel(model=model, inputs=batch(0), loss_fn=output_loss, optimizer_factory=sgd_factory,
                          modality="sequence", notes=f"RSSM world model ({'pixels' if pixels else 'state'})",
                          config=config, batch_fn=batch)

    return build


register_model("world/rssm", modality="sequence", tasks=("world_model",), sizes=(8, 16), batches=(2, 1),
               knob_values={"layers": (2,), "hidden": (64,)})(_builder(False))
register_model("world/rssm_pixels", modality="video", tasks=("world_model",), sizes=(4, 8), batches=(2, 1),
               knob_values={"layers": (2,), "hidden": (64,)})(_builder(True))
