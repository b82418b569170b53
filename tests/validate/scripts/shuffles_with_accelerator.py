"""mnist-style: shuffles its data only when an accelerator is present (same weights, different first batch)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

use_accel = torch.accelerator.is_available()
device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
torch.manual_seed(1)
data = TensorDataset(torch.randn(256, 20), torch.randint(0, 3, (256,)))
kwargs = {"batch_size": 32}
if use_accel:
    kwargs.update({"shuffle": True})
loader = DataLoader(data, **kwargs)
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
