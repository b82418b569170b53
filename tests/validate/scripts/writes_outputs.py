"""Writes model.pt (new) and existing.pt (exists in the working directory); reads inputs.pt; a process it starts
appends to notes.txt (exists too), past the side's own Python."""
import argparse, subprocess, sys, torch
from torch import nn
p = argparse.ArgumentParser(); p.add_argument("--save", default="model.pt"); p.add_argument("--data", default="inputs.pt")
a = p.parse_args()
x = torch.load(a.data)
device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
m = nn.Linear(4, 2).to(device)
for _ in range(3):
    loss = m(x.to(device)).pow(2).mean(); loss.backward()
torch.save(m.state_dict(), a.save)
torch.save(m.state_dict(), "existing.pt")
subprocess.run([sys.executable, "-c", "open('notes.txt', 'a').write('a line\\n')"], check=True)
