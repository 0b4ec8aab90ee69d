"""Phase timers: where a training step's time goes, measured in every step the runner makes.

A step is marked at its start and at the end of each phase, in program order: `forward`
(fetching the batch, the model's forward and the loss), `backward` (the backward pass, with the gradient
reduction it launches), `optimizer` (optimizer step, zero_grad and per-step technique work
such as float8 scale updates), and `checkpoint` (a save, in steps that save). At each mark:
- the host clock (`time.perf_counter_ns`): a phase's **host time** is the time from the
  previous mark to its own on the host — how long the Python program spent issuing it;
- on CUDA, an event recorded on the current stream: a phase's **device time** is
  `elapsed_time` from the previous mark's event to its own — from the moment the stream
  reached the phase's start to the moment it finished everything queued before the phase's
  end, waiting for the host included. Work on other streams (NCCL) counts where the current
  stream waits for it.
Reading the events needs them complete: `ms` is called after the step was synchronised.
Each phase also runs inside a `tracekit#<phase>` annotation, so the trace knows the phases
even when it records no CPU ops (`analyses/phases.py`); a recording with no CPU side at all
gets them from `spans` instead (the wall clock, `time.time_ns`, is read at each mark too:
the clock a Kineto trace's timestamps are in).
"""

from __future__ import annotations

import contextlib
import time

import torch

PHASES = ("forward", "backward", "optimizer", "checkpoint")
ANNOTATION = "tracekit#{}"


class PhaseClock:
    """The marks of one step: (phase or None for the start, host ns, CUDA event or None, wall ns)."""

    def __init__(self, device: torch.device, on_mark=None):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str | None, int, object, int]] = []
        self.on_mark = on_mark  # called at each mark, after its event (a capture's stream marker)

    def _mark(self, phase: str | None) -> None:
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        if self.on_mark is not None:
            self.on_mark()
        self.marks.append((phase, time.perf_counter_ns(), event, time.time_ns()))

    def start(self) -> None:
        self._mark(None)

    @contextlib.contextmanager
    def phase(self, name: str):
        with torch.profiler.record_function(ANNOTATION.format(name)):
            yield
        self._mark(name)

    def ms(self) -> dict[str, dict[str, float] | None]:
        """{"host": {phase: ms}, "device": {phase: ms} or None off CUDA}; the step's span is
        `"step"` in each (first mark to last)."""
        host, device = {}, {} if self.cuda else None
        for (_, h0, e0, _), (phase, h1, e1, _) in zip(self.marks, self.marks[1:]):
            host[phase] = host.get(phase, 0.0) + (h1 - h0) / 1e6
            if device is not None:
                device[phase] = device.get(phase, 0.0) + e0.elapsed_time(e1)
        host["step"] = (self.marks[-1][1] - self.marks[0][1]) / 1e6
        if device is not None:
            device["step"] = self.marks[0][2].elapsed_time(self.marks[-1][2])
        return {"host": host, "device": device}

    def spans(self) -> list[tuple[str, int, int]]:
        """Each phase as (`tracekit#<phase>`, start, end) on the wall clock (ns since the epoch),
        from the previous mark to its own: the host time the phase's calls were issued in."""
        return [(ANNOTATION.format(phase), w0, w1)
                for (_, _, _, w0), (phase, _, _, w1) in zip(self.marks, self.marks[1:])]

    def wall_marks(self) -> list[tuple[str | None, int]]:
        """Each mark as (phase, or None for the start; wall clock ns)."""
        return [(phase, wall) for phase, _, _, wall in self.marks]

    def span(self) -> tuple[int, int]:
        """The step on the wall clock (ns since the epoch): first mark to last."""
        return self.marks[0][3], self.marks[-1][3]


def columns(readings: list[dict], phases: tuple[str, ...]) -> dict:
    """Per-step phase times (`PhaseClock.ms()` of each step) as lists aligned with the steps:
    {"host": {phase: [ms, …]}, "device": {…} or None}; a phase a step did not have (a
    checkpoint) counts 0."""
    out = {}
    for clock in ("host", "device"):
        if any(r[clock] is None for r in readings):
            out[clock] = None
            continue
        out[clock] = {p: [round(r[clock].get(p, 0.0), 4) for r in readings] for p in (*phases, "step")}
    return out
