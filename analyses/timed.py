"""The timed steps of a `tracekit profile` manifest: each variant's step and phase times per
repeat, and the comparison of two variants over them (docs/metrics.md, "Noise and verdicts").

- `repeat_series`: per repeat, the training steps and phase times (the clock both sides share);
- `compare`: B − A with its interval and verdict, over one run's steps or across repeats.
"""

from __future__ import annotations

import numpy as np

from tracekit.core.timing import training_steps
from tracekit.analyses.noise import delta_ci, pooled, repeats_delta_ci, unpaired_repeats_ci, verdict


PHASE_ORDER = ("forward", "backward", "optimizer")


def kept(r: dict, values: list[float]) -> list[float]:
    """`values` (one per timed step) of the steps that did not save a checkpoint."""
    saved = set(r.get("saved_steps", []))
    return [v for i, v in enumerate(values) if i not in saved]


def pooled_steps(entry: dict) -> np.ndarray:
    return pooled([training_steps(r) for r in entry["ranks"]])


def phase_clock(ranks: list[dict]) -> str | None:
    """`device` where the phase timers have CUDA events, else `host`; None without timers."""
    timers = ranks[0].get("phase_ms") if ranks else None
    if not timers:
        return None
    return "device" if timers.get("device") else "host"


def repeat_series(entry: dict) -> list[dict[str, np.ndarray]]:
    """Per repeat that ran: `step` (the training steps pooled over ranks) and, where the phase
    timers ran, each phase's time in those steps pooled over ranks (the slowest rank's per
    step) — device time on CUDA, host time otherwise (`runners/clock.py`)."""
    out = []
    for record in [x for x in entry.get("repeats") or [entry] if x.get("status", "ok") == "ok"]:
        ranks = record["ranks"]
        series = {"step": pooled([training_steps(r) for r in ranks])}
        clock = phase_clock(ranks)
        if clock:
            for phase in ranks[0]["phase_ms"][clock]:
                if phase not in ("step", "checkpoint"):
                    series[phase] = pooled([kept(r, r["phase_ms"][clock][phase]) for r in ranks])
        out.append(series)
    return out


def compare(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]], key: str) -> dict:
    """B − A of `key` (`step` or a phase), ms: both medians, Δ with its 95 % interval and the
    verdict — across repeats (paired by repeat) when both sides have the same number, two or
    more; unpaired across repeats (Welch) when both have two or more but not as many; else over
    the steps, each side's repeats pooled (docs/metrics.md, "Noise and verdicts")."""
    a, b = [x[key] for x in a if key in x], [y[key] for y in b if key in y]
    if not a or not b:
        return {}
    a_all, b_all = np.concatenate(a), np.concatenate(b)
    n_steps, repeats = min(len(x) for x in a + b), min(len(a), len(b))
    if len(a) == len(b) >= 2:  # paired by repeat
        d, lo, hi = repeats_delta_ci([float(np.median(y) - np.median(x)) for x, y in zip(a, b)])
    elif repeats >= 2:  # two launches with different numbers of repeats: nothing pairs
        d, lo, hi = unpaired_repeats_ci([float(np.median(x)) for x in a], [float(np.median(y)) for y in b])
    else:  # one run on a side: the steps, each side's repeats pooled
        (d, lo, hi, _), repeats = delta_ci(a_all, b_all), 1
    d, lo, hi = float(d), float(lo), float(hi)
    return {"a_ms": round(float(np.median(a_all)), 3), "b_ms": round(float(np.median(b_all)), 3),
            "d_ms": round(d, 3), "d_ms_ci": [round(lo, 3), round(hi, 3)], "repeats": repeats,
            "verdict": verdict(lo, hi, n_steps, repeats)}


def recorded_phases(entry: dict) -> dict[str, float]:
    """Per phase, the median over the recorded steps (the ones `diff` attributes) of its time
    pooled over ranks, ms; `step` their span."""
    ranks = [r for r in entry.get("ranks", []) if r.get("recorded")]
    clock = phase_clock([r["recorded"][0] for r in ranks]) if ranks else None
    if not clock:
        return {}
    phases = ranks[0]["recorded"][0]["phase_ms"][clock]
    return {p: round(float(np.median(pooled([r["recorded"][0]["phase_ms"][clock][p] for r in ranks]))), 3)
            for p in phases}
