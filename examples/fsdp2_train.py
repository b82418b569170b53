"""A torchrun-style FSDP2 training script, as users write them (run: torchrun --nproc-per-node 2 fsdp2_train.py).

Checked unchanged with: neuron-validate --nproc 2 examples/fsdp2_train.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group()
    rank = dist.get_rank()
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None:
        device = torch.device(accelerator.type, int(os.environ.get("LOCAL_RANK", 0)) % torch.accelerator.device_count())
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(7))
    for step in range(20):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 32, generator=g)
        y = x @ teacher
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
