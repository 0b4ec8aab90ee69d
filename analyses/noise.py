"""Step-time noise: intervals, verdicts and drift (docs/metrics.md, "Noise and verdicts").

Timed steps are neither independent nor stationary: one step's time predicts the next
(lag-1 autocorrelation up to +0.7 measured on an H200) and runs drift. An iid bootstrap then
gives intervals far too narrow. Here:

- A run's step: step i takes as long as its slowest rank (`tracekit.core.timing`).
- `inflation(*series)`: the variance inflation of a mean over autocorrelated steps,
  (1 + ρ) / (1 − ρ) for AR(1) noise. ρ is a cautious estimate: the lag-1 autocorrelation
  pooled over the series, corrected for its small-sample bias (ρ̂ + (1 + 3ρ̂) / n, Marriott
  and Pope), plus one standard error √((1 − ρ²) / (n · series)) (Bartlett), floored at 0 and
  capped at 0.95. Twenty steps say little about ρ; a run whose ρ came out too low would
  otherwise get an interval too narrow. `effective_steps` = n ÷ inflation.
- `median_ci`: the median ± t(0.975, df) × √(π/2 · s² / n · inflation): the normal-theory
  interval of a median (efficiency 2/π of the mean's) with the AR(1) correction; df = the
  effective steps − 1.
- `delta_ci`: B's median − A's, with the same interval for the difference (variances added,
  ρ pooled over both sides, Welch–Satterthwaite df).
- `rounds_delta_ci`: over the rounds of an interleaved comparison (variants alternated in
  blocks in one process), the per-round Δs' mean ± t · √(s² / R · inflation), the inflation
  and the degrees of freedom (Bartlett's, of s² under AR(1)) from the cautious ρ of the Δs
  themselves; `outlying_rounds`: the rounds whose Δ lies beyond `OUTLIER_MADS` robust σ.
- `verdict`: `too few steps` below `MIN_STEPS` timed steps (per repeat), `too few rounds`
  below `MIN_ROUNDS`; one sequential repeat gives none (`ONE_REPEAT`: its steps know nothing
  of what differs between two processes; `REPEATS_TO_DECIDE` do); `inconclusive` when the
  interval holds 0; else `faster` / `slower` — "in R rounds" or "in R repeats". No gate on
  the effective steps: a gate on an estimated ρ lets through exactly the runs whose ρ was
  underestimated (the simulation in `test_variants.py`).
- `repeats_delta_ci`: across R repeats of the matrix, the per-repeat Δs' mean with a t
  interval (R − 1 df): the run-to-run spread. With R = 2 that is 1 df, t = 12.7: two
  repeats rarely decide anything (`FEW_REPEATS`); three or more do.
- `drift`: the median of the last third of the steps ÷ the median of the first third (1: no
  drift; 0.5: twice as fast by the end). `DRIFT_WARN` is the warning threshold.

`t975` is Student's t quantile solved from its distribution function, the regularized
incomplete beta function by its continued fraction (Numerical Recipes, 3rd ed., §6.4),
bisected to 1e-12: `scipy.special.stdtrit` agrees to 1e-9 (`tests/test_variants.py`), but
importing `scipy.special` costs half a second, as much as the rest of a small command.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from tracekit.core.timing import slowest

DRIFT_WARN = 1.10  # last third ÷ first third beyond 1.10 (or under 1 / 1.10): warned
MIN_STEPS = 10  # fewer timed steps: figures, no verdict
MIN_ROUNDS = 5  # fewer interleaved rounds: figures, no verdict
OUTLIER_MADS = 5.0  # a round's Δ this many robust standard deviations from the median's: named
REPEATS_TO_DECIDE = 3  # sequential repeats a verdict needs (`test_variants.py`'s simulation)
ONE_REPEAT = "no verdict: 1 repeat"
FEW_REPEATS = ("2 repeats give the across-repeats interval 1 degree of freedom (t = 12.7): it rarely "
               "excludes 0; 3 or more repeats decide")


@lru_cache(maxsize=None)
def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (at least 1): the t
    whose upper tail is 0.025, by bisection to 1e-12 relative."""
    df = max(1.0, float(df))
    lo, hi = 0.0, 16.0
    while t_upper_tail(hi, df) > 0.025:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_upper_tail(mid, df) > 0.025 else (lo, mid)
    return (lo + hi) / 2


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom, t ≥ 0: I_x(df/2, 1/2) / 2 with
    x = df / (df + t²)."""
    return 0.5 * regularized_beta(df / (df + t * t), df / 2, 0.5)


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, 0 ≤ x ≤ 1: its continued fraction
    (modified Lentz), on the side of x where it converges fast."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * beta_fraction(x, a, b) / a
    return 1.0 - front * beta_fraction(1.0 - x, b, a) / b


def beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function (Numerical Recipes' `betacf`)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def pooled(per_rank_steps: list[list[float]]) -> np.ndarray:
    """Per timed step, its time on the slowest rank (`tracekit.core.timing.slowest`)."""
    return np.asarray(slowest(per_rank_steps), float)


def lag1(x: np.ndarray) -> np.ndarray | float:
    """The lag-1 autocorrelation of x over its last axis (0 for fewer than 3 values or no
    variance); a float for one series."""
    x = np.asarray(x, float)
    x = x - x.mean(-1, keepdims=True)
    denominator = (x * x).sum(-1)
    ok = (denominator > 0) & (x.shape[-1] > 2)
    rho = np.where(ok, (x[..., 1:] * x[..., :-1]).sum(-1) / np.where(ok, denominator, 1.0), 0.0)
    return float(rho) if rho.ndim == 0 else rho


def cautious_rho(rho: np.ndarray | float, n: int, series: int = 1) -> np.ndarray | float:
    """The cautious ρ made from the lag-1 autocorrelation `rho` pooled over `series` series of
    n values (module docstring)."""
    rho = rho + (1 + 3 * rho) / n
    rho = rho + np.sqrt(np.maximum(0.0, 1 - np.minimum(1.0, rho) ** 2) / (n * series))
    return np.clip(rho, 0.0, 0.95)


def inflation(*series: np.ndarray) -> float:
    """(1 + ρ) / (1 − ρ), ρ the cautious lag-1 autocorrelation of `series` (module docstring)."""
    rho = float(cautious_rho(float(np.mean([lag1(s) for s in series])), min(len(s) for s in series), len(series)))
    return (1 + rho) / (1 - rho)


def effective_steps(x: np.ndarray) -> float:
    return len(x) / inflation(x)


def _spread(x: np.ndarray, infl: float) -> float:
    """Variance of the median of x under AR(1) noise: π/2 · s² / n · inflation."""
    return np.pi / 2 * float(np.var(x, ddof=1)) / len(x) * infl if len(x) > 1 else 0.0


def median_ci(x: np.ndarray) -> tuple[float, float, float]:
    """(median, lo, hi): the 95 % interval of the median (module docstring)."""
    x = np.asarray(x, float)
    median = float(np.median(x))
    if len(x) < 2:
        return median, median, median
    infl = inflation(x)
    h = t975(len(x) / infl - 1) * np.sqrt(_spread(x, infl))
    return median, median - h, median + h


def delta_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float]:
    """(median(b) − median(a), lo, hi, effective steps of the smaller side)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = float(np.median(b) - np.median(a))
    if min(len(a), len(b)) < 2:
        return d, d, d, float(min(len(a), len(b)))
    infl = inflation(a, b)
    va, vb = _spread(a, infl), _spread(b, infl)
    na, nb = len(a) / infl, len(b) / infl
    df = (va + vb) ** 2 / ((va ** 2 / max(na - 1, 1)) + (vb ** 2 / max(nb - 1, 1))) if va + vb > 0 else 1.0
    h = t975(df) * np.sqrt(va + vb)
    return d, d - h, d + h, min(na, nb)


def repeats_delta_ci(deltas: list[float]) -> tuple[float, float, float]:
    """(mean Δ, lo, hi) across repeats: a t interval with R − 1 degrees of freedom."""
    x = np.asarray(deltas, float)
    mean = float(np.mean(x))
    if len(x) < 2:
        return mean, mean, mean
    h = t975(len(x) - 1) * float(np.std(x, ddof=1)) / np.sqrt(len(x))
    return mean, mean - h, mean + h


def rounds_delta_ci(deltas: np.ndarray, peers: list[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean Δ, lo, hi) over the last axis of `deltas`, the per-round Δs of an interleaved
    comparison: mean ± t(0.975, df) · √(s² / R · (1 + ρ) / (1 − ρ)), ρ the cautious lag-1
    autocorrelation of the Δs pooled with `peers` — the other pairs' Δs of the same launch,
    round by round (the process's noise is theirs too, and ten rounds say little of ρ alone) —
    and df = ⌊R · (1 − ρ²) / (1 + ρ²)⌋ − 1, at least 1 (the degrees of freedom of s² under
    AR(1) noise, Bartlett; an integer: the simulation in `test_variants.py` computes thousands
    at once). Fewer than 2 rounds: the mean, no width."""
    d = np.asarray(deltas, float)
    rounds, mean = d.shape[-1], d.mean(-1)
    if rounds < 2:
        return mean, mean, mean
    series = [d, *(np.asarray(p, float) for p in peers)]
    rho = cautious_rho(np.mean([lag1(x) for x in series], axis=0), rounds, len(series))
    df = np.maximum(1.0, np.floor(rounds * (1 - rho ** 2) / (1 + rho ** 2)) - 1)
    h = np.vectorize(t975)(df) * np.sqrt(d.var(-1, ddof=1) / rounds * (1 + rho) / (1 - rho))
    return mean, mean - h, mean + h


def outlying_rounds(deltas: list[float]) -> list[int]:
    """The rounds (0-based) whose Δ lies more than `OUTLIER_MADS` robust standard deviations
    (1.4826 · the median absolute deviation) from the median Δ: a disturbance of a block or
    two, named in a warning. They stay in the mean and widen its interval (docs/metrics.md)."""
    d = np.asarray(deltas, float)
    if len(d) < MIN_ROUNDS:
        return []
    centre = np.median(d)
    scale = 1.4826 * np.median(np.abs(d - centre))
    return [int(i) for i in np.flatnonzero(np.abs(d - centre) > OUTLIER_MADS * scale)] if scale > 0 else []


def unpaired_repeats_ci(a_medians: list[float], b_medians: list[float]) -> tuple[float, float, float]:
    """(mean B − mean A, lo, hi) of per-repeat medians from two launches with different numbers
    of repeats (nothing to pair): Welch's t interval."""
    a, b = np.asarray(a_medians, float), np.asarray(b_medians, float)
    va, vb = float(np.var(a, ddof=1)) / len(a), float(np.var(b, ddof=1)) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb > 0 else 1.0
    d, h = float(b.mean() - a.mean()), t975(df) * np.sqrt(va + vb)
    return d, d - h, d + h


def verdict(lo: float, hi: float, n_steps: int, repeats: int = 1, rounds: int | None = None) -> str:
    """What the interval says (module docstring): over `rounds` of an interleaved comparison,
    else across `repeats` sequential repeats; one sequential repeat gives none."""
    if rounds is not None and rounds < MIN_ROUNDS:
        return "too few rounds"
    if rounds is None and n_steps < MIN_STEPS:
        return "too few steps"
    if rounds is None and repeats < 2:
        return ONE_REPEAT
    if lo <= 0 <= hi:
        return "inconclusive"
    word = "faster" if hi < 0 else "slower"
    return f"{word} in {rounds} rounds" if rounds is not None else f"{word} in {repeats} repeats"


def drift(x: np.ndarray) -> float:
    """The median of the last third of `x` ÷ the median of its first third (1.0 for fewer
    than 3 steps)."""
    x = np.asarray(x, float)
    third = len(x) // 3
    if third < 1:
        return 1.0
    return float(np.median(x[-third:]) / np.median(x[:third]))


def drift_words(ratio: float) -> str:
    """A drift ratio as a person says it: "2.40× faster by the end", "1.15× slower by the end"."""
    return f"{1 / ratio:.2f}× faster by the end" if ratio < 1 else f"{ratio:.2f}× slower by the end"
