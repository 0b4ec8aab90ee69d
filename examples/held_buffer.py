"""An injected allocation, for `tracekit memory` and `diff`: two workloads alike in every
allocation but one — `held` keeps one extra buffer of `HELD_BYTES`, made in forward by the
module `held_buffer` and saved for backward, alive until backward reaches it (the last
node before the input's); `plain` does not.

    tracekit profile --model examples/held_buffer.py:plain --variants ddp --out A
    tracekit profile --model examples/held_buffer.py:held --variants ddp --out B
    tracekit diff A/ddp B/ddp     # the peak is HELD_BYTES higher: activations, held_buffer.py

The activations of the first backward ops dwarf the model's state, so each side's peak comes
at the start of backward, inside the buffer's life: B's peak is A's plus the buffer.
"""

from pathlib import Path

import torch
from torch import nn

from tracekit.runners.factories import import_file
from tracekit.runners.workload import Workload

mlp = import_file(str(Path(__file__).with_name("mlp_stack.py")))  # its residual MLP block

FEATURES, WIDTH, DEPTH, CLASSES, BATCH = 64, 128, 4, 10, 512
HELD_BYTES = 8 * 2**20  # fp32 elements: HELD_BYTES / 4; a multiple of the CUDA allocator's 2 MiB rounding


class Carry(torch.autograd.Function):
    """`x` passed on, `held` saved for backward (freed when backward has run this node)."""

    @staticmethod
    def forward(ctx, x, held):
        ctx.save_for_backward(held)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class HeldBuffer(nn.Module):
    """Makes a buffer of `HELD_BYTES` each forward and keeps it alive through backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        held = torch.zeros(HELD_BYTES // 4, device=x.device)
        return Carry.apply(x, held)


class Model(nn.Module):
    def __init__(self, hold: bool):
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.held_buffer = HeldBuffer() if hold else nn.Identity()
        self.blocks = nn.ModuleList(mlp.Block(WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.held_buffer(self.embed(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    x, y = torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def workload(hold: bool) -> Workload:
    model = Model(hold)
    return Workload(model, list(model.blocks), batch, loss=nn.functional.cross_entropy,
                    info={"architecture": "HeldBuffer" if hold else "Plain", "held_bytes": HELD_BYTES if hold else 0})


def plain() -> Workload:
    return workload(False)


def held() -> Workload:
    return workload(True)
