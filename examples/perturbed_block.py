"""A residual MLP in which exactly one block uses a distinctive op (arctan gating), for fault injection.

Faults in the emulated device act on one ATen op everywhere it runs; a model
where only ``blocks.2`` calls ``torch.atan`` turns an op-level fault into a
layer-level one. Perturb that op and ``neuron-validate`` must name the layer
and the op, with this file's line:

    neuron-validate examples/perturbed_block.py                    # ready
    NEURON_VALIDATE_FAULTS="perturb@aten::atan,rel=0.01" \
        neuron-validate examples/perturbed_block.py                # not ready: blocks.2, aten::atan
"""

import torch
import torch.nn as nn

WIDTH, DEPTH = 32, 4
GATED = 2  # the one block that gates with arctan


class Block(nn.Module):
    def __init__(self, gated: bool):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)
        self.gated = gated

    def forward(self, x):
        h = self.up(self.norm(x))
        h = torch.atan(h) if self.gated else torch.relu(h)
        return x + self.down(h)


class ResidualMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(i == GATED) for i in range(DEPTH))
        self.head = nn.Linear(WIDTH, 5)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def get_model():
    torch.manual_seed(0)
    return ResidualMLP()


def get_inputs():
    return (torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(7)),)
