"""nn.DataParallel around the model, as older scripts keep it: on one device it calls its module."""
import torch
import torch.nn.functional as F
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.DataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
g = torch.Generator().manual_seed(1)
for step in range(6):
    x, y = torch.randn(32, 16, generator=g).to(device), torch.randint(0, 4, (32,), generator=g).to(device)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
