"""A synthetic transformer with random weights: nothing is downloaded.

Attention is built from plain `nn.Linear` modules and `F.scaled_dot_product_attention`
(`nn.MultiheadAttention` calls its `out_proj` functionally, which torchao's Float8Linear
cannot swap).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .inputs import batch, parse_inputs
from .workload import Workload


@dataclass(frozen=True)
class ModelConfig:
    blocks: int
    hidden: int
    heads: int
    seq: int
    batch: int
    vocab: int = 32000

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "tiny": ModelConfig(blocks=2, hidden=64, heads=4, seq=64, batch=2, vocab=512),
    "small": ModelConfig(blocks=12, hidden=768, heads=12, seq=1024, batch=4),
    "medium": ModelConfig(blocks=24, hidden=1024, heads=16, seq=1024, batch=4),
    "large": ModelConfig(blocks=32, hidden=1280, heads=20, seq=1024, batch=4),
}


def model_config(preset: str, **overrides) -> ModelConfig:
    """The preset with any non-None override (blocks, hidden, heads, seq, batch) applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    if config.hidden % config.heads:
        raise ValueError(f"hidden {config.hidden} is not divisible by heads {config.heads}")
    return config


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (proj(x).view(b, s, self.heads, h // self.heads).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):
    """LayerNorm → attention → LayerNorm → MLP (4× GELU), both residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.blocks = nn.ModuleList(Block(config.hidden, config.heads) for _ in range(config.blocks))
        self.norm = nn.LayerNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def builtin_workload(cfg: dict) -> Workload:
    """The `--model builtin` factory: the preset's transformer (with the shape overrides) and
    its token batches (`--inputs`, `runners/inputs.py`); the default causal-LM loss."""
    config = model_config(cfg["preset"], **cfg["overrides"])
    inputs = parse_inputs(cfg["inputs"], config.seq)
    model = Transformer(config)

    def batch_of(step: int, rank: int, device):
        tokens, targets, _, real = batch(config, inputs, cfg["seed"], rank, step, device)
        return tokens, targets, real
    return Workload(model, list(model.blocks), batch_of, info={"preset": cfg["preset"], **config.as_dict()})
