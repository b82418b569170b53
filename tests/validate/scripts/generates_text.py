"""Inference only: a tiny GPT-2 made from a config generates with a key-value cache (transformers' DynamicCache,
handed to every call as ``past_key_values`` and filled as generation goes)."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=500, n_positions=64)
model = GPT2LMHeadModel(config).to(device).eval()
prompt = torch.randint(0, 500, (2, 12), device=device)
with torch.inference_mode():
    tokens = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
print(tokens[:, 12:].tolist())
