"""A small attention model trained for 8 steps: ``--dropout P`` for attention dropout, ``--compile`` to compile
the model in the script itself (as nanoGPT does with compile=True)."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()
device = torch.accelerator.current_accelerator() or torch.device("cpu")


class Attention(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p = args.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


model = torch.nn.Sequential(Attention(), torch.nn.GELU(), torch.nn.Linear(32, 1)).to(device)
if args.compile:
    model = torch.compile(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(8):
    x = torch.randn(8, 16, 32)
    loss = F.mse_loss(model(x.to(device)), x.sum(-1, keepdim=True).to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
