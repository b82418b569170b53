"""Augmentation drawn from a torch.Generator made on the device, seeded again every epoch (the same jitter each
epoch), a state saved and put back, and a noise layer with a generator of its own; dropout beside them."""
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(20, 64), nn.Dropout(0.1), nn.Linear(64, 3)
        self.noise = torch.Generator(device=device).manual_seed(7)

    def forward(self, x):
        h = self.drop(F.relu(self.fc1(x)))
        if self.training:
            h = h + 0.1 * torch.randn(h.shape, generator=self.noise, device=h.device)
        return self.fc2(h)


augment = torch.Generator(device=device)
model = Noisy().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
X = torch.randn(64, 20).to(device)
Y = (X[:, 0] > 0).long().to(device)
for epoch in range(3):
    augment.manual_seed(1234)
    for i in range(0, 64, 16):
        saved = augment.get_state()
        jitter = torch.rand(16, 1, generator=augment, device=device)
        if i == 16:
            augment.set_state(saved)  # the same jitter again
            jitter = torch.rand(16, 1, generator=augment, device=device)
        xb = X[i:i + 16] * (0.9 + 0.2 * jitter) + 0.05 * torch.randn(16, 20, generator=augment, device=device)
        loss = F.cross_entropy(model(xb), Y[i:i + 16])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(epoch, i, loss.item())
