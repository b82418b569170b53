"""A GAN trained as pytorch/examples' dcgan trains it: the discriminator on real data (backward), the
generator's fake through it detached (backward), the discriminator's step, then the generator's. Only the
generator computes tanh."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
netG = nn.Sequential(nn.ConvTranspose2d(16, 32, 4, 1, 0), nn.BatchNorm2d(32), nn.ReLU(),
                     nn.ConvTranspose2d(32, 1, 4, 2, 1), nn.Tanh()).to(device)
netD = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(32, 1, 4, 1, 0), nn.Flatten(),
                     nn.Sigmoid()).to(device)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
data = torch.rand(256, 1, 8, 8) * 2 - 1
for i in range(12):
    real = data[i * 16:(i + 1) * 16].to(device)
    netD.zero_grad()
    label = torch.full((16, 1), 1.0, device=device)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    noise = torch.randn(16, 16, 1, 1, device=device)
    fake = netG(noise)
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake), label)
    errG.backward()
    optimizerG.step()
    print(i, errD_real.item() + errD_fake.item(), errG.item())
