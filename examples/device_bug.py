"""A training script with two classic device-placement bugs, run unchanged with a --device argument.

1. The causal mask is built in ``forward`` with ``torch.ones`` and no
   ``device=``: it lives on the CPU and ``masked_fill`` mixes it into device
   tensors.
2. The positional table is a plain tensor attribute, not a buffer, so
   ``model.to(device)`` leaves it on the CPU.

On the CPU both go unnoticed; a real accelerator raises "Expected all tensors
to be on the same device" (the emulated device copies silently, which is why
``neuron-validate`` watches for it). Verdict: ``not ready``.

    python examples/device_bug.py --device cpu
    neuron-validate examples/device_bug.py     # fills in --device per side
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, WIDTH = 50, 16, 32


class MaskedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        t = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / WIDTH**0.5
        mask = torch.tril(torch.ones(t, t))  # bug 1: created on the CPU
        scores = scores.masked_fill(mask == 0, float("-inf"))
        return self.out(F.softmax(scores, dim=-1) @ v)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.randn(CONTEXT, WIDTH) * 0.02  # bug 2: not a buffer, .to() never moves it
        self.attn = MaskedAttention()
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        x = self.embed(idx) + self.positions[: idx.shape[1]]
        x = x + self.attn(x)
        return self.head(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyLM().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(5)
    for step in range(args.steps):
        idx = torch.randint(0, VOCAB, (4, CONTEXT), generator=data).to(args.device)
        loss = F.cross_entropy(model(idx)[:, :-1].reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
