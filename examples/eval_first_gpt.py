"""nanoGPT's shape of a training loop: the first model call is an evaluation under ``torch.no_grad``.

``estimate_loss()`` runs the model in eval mode without gradients before the
first training step, and every few steps after. neuron-validate compares the
first call that builds a graph for gradients, so gradients are compared too,
and in compile mode it names the recompilation on each train()/eval() switch
as expected rather than as a problem.

Expected: READY; numerics compares outputs and gradients (gradients > 0).
"""

import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
VOCAB, CONTEXT, WIDTH = 32, 16, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.block = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx, targets=None):
        logits = self.head(self.block(self.embed(idx)))
        loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


model = TinyLM().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
data = torch.Generator().manual_seed(1)
tokens = torch.randint(0, VOCAB, (8, CONTEXT + 1), generator=data)
x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)


@torch.no_grad()
def estimate_loss():
    model.eval()
    loss = model(x, y)[1].item()
    model.train()
    return loss


for it in range(12):
    if it % 4 == 0:
        print(f"step {it}: val loss {estimate_loss():.4f}")
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
