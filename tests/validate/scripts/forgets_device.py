"""Forgets .to(device): the model and the data stay on the CPU whatever the accelerator."""
import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 32)
y = torch.randint(0, 10, (64,))
for step in range(20):
    xb, yb = x, y
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("final", loss.item())
