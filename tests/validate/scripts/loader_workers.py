"""DataLoader workers in a script without a ``__main__`` guard, as under ``python SCRIPT`` on Linux (workers
forked): a spawned worker would run this whole file again."""

import torch

device = torch.accelerator.current_accelerator() or torch.device("cpu")


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4,), float(i)), torch.tensor([i / 64])


model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for epoch in range(2):
    for x, y in torch.utils.data.DataLoader(Numbers(), batch_size=16, num_workers=1):
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
