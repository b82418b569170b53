"""A model held as separate top-level modules, as many scripts hold one: an embedding, and an encoder and a head
kept in a ModuleDict, each called by the training loop itself (``net.encoder(...)``), and a frozen teacher
called without gradients. The encoder alone computes tanh."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
embedding = nn.Embedding(40, 32).to(device)
net = nn.ModuleDict({"encoder": nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32)),
                     "head": nn.Linear(32, 40)}).to(device)
teacher = nn.Linear(32, 40).to(device).requires_grad_(False)
parameters = [*embedding.parameters(), *net.parameters()]
optimizer = torch.optim.Adam(parameters, lr=1e-2)
tokens = torch.randint(0, 40, (256, 8))
for step in range(12):
    x = tokens[step * 16:(step + 1) * 16].to(device)
    hidden = net.encoder(embedding(x))
    logits = net.head(hidden)
    with torch.no_grad():
        hint = teacher(hidden).softmax(-1)
    distilled = (logits.softmax(-1) - hint).square().mean()
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()) + 0.1 * distilled
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
