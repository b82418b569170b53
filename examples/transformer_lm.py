"""A word-level language model on ``nn.Transformer``'s encoder, trained the usual way (as pytorch/examples'
word_language_model --model Transformer): dropout inside every layer, drawn on the device.

The CPU's generator draws the initial weights, so the device's generator is at
another position when dropout draws its masks: the two sides' masks differ
unless the target takes the reference's draws, which neuron-validate gives it.

Expected: READY under ``exact`` and the default profile. With a 1% fault in
``aten::addmm`` (``NEURON_VALIDATE_FAULTS=perturb@aten::addmm,rel=0.01``) NOT
READY, naming a Linear layer and the op.
"""

import math

import torch
from torch import nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
VOCAB, D_MODEL, SEQ, BATCH = 64, 32, 24, 8


class TransformerLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=4, dim_feedforward=64, dropout=0.2)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.decoder = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens):  # tokens: (seq, batch)
        h = self.embed(tokens) * math.sqrt(D_MODEL)
        return self.decoder(self.encoder(h, mask=self.mask, is_causal=True))


torch.manual_seed(0)
model = TransformerLM().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
data = torch.Generator().manual_seed(1)
corpus = torch.randint(0, VOCAB, (4000,), generator=data)
corpus[1::2] = (corpus[::2] * 7 + 3) % VOCAB  # learnable structure: every other token follows from the last

for step in range(20):
    start = (step * SEQ * BATCH) % (len(corpus) - SEQ * BATCH - 1)
    chunk = corpus[start:start + SEQ * BATCH + 1]
    tokens = chunk[:-1].view(BATCH, SEQ).t().contiguous().to(device)
    targets = chunk[1:].view(BATCH, SEQ).t().contiguous().to(device)
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
print(f"final loss {loss.item():.4f}")
