"""Takes its device from the project's settings module."""
import torch
from torch import nn

from settings import DEVICE

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 8), torch.randn(32, 1)
for _ in range(10):
    loss = nn.functional.mse_loss(model(x.to(DEVICE)), y.to(DEVICE))
    opt.zero_grad()
    loss.backward()
    opt.step()
