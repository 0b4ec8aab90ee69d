"""Steps, and the step each event belongs to.

A step is the CPU window of a `ProfilerStep#N` annotation. A runtime/driver call or CPU op
belongs to the step whose window holds its start. A GPU activity belongs to the step of the
call that launched it (same `correlation`), not to the step whose window it runs in: when
the GPU lags, a step's kernels run during the next step's window. An activity whose launching
call is not in the trace has no launching thread, so no step: it is an orphan (`lint`'s
`orphan_gpu_work`), whatever CPU range its time or its `External id` overlaps (roctracer and
Kineto fill that id from whatever range was open) — but for a `cupti` recording of tracekit's
runner, which holds no calls by design and gives each activity the External id of the
runner's phase annotation (`tracekit#<phase>`) it was launched in: the step of that
annotation. An activity that carries no correlation id at all (MTIA's DMA transfers) cannot
be linked to a launch: it belongs to the step whose window holds its start. A trace with no
`ProfilerStep#N` is one step, numbered 0, spanning the whole trace; then every GPU activity
belongs to it.
"""

from __future__ import annotations

import polars as pl

PROFILER_STEP = r"^ProfilerStep#(\d+)$"
RUNNER_PHASE = r"^tracekit#(forward|backward|optimizer|checkpoint)$"  # runners/clock.py


def steps_table(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per step: step, cpu_start, cpu_end (ns)."""
    marks = ops.filter(pl.col("cat").is_in(["user_annotation", "cpu_op"]))
    return (
        marks.with_columns(step=pl.col("name").str.extract(PROFILER_STEP, 1).cast(pl.Int64))
        .filter(pl.col("step").is_not_null())
        .group_by("step").agg(cpu_start=pl.col("start").min(), cpu_end=pl.col("end").max())
        .sort("cpu_start")
    )


def whole_trace_step(start: int, end: int) -> pl.DataFrame:
    return pl.DataFrame({"step": [0], "cpu_start": [start], "cpu_end": [end]},
                        schema={"step": pl.Int64, "cpu_start": pl.Int64, "cpu_end": pl.Int64})


def step_of(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """`frame` with a `step` column: the step whose CPU window holds the row's `start` (the
    last step to start at or before it, if it has not ended; `steps` sorted by cpu_start)."""
    if frame.height == 0 or steps.height == 0:
        return frame.with_columns(step=pl.lit(None, dtype=pl.Int64))
    at = steps["cpu_start"].search_sorted(frame["start"], side="right").cast(pl.Int64) - 1
    i = at.clip(lower_bound=0)
    inside = (at >= 0) & (frame["start"] < steps["cpu_end"].gather(i))
    return frame.with_columns(step=pl.when(inside).then(steps["step"].gather(i)))


def assign_steps(steps: pl.DataFrame, gpu: pl.DataFrame, calls: pl.DataFrame, ops: pl.DataFrame,
                 whole_trace: bool):
    """(gpu, calls, ops) with `step` columns. `whole_trace`: the one step spans the trace."""
    calls = step_of(calls, steps)
    ops = step_of(ops, steps)
    if whole_trace:
        return gpu.with_columns(step=pl.lit(0, dtype=pl.Int64)), calls, ops
    launched = (calls.filter(pl.col("correlation").is_not_null()).select("correlation", "step", called=pl.lit(True))
                .unique("correlation", keep="first"))
    phases = ops.filter(pl.col("ext_id").is_not_null()  # the runner's marks: a cupti capture's phases and steps
                        & (pl.col("name").str.contains(RUNNER_PHASE) | pl.col("name").str.contains(PROFILER_STEP)))
    enclosing = phases.select("ext_id", ext_step="step").unique("ext_id", keep="first")
    gpu = (gpu.join(launched, on="correlation", how="left", maintain_order="left")
           .join(enclosing, on="ext_id", how="left", maintain_order="left"))
    by_window = step_of(gpu.select("start"), steps)["step"]
    gpu = gpu.with_columns(step=pl.when(pl.col("correlation").is_null()).then(by_window)
                           .when(pl.col("called").is_null()).then(pl.col("ext_step"))
                           .otherwise(pl.col("step"))).drop("called", "ext_step")
    return gpu, calls, ops
