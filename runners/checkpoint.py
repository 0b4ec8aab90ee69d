"""Checkpoint saves during the timed steps (`--checkpoint sync|async`), and what they cost.

A save writes the model and optimizer state with torch.distributed.checkpoint (DCP) to
`OUT/<variant>/ckpt/step<N>`, the state taken with `get_state_dict`, which handles DDP, FSDP1
and FSDP2 alike. Per save:
- `stall_ms`: the time the training loop was blocked — all of `dcp.save` (sync), or until
  `dcp.async_save` returned (async: the state is staged, the writing goes on in a thread),
  including any wait for the previous asynchronous save to finish writing first;
- `total_ms`: from the same start until the save was complete (async: until its future
  resolved, waited for at the next save or after the last timed step);
- `bytes`: the size of one save (the last), all ranks' files together.
Asynchronous saves talk over a gloo process group of their own: their background thread's
collectives must not interleave with training's on the default group.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

MODES = ("sync", "async")


class Checkpointer:
    def __init__(self, mode: str, every: int, folder: Path):
        import torch.distributed as dist

        self.mode, self.every, self.folder = mode, every, folder
        self.group = dist.new_group(backend="gloo") if mode == "async" else None
        self.stall_ms: list[float] = []
        self.total_ms: list[float] = []
        self.saved: list[Path] = []
        self.pending = None  # (future, started)

    def due(self, step: int) -> bool:
        """Saves happen after timed steps every, 2·every, …"""
        return (step + 1) % self.every == 0

    def save(self, model, optimizer, step: int) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        started = time.perf_counter()
        self.finish()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        target = self.folder / f"step{step}"
        state = {"model": model_state, "optim": optimizer_state}
        if self.mode == "sync":
            dcp.save(state, checkpoint_id=str(target))
            elapsed = (time.perf_counter() - started) * 1000
            self.stall_ms.append(elapsed)
            self.total_ms.append(elapsed)
        else:
            future = dcp.async_save(state, checkpoint_id=str(target), process_group=self.group)
            self.stall_ms.append((time.perf_counter() - started) * 1000)
            self.pending = (future, started)
        self.saved.append(target)

    def finish(self) -> None:
        """Wait for an asynchronous save still writing."""
        if self.pending:
            future, started = self.pending
            future.result()
            self.total_ms.append((time.perf_counter() - started) * 1000)
            self.pending = None

    def record(self) -> dict:
        """The manifest's `checkpoint` entry (after `finish`)."""
        last = self.saved[-1] if self.saved else None
        written = sum(f.stat().st_size for f in last.rglob("*") if f.is_file()) if last and last.exists() else 0
        return {"mode": self.mode, "every": self.every, "stall_ms": self.stall_ms, "total_ms": self.total_ms,
                "bytes": written}

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
