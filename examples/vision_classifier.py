"""A small image classifier in the functions convention: the harness builds and drives it.

``neuron-validate`` imports this file and calls ``get_model()`` and
``get_inputs()``; ``loss_fn(output)`` turns the logits into the training loss.
Convolutions, batch norm, ReLU and pooling all have device kernels and are
computed exactly as on the CPU, so the verdict is ``ready``.

    neuron-validate examples/vision_classifier.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES = 10
BATCH = 8
LABELS = torch.arange(BATCH) % CLASSES


def conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                         nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(conv_block(3, 16), conv_block(16, 32), conv_block(32, 64))
        self.classifier = nn.Linear(64, CLASSES)

    def forward(self, images):
        x = self.features(images)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)


def get_model():
    torch.manual_seed(0)
    return SmallCNN()


def get_inputs():
    return (torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)


def loss_fn(logits):
    return F.cross_entropy(logits, LABELS.to(logits.device))
