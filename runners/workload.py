"""What the runner trains: the contract a model factory fulfils (`--model`, docs/profile.md).

A factory is a callable without arguments that returns a `Workload`; `runners/factories.py`
chooses one from `--model` and checks what it returns. Every rank calls the factory after
seeding torch with `--seed`, so every variant starts from the same weights; the batch function
must likewise depend only on (step, rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

IGNORE_INDEX = -100  # targets the default loss leaves out (padding, masked prompts)


def causal_lm_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """The default loss: mean cross-entropy of the logits (`outputs`, or `outputs.logits` as
    Hugging Face models return them) against next-token `targets`, in fp32, targets equal to
    `IGNORE_INDEX` left out."""
    logits = getattr(outputs, "logits", outputs)
    return nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


def fused_adamw(params) -> torch.optim.Optimizer:
    """The default optimizer: AdamW, lr 1e-4, fused (one kernel per step for all parameters,
    torchtitan's default): the foreach form issues a dozen list ops per step, which on FSDP2's
    DTensor parameters cost tens of ms of host time a training job would not spend."""
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


@dataclass
class Workload:
    """A model and what it takes to train it.

    - `model`: the whole model (on the CPU or the meta device; the runner moves it);
    - `blocks`: its repeated blocks, each wrapped as one unit (FSDP1 unit, FSDP2
      `fully_shard`, per-block `torch.compile`, float8 conversion of their `nn.Linear`s);
      modules of `model`, at least one;
    - `batch(step, rank, device)`: the batch of training step `step` (0, 1, …) on `rank`,
      `(inputs, targets)` or `(inputs, targets, real_tokens)` — real tokens (what the loss
      counts, no padding) make `tokens_per_s`. `inputs` is passed to the model as
      `model(inputs)`, `model(*inputs)` for a tuple, `model(**inputs)` for a dict;
    - `loss(outputs, targets)`: a scalar tensor (default `causal_lm_loss`);
    - `optimizer(params)`: the optimizer over the wrapped model's parameters (default
      `fused_adamw`);
    - `info`: what the manifest records about the model (`model.architecture`, …).
    """

    model: nn.Module
    blocks: list[nn.Module]
    batch: Callable[[int, int, torch.device], tuple]
    loss: Callable[[Any, torch.Tensor], torch.Tensor] = causal_lm_loss
    optimizer: Callable[[Any], torch.optim.Optimizer] = fused_adamw
    info: dict = field(default_factory=dict)


class WorkloadError(ValueError):
    """A `--model` that cannot be used (one line, naming the problem)."""
