"""Moved to Trainium by naming the device: torch.device("neuron"), .to("neuron"), autocast for "neuron",
torch.neuron.synchronize(), and torch_neuronx imported for its op tracking.

An attention classifier under bfloat16 autocast, its causal mask made in forward on the named device, its
batches pinned before they move (``pin_memory().to(..., non_blocking=True)``), trained with F.cross_entropy
(on the CPU's autocast list whole; on a device its log_softmax runs in bfloat16)."""
import torch
import torch_neuronx  # optional for the native backend, which autoloads; scripts import it anyway
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("neuron")
torch.manual_seed(0)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(12, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        h = self.embed(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], device="neuron", dtype=torch.bool), 1)
        h, _ = self.attn(h, h, h, attn_mask=mask)
        return self.head(h.mean(1))


loader = DataLoader(TensorDataset(torch.randn(64, 6, 12), torch.randint(0, 3, (64,))), batch_size=8, shuffle=True)
model = Classifier().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    for x, y in loader:
        x, y = x.pin_memory().to(device, non_blocking=True), y.to("neuron")
        with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
torch.neuron.synchronize()
print(f"final loss {loss.item():.4f}; ops run on the host: {torch_neuronx.get_fallback_ops()}")
