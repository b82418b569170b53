"""A diffusion-style denoising loop (training-script convention): noise and timesteps drawn on the device.

Every step draws the noise with ``torch.randn_like`` and the timesteps with
``torch.randint`` on the device, as DDPM training loops do. The target takes
the reference's draws for the compared runs; its own stream is judged as a
distribution against reference runs drawing from other streams.

Expected: READY under ``exact`` and the default profile. With a 1% fault in
``aten::silu`` (``NEURON_VALIDATE_FAULTS=perturb@aten::silu,rel=0.01``) NOT
READY, naming the first SiLU layer and the op.
"""

import math

import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
STEPS = 50


class Denoiser(nn.Module):
    """Predicts the noise added to x at timestep t."""

    def __init__(self, features: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(16, hidden), nn.SiLU())
        self.net = nn.Sequential(nn.Linear(features + hidden, hidden), nn.SiLU(), nn.Linear(hidden, features))

    def forward(self, x, t):
        freqs = torch.exp(-math.log(1000.0) * torch.arange(8, device=x.device) / 8)
        angles = t.float()[:, None] * freqs[None]
        emb = self.embed(torch.cat([angles.sin(), angles.cos()], dim=1))
        return self.net(torch.cat([x, emb], dim=1))


torch.manual_seed(0)
model = Denoiser().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
betas = torch.linspace(1e-4, 0.02, STEPS)
alphas_bar = torch.cumprod(1 - betas, dim=0).to(device)
data = torch.Generator().manual_seed(1)
clean = torch.randn(512, 32, generator=data).cumsum(dim=1) / 8  # smooth "signals"

for step in range(20):
    x0 = clean[(step * 64) % 512:(step * 64) % 512 + 64].to(device)
    t = torch.randint(0, STEPS, (x0.shape[0],), device=device)  # timesteps drawn on the device
    noise = torch.randn_like(x0)  # noise drawn on the device
    a = alphas_bar[t][:, None]
    noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
    loss = nn.functional.mse_loss(model(noisy, t), noise)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
