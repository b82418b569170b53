"""PyTorch's DDP tutorial as published for torchrun on CUDA GPUs: ``init_process_group(backend="nccl")``,
``torch.cuda.set_device(local_rank)``, the model and batches moved with ``.to(local_rank)``,
``DistributedDataParallel(model, device_ids=[local_rank])`` and a ``DistributedSampler``."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)).to(local_rank),
                device_ids=[local_rank])
    data = TensorDataset(torch.randn(256, 20), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(local_rank), y.to(local_rank)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
