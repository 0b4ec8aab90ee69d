"""Step-time noise: intervals, verdicts and drift (docs/metrics.md, "Noise and verdicts").

Timed steps are neither independent nor stationary: one step's time predicts the next
(lag-1 autocorrelation up to +0.7 measured on an H200) and runs drift. An iid bootstrap then
gives intervals far too narrow. Here:

- A run's step: the timed steps pooled over ranks — step i takes as long as its slowest rank.
- `inflation(*series)`: the variance inflation of a mean over autocorrelated steps,
  (1 + ρ) / (1 − ρ) for AR(1) noise, ρ the lag-1 autocorrelation pooled over the series and
  corrected for its small-sample bias (ρ̂ + (1 + 3ρ̂) / n, Marriott and Pope), floored at 0.
  `effective_steps` = n ÷ inflation: how many independent steps the run is worth.
- `median_ci`: the median ± t(0.975, df) × √(π/2 · s² / n · inflation): the normal-theory
  interval of a median (efficiency 2/π of the mean's) with the AR(1) correction; df = the
  effective steps − 1.
- `delta_ci`: B's median − A's, with the same interval for the difference (variances added,
  ρ pooled over both sides, Welch–Satterthwaite df).
- `verdict`: `too few steps` below `MIN_STEPS` timed steps (per repeat); `too few
  independent steps` when one run's steps are worth fewer than `MIN_EFFECTIVE` independent
  ones; `inconclusive` when the interval holds 0; else `faster` / `slower` — "in this run"
  for one run's steps, "in R repeats" across repeats.
- `repeats_delta_ci`: across R repeats of the matrix, the per-repeat Δs' mean with a t
  interval (R − 1 df): the run-to-run spread. `verdict` then speaks of the repeats.
- `drift_pct`: the least-squares slope of step time over the steps, × (n − 1), as a percent
  of the median: how much the run sped up or slowed down from its first timed step to its
  last. `DRIFT_WARN` is the warning threshold.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

DRIFT_WARN = 10.0  # percent
MIN_STEPS = 10  # fewer timed steps: figures, no verdict
MIN_EFFECTIVE = 5.0  # fewer effective (independent) steps: inconclusive


def pooled(per_rank_steps: list[list[float]]) -> np.ndarray:
    """Per timed step, its time on the slowest rank."""
    n = min(len(s) for s in per_rank_steps)
    return np.max(np.array([s[:n] for s in per_rank_steps]), axis=0)


def lag1(x: np.ndarray) -> float:
    """The lag-1 autocorrelation of x (0 for fewer than 3 values or no variance)."""
    x = np.asarray(x, float) - np.mean(x)
    denominator = float(np.dot(x, x))
    return float(np.dot(x[1:], x[:-1]) / denominator) if len(x) > 2 and denominator > 0 else 0.0


def inflation(*series: np.ndarray) -> float:
    """(1 + ρ) / (1 − ρ), ρ the bias-corrected lag-1 autocorrelation pooled over `series`
    (floored at 0, capped at 0.95)."""
    n = min(len(s) for s in series)
    rho = float(np.mean([lag1(s) for s in series]))
    rho = min(0.95, max(0.0, rho + (1 + 3 * rho) / n))
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
    h = stats.t.ppf(0.975, max(1.0, len(x) / infl - 1)) * np.sqrt(_spread(x, infl))
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
    h = stats.t.ppf(0.975, max(1.0, df)) * np.sqrt(va + vb)
    return d, d - h, d + h, min(na, nb)


def repeats_delta_ci(deltas: list[float]) -> tuple[float, float, float]:
    """(mean Δ, lo, hi) across repeats: a t interval with R − 1 degrees of freedom."""
    x = np.asarray(deltas, float)
    mean = float(np.mean(x))
    if len(x) < 2:
        return mean, mean, mean
    h = stats.t.ppf(0.975, len(x) - 1) * float(np.std(x, ddof=1)) / np.sqrt(len(x))
    return mean, mean - h, mean + h


def unpaired_repeats_ci(a_medians: list[float], b_medians: list[float]) -> tuple[float, float, float]:
    """(mean B − mean A, lo, hi) of per-repeat medians from two launches with different numbers
    of repeats (nothing to pair): Welch's t interval (scipy)."""
    a, b = np.asarray(a_medians, float), np.asarray(b_medians, float)
    ci = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    return float(b.mean() - a.mean()), float(ci.low), float(ci.high)


def verdict(lo: float, hi: float, n_steps: int, effective: float, repeats: int = 1) -> str:
    """What the interval says (module docstring)."""
    if n_steps < MIN_STEPS:
        return "too few steps"
    if repeats < 2 and effective < MIN_EFFECTIVE:
        return "too few independent steps"
    if lo <= 0 <= hi:
        return "inconclusive"
    word = "faster" if hi < 0 else "slower"
    return f"{word} in {repeats} repeats" if repeats > 1 else f"{word} in this run"


def drift_pct(x: np.ndarray) -> float:
    if len(x) < 2:
        return 0.0
    slope = np.polyfit(np.arange(len(x)), x, 1)[0]
    return float(slope * (len(x) - 1) / np.median(x) * 100)
