"""Trains, then ends with os._exit(0), as scripts do to skip a slow interpreter teardown."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(6):
    x = torch.randn(16, 8).to(device)
    loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
os._exit(int(os.environ.get("EXIT_STATUS", "0")))
