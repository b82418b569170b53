"""A torchrun-style loop whose rank 1 raises at its third step, while rank 0 goes on to its next all-reduce."""
import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group(backend="gloo")
torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    if step == 2 and dist.get_rank() == 1:
        raise ValueError("rank 1 broke at step 2")
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
