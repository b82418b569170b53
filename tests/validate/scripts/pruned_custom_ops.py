"""A model with user-defined autograd and pruning, trained on the device: a torch.autograd.Function with a
hand-written backward, a torch.library.custom_op with register_autograd, and L1 unstructured pruning (whose
``weight`` is computed from ``weight_orig`` and ``weight_mask`` by a forward pre-hook before every call)."""
import torch
import torch.nn as nn
import torch.nn.utils.prune as prune

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        x, s = ctx.saved_tensors
        return grad * (s * (1 + x * (1 - s)))


@torch.library.custom_op("nvtest::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return scale * torch.tanh(x)


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _save(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


scaled_tanh.register_autograd(_backward, setup_context=_save)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc3(scaled_tanh(Swish.apply(self.fc2(Swish.apply(self.fc1(x)))), 1.7))


model = Net().to(device)
prune.l1_unstructured(model.fc1, "weight", amount=0.3)
prune.l1_unstructured(model.fc2, "weight", amount=0.5)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(8):
    x = torch.randn(64, 16, device=device)
    loss = nn.functional.smooth_l1_loss(model(x), x[:, :4].sin())
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
