"""A small classifier with dropout, trained the usual way (training-script convention).

Dropout makes two runs of the model differ, so a naive comparison of its
outputs compares noise. neuron-validate turns dropout off for its layer
comparison (on every side) and keeps it in the training run itself.

Expected: READY under the default profile and under ``exact``. With a 1%
fault in the first layer's matmul (``NEURON_VALIDATE_FAULTS=perturb@aten::addmm,rel=0.01``)
it is NOT READY, and the numerics finding names layer ``0`` (Linear) and op
``aten::addmm``.
"""

import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1)
x = torch.randn(64, 32, generator=data)
y = torch.randint(0, 10, (64,), generator=data)

for step in range(20):
    inputs, labels = x.to(device), y.to(device)
    loss = nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
