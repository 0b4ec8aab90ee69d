"""One step of a trace without device activity (CPU only, gloo) as the lanes `plot timeline`
draws: what each host thread ran during the step.

A step's window is its CPU window (`trace.steps`: cpu_start to cpu_end). Every CPU op that
overlaps it is taken, clipped to it (gloo's worker threads run the transfers, and their ops
are not always inside a step), `ProfilerStep#` left out. Per thread:

- `phases`: the runner's phase marks (`tracekit#forward`, `#backward`, `#optimizer`,
  `#checkpoint`; `runners/clock.py`), category the phase's name;
- `ops`: the outermost of the other ops (`timeline.outermost`), category `collective` for a
  collective — gloo's transfer (`gloo:…`), c10d's dispatcher op (`c10d::…`),
  `record_param_comms` — else `cpu op`.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.phases import RUNNER_PHASE
from tracekit.analyses.timeline import outermost
from tracekit.core.model import Trace

COLLECTIVE_OP = r"^(gloo:|c10d::|record_param_comms$)"


def host_lanes(trace: Trace, step: int) -> pl.DataFrame:
    """tid, lane (`phases` or `ops`), start, end (ns, clipped to the step's CPU window), name,
    category, sorted by thread (one with phases first, then the one whose ops start first), lane
    and start."""
    window = trace.steps.filter(pl.col("step") == step)
    low, high = window["cpu_start"][0], window["cpu_end"][0]
    ops = trace.ops.filter((pl.col("end") > low) & (pl.col("start") < high)
                           & ~pl.col("name").str.starts_with("ProfilerStep#")).with_columns(
        start=pl.col("start").clip(lower_bound=low), end=pl.col("end").clip(upper_bound=high))
    is_phase = pl.col("name").str.contains(RUNNER_PHASE)
    phases = ops.filter(is_phase).select(
        "tid", lane=pl.lit("phases"), start="start", end="end", name="name",
        category=pl.col("name").str.extract(RUNNER_PHASE, 1))
    inner = outermost(ops.filter(~is_phase)).select(
        "tid", lane=pl.lit("ops"), start="start", end="end", name="name",
        category=pl.when(pl.col("name").str.contains(COLLECTIVE_OP)).then(pl.lit("collective"))
        .otherwise(pl.lit("cpu op")))
    lanes = pl.concat([phases, inner])
    order = lanes.group_by("tid").agg(unmarked=(pl.col("lane") != "phases").all(), first=pl.col("start").min())
    return (lanes.join(order, on="tid").sort("unmarked", "first", "tid", pl.col("lane") != "phases", "start")
            .drop("unmarked", "first"))
