"""The functions convention, written for Trainium: it imports torch_neuronx and builds its model on the named
device."""
import torch
import torch_neuronx  # noqa: F401 - optional for the native backend, which autoloads
from torch import nn


def get_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2)).to("neuron")


def get_inputs():
    return torch.randn(4, 8, device="neuron")
