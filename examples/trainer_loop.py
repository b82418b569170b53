"""A trainer-style loop (training-script convention): a shuffling DataLoader, gradient accumulation, gradient
clipping, a learning-rate schedule, dropout, and a checkpoint written at the end.

A step is an optimizer step: each of the 12 steps accumulates 4 backward
passes, and the loss curve has one point per step (the mean of its passes).

Expected: READY under ``exact`` and the default profile (the checkpoint is
written apart per side). With a 1% fault in ``aten::addmm``
(``NEURON_VALIDATE_FAULTS=perturb@aten::addmm,rel=0.01``) NOT READY, naming
layer ``0`` (Linear) and the op.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
ACCUMULATE = 4

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.GELU(),
                      nn.Linear(64, 5)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=12)
data = torch.Generator().manual_seed(1)
features = torch.randn(768, 20, generator=data)
labels = (features[:, :5].argmax(dim=1) + (features[:, 5] > 0).long()) % 5
loader = DataLoader(TensorDataset(features, labels), batch_size=16, shuffle=True,
                    generator=torch.Generator().manual_seed(2))

model.train()
for micro, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    loss = nn.functional.cross_entropy(model(x), y) / ACCUMULATE
    loss.backward()
    if (micro + 1) % ACCUMULATE == 0:
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoint.pt")
print(f"final loss {loss.item() * ACCUMULATE:.4f}")
