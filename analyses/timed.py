"""The timed steps of a `tracekit profile` manifest: each variant's step and phase times per
repeat or per interleaved round, and the comparison of two variants over them
(docs/metrics.md, "Noise and verdicts").

- `comparison`: the design the manifest ran (`interleaved` or `sequential`);
- `repeat_series`: per repeat, the training steps and phase times (the clock both sides share);
- `round_means`: per interleaved round, the mean step and phase times;
- `timed`: what a variant's timed steps give a comparison; `compare`: B − A with its interval
  and verdict — over rounds where both come from one interleaved launch (`compare_rounds`),
  else across repeats (`compare_repeats`).
"""

from __future__ import annotations

import numpy as np

from tracekit.core.timing import training_steps
from tracekit.analyses.noise import (delta_ci, outlying_rounds, pooled, repeats_delta_ci, rounds_delta_ci,
                                     unpaired_repeats_ci, verdict)


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


def comparison(manifest: dict) -> dict:
    """The manifest's `comparison` (docs/json.md): the design, K, rounds, order and control;
    manifests without one ran sequentially."""
    found = manifest.get("comparison") or {}
    return {"design": "sequential", "note": "", "block_steps": None, "rounds": None, "order": None, "control": None,
            **found}


def round_means(entry: dict) -> dict[int, dict[str, float]]:
    """Interleaved round → per key (`step` and each phase of the timers' clock), the mean over
    the variant's steps in that round of the step pooled over ranks (the slowest rank's, per
    step). A round holds the variant's two blocks, its steps in the order they ran; empty outside
    an interleaved run."""
    ranks = [r for r in entry.get("ranks", []) if r.get("rounds")]
    if not ranks:
        return {}
    clock = phase_clock(ranks[0]["rounds"])
    phases = [p for p in (ranks[0]["rounds"][0]["phase_ms"][clock] if clock else ()) if p not in ("step", "checkpoint")]

    def mean(blocks: list[list[dict]], values) -> float:
        """The mean over the round's steps of `values(block)` pooled over ranks."""
        return float(np.mean(pooled([[t for b in bs for t in values(b)] for bs in blocks])))

    out = {}
    for number in sorted({b["round"] for b in ranks[0]["rounds"]}):
        blocks = [[b for b in r["rounds"] if b["round"] == number] for r in ranks]
        out[number] = {"step": mean(blocks, lambda b: b["step_ms"]),
                       **{p: mean(blocks, lambda b, p=p: b["phase_ms"][clock][p]) for p in phases}}
    return out


def timed(manifest: dict, variant: str) -> dict:
    """What `variant`'s timed steps give a comparison: `repeats` (`repeat_series`), `rounds`
    (`round_means`; empty in a sequential run), `launch` (the run's id: rounds pair only
    within one launch) and `launch_rounds`, the other variants' rounds of the launch."""
    entry = manifest["variants"][variant]
    return {"variant": variant, "repeats": repeat_series(entry), "rounds": round_means(entry),
            "launch": launch(manifest), "launch_rounds": {v: round_means(e) for v, e in manifest["variants"].items()
                                                          if v != variant and e.get("status") == "ok"}}


def launch(manifest: dict):
    """What names the launch a manifest records: its run id (else the manifest object itself)."""
    return manifest.get("config", {}).get("run_id") or id(manifest)


def compare(a: dict, b: dict, key: str) -> dict:
    """B − A of `key` (`step` or a phase) of two `timed` sides: over rounds where both come
    from one interleaved launch, else across repeats (docs/metrics.md, "Noise and verdicts")."""
    if a["rounds"] and b["rounds"] and a["launch"] == b["launch"]:
        peers = [rounds for v, rounds in a["launch_rounds"].items() if v != b["variant"] and rounds]
        return compare_rounds(a["rounds"], b["rounds"], key, peers)
    return compare_repeats(a["repeats"], b["repeats"], key)


def compare_rounds(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], key: str,
                   peers: list[dict[int, dict[str, float]]] = ()) -> dict:
    """B − A over the interleaved rounds both have, ms: Δ_r = B's mean − A's in round r; `a_ms`
    and `b_ms` the means over rounds (so d_ms = b_ms − a_ms), the mean Δ with its interval
    (`noise.rounds_delta_ci`, its ρ pooled with each of `peers` − A: the launch's other
    variants), the verdict, and `outlying_rounds` (1-based; `noise.outlying_rounds`)."""
    shared = [r for r in sorted(a) if r in b and key in a[r] and key in b[r]]
    if not shared:
        return {}
    deltas = [b[r][key] - a[r][key] for r in shared]
    others = [np.asarray([p[r][key] - a[r][key] for r in shared]) for p in peers
              if all(r in p and key in p[r] for r in shared)]
    d, lo, hi = (float(x) for x in rounds_delta_ci(np.asarray(deltas), others))
    return {"a_ms": round(float(np.mean([a[r][key] for r in shared])), 3),
            "b_ms": round(float(np.mean([b[r][key] for r in shared])), 3),
            "d_ms": round(d, 3), "d_ms_ci": [round(lo, 3), round(hi, 3)], "repeats": 1, "rounds": len(shared),
            "verdict": verdict(lo, hi, 0, rounds=len(shared)),
            "outlying_rounds": [shared[i] + 1 for i in outlying_rounds(deltas)]}


def compare_repeats(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]], key: str) -> dict:
    """B − A of `key` (`step` or a phase), ms: both medians, Δ with its 95 % interval and the
    verdict — across repeats (paired by repeat) when both sides have the same number, two or
    more; unpaired across repeats (Welch) when both have two or more but not as many; else over
    the steps, each side's repeats pooled, with no verdict (one sequential repeat cannot give
    one: docs/metrics.md, "Noise and verdicts")."""
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
            "d_ms": round(d, 3), "d_ms_ci": [round(lo, 3), round(hi, 3)], "repeats": repeats, "rounds": None,
            "verdict": verdict(lo, hi, n_steps, repeats)}


def steps_per_round(a: dict | None, a_variant: str | None, b: dict | None, b_variant: str | None) -> int | None:
    """The recorded steps a round where A and B are two variants of one interleaved launch
    (`recorded[0]["steps_per_round"]`: step n of each was taken in round (n − 1) // s, in the
    same rotation); None otherwise (two launches, a sequential one, traces without a manifest):
    `diff` then pairs the steps by number."""
    if not a or not b or a_variant not in a["variants"] or b_variant not in b["variants"] \
            or comparison(a)["design"] != "interleaved" or launch(a) != launch(b):
        return None
    ranks = a["variants"][a_variant].get("ranks") or [{}]
    return ((ranks[0].get("recorded") or [{}])[0]).get("steps_per_round")


def recorded_phases(entry: dict) -> dict[str, float]:
    """Per phase, the mean over the recorded steps (the ones `diff` attributes: the mean is
    linear, as its items' are) of its time pooled over ranks, ms; `step` their span."""
    ranks = [r for r in entry.get("ranks", []) if r.get("recorded")]
    clock = phase_clock([r["recorded"][0] for r in ranks]) if ranks else None
    if not clock:
        return {}
    phases = ranks[0]["recorded"][0]["phase_ms"][clock]
    return {p: round(float(np.mean(pooled([r["recorded"][0]["phase_ms"][clock][p] for r in ranks]))), 3)
            for p in phases}
