"""A training script that imports a model library: the check's side workers have it imported already.

It prints whether torchvision was in ``sys.modules`` before its own import (each side's stdout.txt), and
trains a torchvision ``MLP`` on the accelerator. Expected: READY, and every side printed True.
"""

import sys

already = "torchvision" in sys.modules

import torch  # noqa: E402
import torchvision  # noqa: E402

print(f"torchvision imported before the script: {already}")
device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = torchvision.ops.MLP(8, [16, 4]).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1)
x, y = torch.randn(32, 8, generator=data), torch.randn(32, 4, generator=data)
for step in range(6):
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
