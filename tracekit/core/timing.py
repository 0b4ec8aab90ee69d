"""A run's step time, defined once (docs/metrics.md, "Step time") for the runner's lines, the
manifest and the report: a step takes as long as its slowest rank, and the run's step time is
the median of that over its timed steps (steps that saved a checkpoint left out)."""

from __future__ import annotations

import statistics


def training_steps(rank: dict) -> list[float]:
    """One rank's timed steps (ms) that did not save a checkpoint; `rank` is a rank's
    measurements in a manifest (`step_ms` {"all": …}) or a repeat's record of them (`step_ms` a list)."""
    steps = rank["step_ms"]["all"] if isinstance(rank["step_ms"], dict) else rank["step_ms"]
    ckpt = rank.get("checkpoint")
    if ckpt and "saved_steps" not in rank:
        return ckpt["step_ms_without_save"]
    saved = set(rank.get("saved_steps", []))
    return [t for i, t in enumerate(steps) if i not in saved]


def slowest(per_rank: list[list[float]]) -> list[float]:
    """Per step i (up to the shortest rank's count), its time on the slowest rank, ms."""
    n = min(len(s) for s in per_rank)
    return [max(s[i] for s in per_rank) for i in range(n)]


def step_time(repeats: list[list[dict]]) -> float:
    """The step time (ms) of a variant's repeats, each the list of its ranks' measurements:
    the median over every repeat's timed steps of `slowest`."""
    return statistics.median([t for ranks in repeats for t in slowest([training_steps(r) for r in ranks])])
