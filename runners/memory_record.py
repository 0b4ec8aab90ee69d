"""The memory step: one more training step per variant, after the timed and recorded ones (whose
figures it cannot touch), with every allocation recorded (docs/profile.md, "The memory step").

- On CUDA: the caching allocator's history (`torch.cuda.memory._record_memory_history`,
  Python stacks), turned on for this step only, read back with `_snapshot()`. Its cost — a
  Python stack walk per alloc and free, about 2 µs each by torch's own account, and the
  entries' memory (a few KB each, at most `MAX_ENTRIES`) — lands in this step alone, which
  is timed by nothing; the allocator's own peak over it (`max_memory_allocated`, reset
  before it) is kept to check the record against. The phases are marked in the history
  itself: at each of the step's marks a tiny allocation (`phase_mark`) is made and freed.
- Off CUDA: the same step under torch.profiler with `profile_memory=True`, `record_shapes`
  and `with_stack` (`[memory]` events, each in its op and Python frames), its trace kept as
  `memory/rank<r>.pt.trace.json.gz`; the phases are the runner's `tracekit#<phase>`
  annotations.

Either way the model's state is tagged: at the optimizer step's start (a step pre-hook) the
storages of every parameter, its gradient and its optimizer state are taken by address, and
the allocation at each address live then is tagged `param`, `grad` or `optimizer`. The record
(`tracekit.core.memory_files`) goes to `memory/rank<r>.json.gz` beside the variant's traces.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import torch

from .clock import PHASES, PhaseClock

MAX_ENTRIES = 1_000_000  # allocator history entries kept (a step of large/16 makes tens of thousands)
RECORD_NAME = "memory/rank{rank}.json.gz"
TRACE_NAME = "memory/rank{rank}.pt.trace.json.gz"


def memory_step(step, optimizer, device: torch.device, folder: Path, rank: int, variant: str) -> dict:
    """Run `step(clock)` once with its allocations recorded into `folder` (the variant's
    folder); the manifest's figures: where the record is, the allocator's peak over the step
    (CUDA), the bytes of state tagged and what the recorded step took with its recording (ms,
    wall clock, drained at its end: its cost against `step_ms`) — or `memory_error`, one line, where the recording
    could not be read back (the step itself ran as any other: an error in it is the variant's)."""
    from tracekit.core import memory_files  # polars: imported in the worker, never in the server it forks from

    state = State(optimizer)
    began = time.perf_counter()
    try:
        if device.type == "cuda":
            snapshot, peak = on_cuda(step, device)
        else:
            doc = on_cpu(step, device, folder / TRACE_NAME.format(rank=rank))
    finally:
        state.remove()
    wall_ms = round((time.perf_counter() - began) * 1000, 3)
    try:  # reading back what was recorded: a mistake here costs the record, not the variant's figures
        if device.type == "cuda":
            record, marks = memory_files.from_snapshot(snapshot, "snapshot", device.index or 0)
            record = memory_files.with_phases(record, marks, PHASES[:3])
            record.allocator_peak_bytes = peak
        else:
            record = memory_files.from_kineto(doc, folder / TRACE_NAME.format(rank=rank))
        backward = record.phases.filter(record.phases["phase"] == "backward")["end_ns"]
        record = memory_files.with_state(record, state.taken, backward[0] if backward.len() else record.end_ns)
        record.rank, record.variant = rank, variant
        memory_files.write_record(record, folder / RECORD_NAME.format(rank=rank))
    except Exception as e:
        return {"memory_error": f"{type(e).__name__}: {e}".splitlines()[0], "memory_step_wall_ms": wall_ms}
    tagged = {tag: sum(size for _, size, t in state.taken if t == tag) for tag in ("param", "grad", "optimizer")}
    return {"memory_record": str(Path(folder.name) / RECORD_NAME.format(rank=rank)),
            "memory_step_peak_allocated_bytes": record.allocator_peak_bytes, "memory_state_bytes": tagged,
            "memory_step_wall_ms": wall_ms}


def phase_mark(device: torch.device) -> None:
    """A marker in the allocator's history: a one-byte allocation, freed at once (its frame's
    name, `memory_files.MARK_FUNCTION`, tells the reader)."""
    torch.empty(1, dtype=torch.uint8, device=device)


def on_cuda(step, device: torch.device) -> tuple[dict, int]:
    """The step with the allocator's history on: (the allocator's snapshot, its peak over the step)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python", device=device)
    try:
        step(PhaseClock(device, lambda: phase_mark(device)))
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot(device)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)
    return snapshot, torch.cuda.max_memory_allocated(device)


def on_cpu(step, device: torch.device, trace: Path) -> dict:
    """The step under torch.profiler with its memory events; the trace (kept at `trace`)."""
    from torch.profiler import ProfilerActivity, profile

    trace.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace.with_name(f".{trace.name}.{os.getpid()}.tmp.json")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step(PhaseClock(device))
    prof.export_chrome_trace(str(tmp))
    raw = tmp.read_bytes()
    trace.write_bytes(gzip.compress(raw, compresslevel=6))  # the exported bytes, compressed at once
    tmp.unlink()
    return json.loads(raw)


class State:
    """The storages of the optimizer's parameters, their gradients and its state, taken at each
    optimizer step's start (a step pre-hook on the torch optimizer inside any wrapper):
    `taken`, [(address, bytes, tag)], each address once."""

    def __init__(self, optimizer):
        inner = optimizer
        while not hasattr(inner, "register_step_pre_hook") and hasattr(inner, "optimizer"):
            inner = inner.optimizer
        self.taken: list[tuple[int, int, str]] = []
        self.handle = inner.register_step_pre_hook(self.take)

    def take(self, optimizer, args, kwargs) -> None:
        seen, taken = set(), []

        def add(tensor, tag):
            if tensor is None:
                return
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            storage = local.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                taken.append((storage.data_ptr(), storage.nbytes(), tag))
        for group in optimizer.param_groups:
            for p in group["params"]:
                add(p, "param")
                add(p.grad, "grad")
                for value in optimizer.state.get(p, {}).values():
                    if isinstance(value, torch.Tensor):
                        add(value, "optimizer")
        self.taken = taken

    def remove(self) -> None:
        self.handle.remove()
