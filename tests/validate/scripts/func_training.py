"""Training written with torch.func (DP-SGD style): per-sample gradients from vmap(grad(functional_call)),
clipped per sample and applied by hand; no backward() anywhere. The model is called outside a transform only
to print the loss."""
import torch
import torch.nn as nn
from torch.func import functional_call, grad, vmap

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 5)).to(device)
params = {name: p.detach() for name, p in model.named_parameters()}


def loss_fn(params, x, y):
    return nn.functional.cross_entropy(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))


per_sample_grads = vmap(grad(loss_fn), in_dims=(None, 0, 0))
X = torch.randn(512, 20)
Y = X[:, :5].argmax(1)
for step in range(6):
    i = torch.randint(0, 512, (64,))
    xb, yb = X[i].to(device), Y[i].to(device)
    grads = per_sample_grads(params, xb, yb)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    scale = 1.0 / norms.clamp(min=1.0)
    with torch.no_grad():
        for name, g in grads.items():
            params[name] = params[name] - 0.5 * (g * scale.view(-1, *[1] * (g.dim() - 1))).mean(0)
        print(step, loss_fn(params, xb[0], yb[0]).item())
