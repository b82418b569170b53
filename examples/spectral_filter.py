"""A signal model with a learned spectral filter (FFT in forward), in the functions convention.

``torch.fft.rfft`` / ``irfft`` have no kernels on the emulated device under
the default ``neuron-2.27`` profile: they run on the host through the CPU
fallback, correctly but with a copy each way. Verdict: ``ready with warnings``,
with the host-fallback ops and the line that calls them.

    neuron-validate examples/spectral_filter.py
"""

import torch
import torch.nn as nn

SAMPLES, CHANNELS, BATCH = 128, 4, 8


class SpectralFilter(nn.Module):
    """Multiplies the signal's spectrum by a learned gain per frequency."""

    def __init__(self, samples: int, channels: int):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(channels, samples // 2 + 1))

    def forward(self, x):
        spectrum = torch.fft.rfft(x, dim=-1)
        return torch.fft.irfft(spectrum * self.gain, n=x.shape[-1], dim=-1)


class SignalModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix_in = nn.Conv1d(CHANNELS, CHANNELS, 5, padding=2)
        self.filter = SpectralFilter(SAMPLES, CHANNELS)
        self.head = nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(CHANNELS * SAMPLES, 3))

    def forward(self, x):
        return self.head(self.filter(self.mix_in(x)))


def get_model():
    torch.manual_seed(0)
    return SignalModel()


def get_inputs():
    t = torch.linspace(0, 1, SAMPLES)
    tones = torch.stack([torch.sin(2 * torch.pi * f * t) for f in (3.0, 7.0, 19.0, 31.0)])
    noise = torch.randn(BATCH, CHANNELS, SAMPLES, generator=torch.Generator().manual_seed(2))
    return (tones.expand(BATCH, -1, -1) + 0.1 * noise,)
