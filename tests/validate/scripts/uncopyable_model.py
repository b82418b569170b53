"""A model that keeps an open file (it logs its activations' scale): ``copy.deepcopy`` cannot copy it, so its
layers cannot be compared one by one; the training itself runs on every side."""
import os

import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)


class LoggingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.log = open(os.devnull, "w")

    def forward(self, x):
        out = self.body(x)
        print(float(out.detach().abs().mean()), file=self.log)
        return out


model = LoggingNet().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(6):
    x = torch.randn(32, 8)
    loss = nn.functional.mse_loss(model(x.to(device)), x.sum(1, keepdim=True).to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
