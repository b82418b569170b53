"""A variational autoencoder trained the usual way (training-script convention), drawing on the device.

The reparameterisation draws ``torch.randn_like(std)`` on the device at every
step. neuron-validate gives the target the reference's draws for every
comparison that must be deterministic (layers, gradients, the loss curve), so
a fault downstream of the draw is judged like any other; the device's own
random numbers are judged apart, as a distribution.

Expected: READY under ``exact`` and the default profile. With a 2% fault in
the decoder's sigmoid (``NEURON_VALIDATE_FAULTS=perturb@aten::sigmoid,rel=0.02``)
NOT READY, naming layer ``dec.3`` (Sigmoid) and op ``aten::sigmoid``.
"""

import torch
from torch import nn
import torch.nn.functional as F

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")


class VAE(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 48, latent: int = 8) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(features, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, features), nn.Sigmoid())

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        std = torch.exp(0.5 * logvar)
        z = mu + torch.randn_like(std) * std  # drawn on the device
        return self.dec(z), mu, logvar


torch.manual_seed(0)
model = VAE().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)
images = (torch.rand(256, 64, generator=data) > 0.6).float()  # binary "images"

for step in range(20):
    batch = images[(step * 32) % 256:(step * 32) % 256 + 32].to(device)
    recon, mu, logvar = model(batch)
    bce = F.binary_cross_entropy(recon, batch, reduction="sum") / batch.shape[0]
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / batch.shape[0]
    loss = bce + kld
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
