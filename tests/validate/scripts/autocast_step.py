"""Trains under torch.autocast (bfloat16) on whatever device it is given: the compared call ran under autocast.
With ``--scaler``, the loss is scaled by a GradScaler, as mixed-precision scripts do."""
import sys

import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler(device.type, enabled="--scaler" in sys.argv)
x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
for _ in range(5):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        out = model(x.to(device))
    loss = out.float().pow(2).mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
