"""A tiny GPT trained on a toy corpus, written the way a team targeting any accelerator writes it.

Nothing here knows about Neuron: the device comes from ``torch.accelerator``
(``neuron`` when the Neuron backend is installed, else the CPU), the data and
the weights are drawn on the CPU from a fixed seed and moved to the device.

    python examples/tiny_gpt.py               # trains on whatever accelerator is present
    neuron-validate examples/tiny_gpt.py      # the same script, checked against the CPU
"""

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 64, 32, 64, 4, 2
BATCH, STEPS, LR = 8, 30, 3e-3


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def corpus(n_tokens: int, generator: torch.Generator) -> torch.Tensor:
    """A toy language: runs of counting that restart at random, so the model has something to learn."""
    restart = torch.rand(n_tokens, generator=generator) < 0.1
    restart[0] = True
    segment = torch.cumsum(restart.long(), 0) - 1
    first = torch.randint(0, VOCAB, (int(restart.sum()),), generator=generator)
    offset = torch.arange(n_tokens) - restart.nonzero().squeeze(1)[segment]
    return (first[segment] + offset) % VOCAB


def main():
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    data = corpus(4096, torch.Generator().manual_seed(1234))
    model = TinyGPT().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    batches = torch.Generator().manual_seed(99)
    start = time.perf_counter()
    for step in range(STEPS):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=batches)
        x = torch.stack([data[s:s + CONTEXT] for s in starts]).to(device)
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts]).to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == STEPS - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}  ({math.exp(loss.item()):.1f} ppl)")
    print(f"trained {STEPS} steps on {device} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
