"""Step-time noise: confidence intervals, verdicts and drift (docs/metrics.md).

- A run's step: the timed steps pooled over ranks — step i takes as long as its slowest rank.
- `median_ci`: the median with a 95 % percentile-bootstrap interval (2,000 resamples of the
  steps, seeded: the same numbers every time).
- `delta_ci`: B's median − A's with a 95 % bootstrap interval (each side resampled apart);
  `verdict`: `faster` when the interval lies below 0, `slower` above, else `no change`.
- `drift_pct`: the least-squares slope of step time over the steps, × (n − 1), as a percent
  of the median: how much the run sped up or slowed down from its first timed step to its
  last (warm-up transients, thermal throttling). `DRIFT_WARN` is the warning threshold.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 2000
DRIFT_WARN = 10.0  # percent


def pooled(per_rank_steps: list[list[float]]) -> np.ndarray:
    """Per timed step, its time on the slowest rank."""
    n = min(len(s) for s in per_rank_steps)
    return np.max(np.array([s[:n] for s in per_rank_steps]), axis=0)


def _medians(x: np.ndarray, rng) -> np.ndarray:
    return np.median(x[rng.integers(0, len(x), (RESAMPLES, len(x)))], axis=1)


def median_ci(x: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """(median, lo, hi)."""
    rng = np.random.default_rng(seed)
    boot = _medians(x, rng)
    return float(np.median(x)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def delta_ci(a: np.ndarray, b: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """(median(b) − median(a), lo, hi)."""
    rng = np.random.default_rng(seed)
    boot = _medians(b, rng) - _medians(a, rng)
    return float(np.median(b) - np.median(a)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def verdict(lo: float, hi: float) -> str:
    return "faster" if hi < 0 else "slower" if lo > 0 else "no change"


def drift_pct(x: np.ndarray) -> float:
    if len(x) < 2:
        return 0.0
    slope = np.polyfit(np.arange(len(x)), x, 1)[0]
    return float(slope * (len(x) - 1) / np.median(x) * 100)
