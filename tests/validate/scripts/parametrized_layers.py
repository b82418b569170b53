"""Spectral norm and weight norm (torch.nn.utils.parametrizations): a parametrized layer's weight is computed by a
module call whenever it is read, first while the layer is built on the CPU."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(spectral_norm(nn.Linear(16, 32)), nn.LeakyReLU(0.2), weight_norm(nn.Linear(32, 32)), nn.GELU(),
                      nn.Linear(32, 1)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.999))
g = torch.Generator().manual_seed(1)
for step in range(6):
    x = torch.randn(32, 16, generator=g).to(device)
    y = torch.rand(32, 1, generator=g).round().to(device)
    loss = F.binary_cross_entropy_with_logits(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
