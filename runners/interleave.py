"""The interleaved comparison (docs/profile.md, "Comparing variants"): every variant built side
by side in one process on this rank, each with its own model, wrapping, optimizer and compiled
blocks, warmed up, then timed in `rounds` rounds of blocks of `block_steps` steps in a mirrored
order — A B C C B A, then C B A A B C, … — so every variant runs twice a round, at both ends of
it, and drift within a round and a process's own speed reach every variant alike. Every rank
runs the same rotation in lockstep (the collectives of a block are that variant's on every
rank), so it works unchanged with NCCL at any world size.

The recorded steps come from the same rotation: in each recorded round every variant runs a
control block and a recorded block (`worker.Recording`), in the round's order, and after the
last round a control block each; then each variant's `full` naming step.

The memory step (`--memory`) of each variant comes last, each variant built again alone: the
others' state would otherwise be in its record. A variant's timed memory figures: the peak
above what every variant held when its blocks began, plus what it holds itself between steps
(`Trainee.resident_bytes`): the other variants' parameters and optimizer state are on the
device too, and are not its.
"""

from __future__ import annotations

import statistics

import torch

from .clock import PHASES, columns
from .memory_record import memory_step
from .variants import mirrored
from .worker import Progress, Recording, Trainee, release_memory, synchronize


def block_peak(device: torch.device):
    """A function giving the peak allocated (bytes) since now above what is allocated now: the
    device's peak counter restarted here; one giving None off CUDA."""
    if device.type != "cuda":
        return lambda: None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    return lambda: torch.cuda.max_memory_allocated(device) - base


def run_interleaved(variants: list[str], cfg: dict, rank: int, device: torch.device, out, record: bool,
                    say=None, built=lambda: None) -> dict[str, dict]:
    """Measure `variants` side by side on this rank (module docstring); returns each variant's
    measurements (`Trainee.figures`, with `rounds`: per timed round its steps and phases), in
    the order given. `built()` is called once the first model is built (`Built.here`)."""
    release_memory(device)
    progress = Progress(say)
    trainees = {}
    for i, variant in enumerate(variants):
        trainees[variant] = Trainee(variant, cfg, rank, device, built=built if i == 0 else lambda: None)
        trainees[variant].progress = progress
    for trainee in trainees.values():
        trainee.warm_up()
    k, n = cfg["block_steps"], cfg["rounds"]
    timed = {v: {"times": [], "readings": [], "wall": 0.0, "saved": [], "recompiled": [], "rounds": [], "peak": None}
             for v in trainees}
    for r in range(n):
        this_round = {v: {"round": r, "positions": [], "times": [], "readings": []} for v in trainees}
        for position, variant in enumerate(mirrored(list(trainees), r)):
            trainee, got, here = trainees[variant], timed[variant], this_round[variant]
            peak = block_peak(device)
            times, readings, wall = trainee.run_steps(
                [trainee.timed_work(got["recompiled"], got["saved"]) for _ in range(k)], f"round {r + 1}/{n}: step")
            above = peak()
            if above is not None:
                got["peak"] = max(got["peak"] or 0, above)
            got["times"] += times
            got["readings"] += readings
            got["wall"] += wall
            here["positions"].append(position)
            here["times"] += times
            here["readings"] += readings
        for variant, here in this_round.items():
            timed[variant]["rounds"].append({"round": r, "positions": here["positions"], "step_ms": here["times"],
                                             "phase_ms": columns(here["readings"], PHASES[:3])})
    results = {}
    for variant, trainee in trainees.items():
        got = timed[variant]
        result = trainee.figures(got["times"], got["readings"], got["wall"], PHASES[:3], got["saved"],
                                 got["recompiled"])
        result["rounds"] = got["rounds"]
        result["peak_allocated_bytes"] = None if got["peak"] is None else trainee.resident_bytes() + got["peak"]
        result["peak_reserved_bytes"] = None  # the allocator's reserve is shared by every variant here
        results[variant] = result
    if record and cfg["profile_steps"]:
        progress.now(f"recording {cfg['profile_steps']} step(s) of each variant")
        for variant, figures in recorded_rounds(trainees, cfg, device, out, rank).items():
            results[variant].update(figures)
            results[variant]["recorded_to_timed"] = round(
                statistics.median(figures["profiled_step_ms"]) / statistics.median(results[variant]["step_ms"]["all"]), 3)
    if record and cfg.get("memory"):
        trainees.clear()
        for variant in variants:
            results[variant].update(memory_alone(variant, cfg, rank, device, out, progress))
    return results


def memory_alone(variant: str, cfg: dict, rank: int, device: torch.device, out, progress) -> dict:
    """The memory step (`runners/memory_record.py`) of `variant` built again alone, once the
    side-by-side variants are gone, and warmed up: what it allocates is its own, not the other
    variants' resident state."""
    release_memory(device)
    trainee = Trainee(variant, cfg, rank, device)
    trainee.progress = progress
    trainee.warm_up()
    return memory_step(trainee.step, trainee.optimizer, device, out / variant, rank, variant)


def recorded_rounds(trainees: dict[str, Trainee], cfg: dict, device: torch.device, out, rank: int) -> dict[str, dict]:
    """Every variant's `Recording`, its blocks in the rotation: per recorded round, in the
    round's order (the variants forward in even rounds, backward in odd ones), each variant's
    control block then its recorded block; after the last round a control block each. Round i
    of every variant's trace was thus taken under the same conditions."""
    recordings = {v: Recording(t.step, t.bookmark(), cfg, device, out, v, rank) for v, t in trainees.items()}
    names = list(recordings)
    for r in range(max(rec.rounds for rec in recordings.values())):
        for variant in (names if r % 2 == 0 else names[::-1]):
            recordings[variant].control()
            recordings[variant].record()
    for recording in recordings.values():
        recording.control()
    return {v: recording.finish() for v, recording in recordings.items()}

