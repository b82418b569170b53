"""Pipeline stages of a zoo transformer, for ``torch.distributed.pipelining``.

:func:`split_stages` cuts a model of the flex family (token embedding and
learned positions, a ``ModuleList`` of blocks, a final norm, an LM head tied
to the embedding) into consecutive stages that share the model's own
modules, as torchtitan's manual split does: the first stage embeds, the
last normalises and projects. The head's weight is the embedding's, so the
first and last stages each hold it; :func:`tie_gradients` sums its two
gradients across them before the optimizer step (what Megatron does for a
tied embedding), which keeps the copies equal.
"""

from __future__ import annotations

import torch
from torch import nn


class Stage(nn.Module):
    """Blocks ``lo..hi`` of the model, with its embedding (first stage) or its norm and head (last stage)."""

    def __init__(self, model: nn.Module, lo: int, hi: int, *, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.embed = model.embed if first or last else None  # the last stage's head is the embedding's weight
        self.pos = model.pos if first else None
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.norm = model.norm if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x, None)
        if self.last:
            return self.norm(x) @ self.embed.weight.t()
        return x


def split_stages(model: nn.Module, num_stages: int) -> list[Stage]:
    """``num_stages`` stages of as many blocks each as the model's blocks allow (it needs one per stage)."""
    for attr in ("embed", "pos", "blocks", "norm"):
        if not hasattr(model, attr):
            raise ValueError(f"{type(model).__name__} has no {attr!r}: pipelining splits the flex family's "
                             f"transformers (embedding, blocks, norm, tied head)")
    blocks = len(model.blocks)
    if blocks < num_stages:
        raise ValueError(f"{blocks} blocks cannot make {num_stages} pipeline stages")
    cuts = [round(i * blocks / num_stages) for i in range(num_stages + 1)]
    return [Stage(model, cuts[i], cuts[i + 1], first=i == 0, last=i == num_stages - 1) for i in range(num_stages)]


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The flex models' own loss, from the last stage's logits and the microbatch's tokens."""
    vocab = logits.shape[-1]
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), input_ids[:, 1:].reshape(-1))


def tie_gradients(model: nn.Module, stage_index: int, num_stages: int, group) -> None:
    """Sum the tied embedding's gradients of the first and last stages (every rank calls; others pass)."""
    import torch.distributed as dist

    if num_stages == 1 or stage_index not in (0, num_stages - 1):
        return
    weight = model.embed.weight
    grad = weight.grad if weight.grad is not None else torch.zeros_like(weight)
    dist.all_reduce(grad, group=group)
    weight.grad = grad
