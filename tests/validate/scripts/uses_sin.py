"""A model whose forward uses torch.sin: a backend module may run it on the host."""
import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)


class Wave(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.sin(self.fc(x)).sum(-1)


model = Wave().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
for _ in range(5):
    loss = model(x.to(device)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
