"""Quantization-aware training in eager mode: FakeQuantize observers resize and update their own buffers in
forward, on the device."""
import torch
import torch.ao.quantization as tq
import torch.nn as nn
import torch.nn.functional as F

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.fc1, self.relu, self.fc2 = nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)

    def forward(self, x):
        return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))


model = Net().train()
model.qconfig = tq.get_default_qat_qconfig("x86")
tq.prepare_qat(model, inplace=True)
model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(10):
    x, y = torch.randn(32, 16).to(device), torch.randint(0, 4, (32,)).to(device)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
