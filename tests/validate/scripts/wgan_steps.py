"""A WGAN trained as WGAN scripts train it: several critic steps, the generator's fakes made under no_grad
there, then a generator step. Only the generator computes tanh."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh()).to(device)
critic = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1)).to(device)
opt_g = torch.optim.RMSprop(generator.parameters(), lr=5e-4)
opt_c = torch.optim.RMSprop(critic.parameters(), lr=5e-4)
data = torch.rand(512, 16) * 2 - 1
for i in range(8):
    for k in range(3):
        real = data[(i * 3 + k) * 16:(i * 3 + k + 1) * 16].to(device)
        with torch.no_grad():
            fake = generator(torch.randn(16, 8, device=device))
        loss_c = critic(fake).mean() - critic(real).mean()
        opt_c.zero_grad()
        loss_c.backward()
        opt_c.step()
        for p in critic.parameters():
            p.data.clamp_(-0.05, 0.05)
    loss_g = -critic(generator(torch.randn(16, 8, device=device))).mean()
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()
    print(i, loss_c.item(), loss_g.item())
