"""A Hugging Face transformers GPT-2 built from a small config (random weights, no hub), trained with a manual
loop (training-script convention): its attention and residual dropouts draw on the device.

Expected: READY under ``exact`` and the default profile. With a 1% fault in
``aten::addmm`` (``NEURON_VALIDATE_FAULTS=perturb@aten::addmm,rel=0.01``) NOT
READY, naming a Conv1D layer of the first block and the op at transformers'
own source line.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
config = GPT2Config(vocab_size=99, n_positions=32, n_embd=32, n_layer=2, n_head=2, attn_implementation="eager")
model = GPT2LMHeadModel(config).to(device)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)
tokens = torch.randint(0, 99, (64, 16), generator=data)

for step in range(12):
    batch = tokens[(step * 8) % 64:(step * 8) % 64 + 8].to(device)
    loss = model(input_ids=batch, labels=batch).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
