"""An oracle for naming idle time by its host cause: the same residual MLP stack twice, one of
them spending a known host time before one block's forward.

    tracekit profile --model examples/host_delay.py:plain   --variants fsdp2 --out OUT/A
    tracekit profile --model examples/host_delay.py:delayed --variants fsdp2 --out OUT/B
    tracekit diff OUT/A/fsdp2 OUT/B/fsdp2

`delayed` busy-waits `DELAY_MS` (no device work, no allocation) inside the `record_function`
region `REGION` at the start of block `BLOCK`'s forward, every forward; `plain` is identical
without it (same weights from `--seed`, same batches). The stack is small, so the host paces
the device: the device idles for the wait, and `diff A B` should name `host: REGION` as the
largest idle item, its Δ near `DELAY_MS` per step (docs/runs/host_delay.sh). The wait may be
set with the environment variable `TRACEKIT_EXAMPLE_DELAY_MS` (every rank reads it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

from tracekit.runners.factories import import_file
from tracekit.runners.workload import Workload

mlp = import_file(str(Path(__file__).with_name("mlp_stack.py")))  # its blocks and batches

DELAY_MS = float(os.environ.get("TRACEKIT_EXAMPLE_DELAY_MS", "5"))
REGION = "example::host_delay"
BLOCK = 2  # the block whose forward waits


def busy_wait(ms: float) -> None:
    """Spins on the host clock for `ms` milliseconds: host time, no device work."""
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        pass


class Stack(nn.Module):
    """`mlp_stack.MLPStack`, its block `BLOCK` waiting `delay_ms` first where it is > 0."""

    def __init__(self, delay_ms: float):
        super().__init__()
        self.embed = nn.Linear(mlp.FEATURES, mlp.WIDTH)
        self.blocks = nn.ModuleList(mlp.Block(mlp.WIDTH) for _ in range(mlp.DEPTH))
        self.head = nn.Linear(mlp.WIDTH, mlp.CLASSES)
        self.delay_ms = delay_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for i, block in enumerate(self.blocks):
            if i == BLOCK and self.delay_ms > 0:
                with torch.profiler.record_function(REGION):
                    busy_wait(self.delay_ms)
            x = block(x)
        return self.head(x)


def workload(delay_ms: float) -> Workload:
    model = Stack(delay_ms)
    return Workload(model, list(model.blocks), mlp.batch, loss=nn.functional.cross_entropy,
                    info={"architecture": "MLPStack", "depth": mlp.DEPTH, "width": mlp.WIDTH, "host_delay_ms": delay_ms,
                          "host_delay_region": REGION, "host_delay_block": BLOCK})


def plain() -> Workload:
    """A: no wait."""
    return workload(0.0)


def delayed() -> Workload:
    """B: `DELAY_MS` of host time in `REGION` before block `BLOCK`'s forward."""
    return workload(DELAY_MS)
