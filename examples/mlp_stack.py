"""A model of one's own for `tracekit profile`: a stack of residual MLP blocks classifying
random vectors.

    tracekit profile --model examples/mlp_stack.py:mlp_stack --variants ddp,fsdp1,fsdp2

The factory returns a `Workload` (runners/workload.py, docs/profile.md): the model, its
repeated blocks (each becomes one FSDP unit, one `fully_shard`, one compiled region), the
batch of each (step, rank) and the loss. The runner seeds torch with `--seed` before calling
it, so every variant starts from the same weights; the batches depend only on (step, rank).
"""

import torch
from torch import nn

from tracekit.runners.workload import Workload

FEATURES, WIDTH, DEPTH, CLASSES, BATCH = 32, 128, 4, 10, 16


class Block(nn.Module):
    """LayerNorm → Linear (4× wider) → GELU → Linear, residual."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class MLPStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`BATCH` random vectors and class labels, the same for a (step, rank) in every variant."""
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    x, y = torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def mlp_stack() -> Workload:
    model = MLPStack()
    return Workload(model, list(model.blocks), batch, loss=nn.functional.cross_entropy,
                    info={"architecture": "MLPStack", "depth": DEPTH, "width": WIDTH})
