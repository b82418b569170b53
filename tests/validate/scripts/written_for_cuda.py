"""Written for CUDA, as most public training scripts are: elsewhere it trains on the CPU.

``torch.cuda.is_available()`` picks the device, ``torch.cuda.manual_seed``, cudnn's benchmark flag, float16
autocast for "cuda" with the deprecated ``torch.cuda.amp.GradScaler``, ``.cuda()`` for the labels,
each step timed with ``torch.cuda.Event(enable_timing=True)`` for its images a second and marked with an NVTX
range, the device's free memory from ``torch.cuda.mem_get_info()``, ``torch.cuda.synchronize()``
and the peak memory at the end, reset first by its older name ``reset_max_memory_allocated``."""
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true")
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()
use_cuda = not args.no_cuda and torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")
torch.manual_seed(1)
if use_cuda:
    torch.cuda.manual_seed(1)
    torch.backends.cudnn.benchmark = True
    torch.cuda.reset_max_memory_allocated()  # the older name PyTorch's mixed-precision tutorial still calls


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 13 * 13, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(torch.flatten(self.drop(x), 1))


model = Net().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.cuda.amp.GradScaler(enabled=use_cuda)
images, labels = torch.randn(96, 1, 28, 28), torch.randint(0, 10, (96,))
if use_cuda:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for step in range(args.steps):
    if use_cuda:
        start.record()
        torch.cuda.nvtx.range_push(f"step {step}")
    data = images[step * 8 % 96:][:8].to(device, non_blocking=True)
    target = labels[step * 8 % 96:][:8].cuda() if use_cuda else labels[step * 8 % 96:][:8]
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=use_cuda):
        loss = nn.functional.cross_entropy(model(data), target)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if use_cuda:
        torch.cuda.nvtx.range_pop()
        end.record()
        end.synchronize()
        print(f"step {step}: {len(data) / (start.elapsed_time(end) / 1000):.0f} images/s")
if use_cuda:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB, "
          f"{torch.cuda.max_memory_reserved() / 2**20:.1f} MiB reserved, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
print(f"loss {loss.item():.4f}")
