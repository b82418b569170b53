"""A sequence classifier on ``nn.TransformerEncoder``, trained a few steps and never evaluated.

In eval mode without gradients PyTorch runs each encoder layer as one fused kernel
(``aten::_transformer_encoder_layer_fwd``) on any device it supports, the PrivateUse1 device included;
training runs the layer op by op. A fault in the fused kernel shows in nothing the script itself runs.
"""

import torch
from torch import nn
import torch.nn.functional as F

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")


class Classifier(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


torch.manual_seed(0)
model = Classifier().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)
tokens = torch.randint(0, 50, (64, 12), generator=data)
labels = torch.randint(0, 4, (64,), generator=data)
for step in range(8):
    batch = slice(step % 4 * 16, step % 4 * 16 + 16)
    loss = F.cross_entropy(model(tokens[batch].to(device)), labels[batch].to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
