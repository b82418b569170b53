"""A text classifier trained on batches whose sequence length changes from step to step.

Unpadded, bucketless batching is harmless in eager mode, but the Neuron
compiler builds one graph per input shape: under ``--mode compile`` every new
length recompiles. ``neuron-validate`` counts the compilations, names the
dimension that varies with its values, and suggests padding. Verdict in
compile mode: ``ready with warnings``; in eager mode: ``ready``.

    neuron-validate examples/varying_shapes.py --mode compile
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, CLASSES = 100, 32, 4
LENGTHS = (9, 14, 23, 31, 14, 40, 9, 23, 52, 31)


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))
        return self.head(h.mean(dim=1))


def main():
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = BagClassifier().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(3)
    for step, length in enumerate(LENGTHS):
        tokens = torch.randint(0, VOCAB, (8, length), generator=data)
        labels = tokens[:, 0] % CLASSES
        loss = F.cross_entropy(model(tokens.to(device)), labels.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} length {length:3d} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
