"""flex: small transformer language models whose attention is ``torch.nn.attention.flex_attention``.

Each architecture is one attention pattern, written once as a FlexAttention
``score_mod``/``mask_mod`` and once as the equivalent dense mask, so the
``attn`` axis compares the implementations on the same weights: ``flex``
(the default) calls ``flex_attention`` with a block mask, ``sdpa`` calls
``scaled_dot_product_attention`` with the dense mask, ``eager`` does the
softmax by hand. PyTorch's FlexAttention has no backward on CPU (nor on any
device outside its list), so flex is registered for eval only; train and
steps run with ``sdpa`` or ``eager``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..built import BuiltModel, finish_model, input_generator, output_loss, sgd_factory
from ..config import ModelConfig
from ..registry import ModelEntry, register_model

VOCAB = 128
FLEX_NO_BACKWARD = "FlexAttention has no backward on CPU in this torch; train with attn=sdpa or attn=eager"


@dataclass(frozen=True, slots=True, kw_only=True)
class Pattern:
    """An attention pattern: a mask (q_idx, kv_idx, doc ids) and an additive score bias (head, q_idx, kv_idx)."""

    name: str
    doc: str
    mask: Callable[[Any, Any, Any], Any] | None = None
    bias: Callable[[Any, Any, Any, int], Any] | None = None  # (h, q_idx, kv_idx, heads) -> bias
    softcap: float | None = None
    documents: bool = False


def _causal(q: Any, k: Any, docs: Any) -> Any:
    return q >= k


def _sliding(q: Any, k: Any, docs: Any) -> Any:
    return (q >= k) & (q - k < 4)


def _document(q: Any, k: Any, docs: Any) -> Any:
    return (q >= k) & (docs[q] == docs[k])


def _alibi(h: Any, q: Any, k: Any, heads: int) -> Any:
    slope = torch.exp2(-8.0 * (h + 1) / heads)
    return -slope * (q - k).abs()


PATTERNS = [
    Pattern(name="causal_lm", doc="causal self-attention", mask=_causal),
    Pattern(name="sliding_window", doc="causal attention within a 4-token window", mask=_sliding),
    Pattern(name="alibi", doc="causal attention with ALiBi position biases as a score_mod", mask=_causal, bias=_alibi),
    Pattern(name="softcap", doc="causal attention with tanh logit soft-capping (Gemma 2 style)", mask=_causal, softcap=20.0),
    Pattern(name="document_mask", doc="causal attention within packed documents", mask=_document, documents=True),
]


class FlexSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, pattern: Pattern, impl: str) -> None:
        super().__init__()
        self.heads, self.head_dim, self.pattern, self.impl = heads, hidden // heads, pattern, impl
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.impl == "flex":
            y = self._flex(q, k, v, docs)
        else:
            y = self._dense(q, k, v, docs)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))

    def _flex(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        p, heads, t = self.pattern, self.heads, q.shape[-2]
        doc_ids = docs[0] if docs is not None else None

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return p.mask(q_idx, kv_idx, doc_ids)

        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            if p.softcap is not None:
                score = p.softcap * torch.tanh(score / p.softcap)
            if p.bias is not None:
                score = score + p.bias(h, q_idx, kv_idx, heads)
            return score

        block_mask = create_block_mask(mask_mod, None, None, t, t, device=str(q.device))
        with warnings.catch_warnings():  # eager flex runs the unfused reference path; that is the point here
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    def _dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
        p, t = self.pattern, q.shape[-2]
        qi = torch.arange(t, device=q.device).view(t, 1)
        ki = torch.arange(t, device=q.device).view(1, t)
        allowed = p.mask(qi, ki, docs[0] if docs is not None else None)
        if self.impl == "sdpa" and p.softcap is None:
            bias = torch.zeros(self.heads, t, t, dtype=q.dtype, device=q.device)
            if p.bias is not None:
                h = torch.arange(self.heads, device=q.device).view(-1, 1, 1)
                bias = bias + p.bias(h, qi, ki, self.heads).to(q.dtype)
            bias = bias.masked_fill(~allowed, float("-inf"))
            return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if p.softcap is not None:
            scores = p.softcap * torch.tanh(scores / p.softcap)
        if p.bias is not None:
            h = torch.arange(self.heads, device=q.device).view(-1, 1, 1)
            scores = scores + p.bias(h, qi, ki, self.heads).to(scores.dtype)
        scores = scores.masked_fill(~allowed, float("-inf"))
        return scores.softmax(-1) @ v


class FlexBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, pattern: Pattern, impl: str) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = FlexSelfAttention(hidden, heads, pattern, impl)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def forward(self, x: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), docs)
        return x + self.mlp(self.norm2(x))


class FlexLM(nn.Module):
    """Token embedding, learned positions, pre-norm blocks, tied LM head; returns the next-token loss."""

    def __init__(self, *, hidden: int, heads: int, layers: int, max_len: int, pattern: Pattern, impl: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Parameter(torch.randn(max_len, hidden) * 0.02)
        self.blocks = nn.ModuleList(FlexBlock(hidden, heads, pattern, impl) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, input_ids: torch.Tensor, document_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        for block in self.blocks:
            x = block(x, document_ids)
        logits = self.norm(x) @ self.embed.weight.t()
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), input_ids[:, 1:].reshape(-1))
        return {"loss": loss, "logits": logits}


def _builder(pattern: Pattern) -> Callable[[ModelConfig, ModelEntry], BuiltModel]:
    def build(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
        impl = "flex" if config.attn in ("default", "flex") else config.attn
        hidden, heads = config.hidden or 32, config.heads or 4
        model = FlexLM(hidden=hidden, heads=heads, layers=config.layers or 2, max_len=max(entry.sizes),
                       pattern=pattern, impl=impl)
        model = finish_model(model, config)

        def batch(step: int) -> dict[str, Any]:
            gen = input_generator(config, step)
            # a learnable sequence: a random start, then each token follows from the previous one
            start = torch.randint(0, VOCAB, (config.batch, 1), generator=gen)
            stride = torch.randint(1, 7, (config.batch, 1), generator=gen)
            ids = (start + stride * torch.arange(config.size)) % VOCAB
            inputs: dict[str, Any] = {"input_ids": ids}
            if pattern.documents:  # the same packing for the whole batch (FlexAttention's mask is per position)
                cuts = torch.sort(torch.randperm(config.size - 1, generator=gen)[:2] + 1).values
                inputs["document_ids"] = (torch.arange(config.size).view(1, -1) >= cuts.view(-1, 1)).sum(0) \
                    .expand(config.batch, -1).contiguous()
            return inputs

        return BuiltModel(model=model, inputs=batch(0), loss_fn=output_loss, optimizer_factory=sgd_factory,
                          modality="text", notes=f"{pattern.doc}; attention via {impl}", config=config, batch_fn=batch)

    return build


for _p in PATTERNS:
    register_model(
        f"flex/{_p.name}", modality="text", tasks=("causal_lm",), attn=("default", "flex", "sdpa", "eager"),
        sizes=(16, 32), batches=(2, 1), knob_values={"layers": (1, 4), "hidden": (64,), "heads": (2, 8)},
        unsupported=(({"attn": ("default", "flex"), "mode": ("train", "steps")}, FLEX_NO_BACKWARD),),
        meta={"pattern": _p.name},
    )(_builder(_p))
