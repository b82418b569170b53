"""Full-batch L-BFGS with a strong-Wolfe line search: backward() runs inside optimizer.step(closure), as many
times as the line search needs. Prints what each step(closure) returns."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
X = torch.linspace(-3, 3, 200).unsqueeze(1)
X, Y = X.to(device), (torch.sin(2 * X) + 0.1 * X ** 2).to(device)
model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=5, history_size=10, line_search_fn="strong_wolfe")


def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), Y)
    loss.backward()
    return loss


for epoch in range(4):
    print("step(closure) returned", repr(opt.step(closure).item()))
