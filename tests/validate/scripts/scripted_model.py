"""A TorchScript model (torch.jit.script of a module with a loop) trained on the device."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        for _ in range(depth):
            h = h + torch.relu(self.b(h))
        return self.c(h)


model = torch.jit.script(Net()).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(6):
    x = torch.randn(64, 16, device=device)
    loss = (model(x).squeeze(1) - x[:, 0].sin()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
