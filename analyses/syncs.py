"""`tracekit syncs`: host-blocking calls per rank and step, with blame.

- A host sync is a runtime/driver call that blocks the calling CPU thread until the device
  catches up: `cudaEventSynchronize`, `cudaStreamSynchronize`, `cudaDeviceSynchronize`, their
  driver (`cu*Synchronize`) and HIP twins, and synchronous copies (`cudaMemcpy`,
  `hipMemcpy`, `hipMemcpyWithStream`). A device-to-host copy from `.item()`/`.cpu()` is a
  `cudaMemcpyAsync` followed by a `cudaStreamSynchronize`: it is counted as that sync.
- blocked_ns: the call's duration.
- gpu_idle_ns: the part of the call during which no device ran anything (the trace-scope
  timeline's busy segments, any device); null when the trace has no device activity records
  at all (nothing to say about the GPU).
- blame: the CPU ops/annotations on the same thread that enclose the call (start ≤ call start,
  end ≥ call end), innermost first; `ProfilerStep#N` is left out.
- CUPTI's `cuda_sync` events ("Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync")
  are device-side records of synchronisation, not host waits: the ledger lists them apart, as
  `cuda_sync: <name>` with no blocked or idle time, blamed on the ops around the call they
  belong to (one entry per step and name), and counts them in `cuda_sync_events.<name>`.
- scope `step` (default): the calls each step made (a record: its call's step). Scope
  `trace`: the whole trace as one row, step null — every host sync, in a step or not (a
  `cudaDeviceSynchronize` before the first step), and every cuda_sync record, its call in the
  trace or not (blamed where it is).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.counts import count_columns, known_sum
from tracekit.analyses.timeline import INNERMOST_FIRST, SYNC_APIS, busy_during, timeline
from tracekit.core.model import ENGINE, Trace


def host_syncs(trace: Trace) -> pl.DataFrame:
    """Every host-blocking call: step, api, tid, start, end, blocked_ns, gpu_idle_ns, blame."""
    calls = (trace.calls.filter(pl.col("name").is_in(SYNC_APIS))
             .select("step", pl.col("name").alias("api"), "tid", "start", "end")
             .with_row_index("call")
             .with_columns(blocked_ns=pl.col("end") - pl.col("start")))
    busy = busy_during(calls, timeline(trace, "trace").coarse)
    return calls.with_columns(
        gpu_idle_ns=pl.col("blocked_ns") - pl.Series(busy) if trace.has_gpu else pl.lit(None, pl.Int64),
    ).join(blame_chains(calls, trace.ops), on="call", how="left").with_columns(
        blame=pl.col("blame").fill_null(pl.lit([], dtype=pl.List(pl.String))),
    ).sort("start")


def blame_chains(intervals: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """(call, blame): names of the ops on the same thread enclosing each interval, innermost first."""
    enclosing = ops.lazy().with_row_index("o_row").filter(~pl.col("name").str.starts_with("ProfilerStep#")).select(
        "o_row", pl.col("tid").alias("o_tid"), pl.col("start").alias("o_start"), pl.col("end").alias("o_end"),
        pl.col("name").alias("o_name")).collect(engine=ENGINE)  # lazy: only these columns of the rows kept are copied
    if intervals.height == 0 or enclosing.height == 0:
        return pl.DataFrame(schema={"call": pl.UInt32, "blame": pl.List(pl.String)})
    # Two inequalities only, so polars runs an interval (IE) join; the thread is matched after:
    # with the equality inside, the join would pair every call with every op of its thread.
    pairs = intervals.select("call", "tid", "start", "end").join_where(
        enclosing, pl.col("o_start") <= pl.col("start"), pl.col("o_end") >= pl.col("end"),
    ).filter(pl.col("o_tid") == pl.col("tid"))
    return (pairs.sort("call", *INNERMOST_FIRST, descending=[False, True, False, True])
            .group_by("call", maintain_order=True).agg(blame=pl.col("o_name")))


def device_syncs(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """The CUPTI cuda_sync records whose call is in a step (scope `trace`: every one, step
    null), as ledger rows: step, api (`cuda_sync: <name>`), blame (of their call, where it is
    in the trace), innermost (null: one group per name), blocked_ns and gpu_idle_ns null."""
    calls = trace.calls.select("correlation", "step", "tid", "start", "end").unique("correlation")
    records = trace.marks.filter(pl.col("cat") == "cuda_sync").select("name", "correlation")
    if scope == "step":
        records = records.join(calls, on="correlation").filter(pl.col("step").is_not_null())
    else:
        records = records.join(calls, on="correlation", how="left").with_columns(step=pl.lit(None, pl.Int64))
    records = records.with_row_index("call")
    return records.join(blame_chains(records, trace.ops), on="call", how="left").select(
        "step", api=pl.lit("cuda_sync: ") + pl.col("name"),
        blame=pl.col("blame").fill_null(pl.lit([], dtype=pl.List(pl.String))),
        innermost=pl.lit(None, pl.String), blocked_ns=pl.lit(None, pl.Int64), gpu_idle_ns=pl.lit(None, pl.Int64))


def cuda_sync_events(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """(step, name, n): CUPTI cuda_sync records, in the step of the call they belong to (scope
    `trace`: every one, step null)."""
    marks = trace.marks.filter(pl.col("cat") == "cuda_sync")
    if scope == "step":
        steps = trace.calls.select("correlation", "step").unique("correlation")
        marks = marks.join(steps, on="correlation", how="left").filter(pl.col("step").is_not_null())
    else:
        marks = marks.with_columns(step=pl.lit(None, pl.Int64))
    return marks.group_by("step", "name").agg(n=pl.len()).sort("step", "name")


def sync_ledger(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """One row per step (scope `trace`: one row, step null, of the whole trace): `calls` =
    [{api, count, blocked_ns, gpu_idle_ns, blame, chains}], one
    entry per (api, innermost blame) of the host syncs, biggest blocked time first, then one
    per cuda_sync record name (`device_syncs`), ties by the larger count, then api and
    innermost in alphabetical order; `blame` is the group's most
    frequent chain and `chains` = [{blame, count, blocked_ns}] every distinct chain in it (the
    FSDP1 rate limiter inside `_pre_forward` in the forward and inside the backward prefetch
    in the backward); `cuda_sync_events.<name>` counts."""
    host = host_syncs(trace).with_columns(innermost=pl.col("blame").list.first())
    host = host.filter(pl.col("step").is_not_null()) if scope == "step" else host.with_columns(step=pl.lit(None, pl.Int64))
    syncs = pl.concat([host.select("step", "api", "blame", "innermost", "blocked_ns", "gpu_idle_ns"),
                       device_syncs(trace, scope)])
    chains = (syncs.group_by("step", "api", "innermost", "blame")
              .agg(count=pl.len().cast(pl.Int64), blocked_ns=known_sum("blocked_ns"))
              .sort("count", "blocked_ns", pl.col("blame").list.join(" < "), descending=[True, True, False],
                    nulls_last=True))
    groups = (syncs.group_by("step", "api", "innermost")
              .agg(count=pl.len().cast(pl.Int64), blocked_ns=known_sum("blocked_ns"),
                   gpu_idle_ns=known_sum("gpu_idle_ns"))
              .join(chains.group_by("step", "api", "innermost", maintain_order=True).agg(
                  blame=pl.col("blame").first(), chains=pl.struct("blame", "count", "blocked_ns")),
                  on=["step", "api", "innermost"], nulls_equal=True)
              .sort("step", "blocked_ns", "count", "api", "innermost", descending=[False, True, True, False, False],
                    nulls_last=True))  # ties (device syncs: no blocked time) by name: the same order every run
    per_step = groups.group_by("step", maintain_order=True).agg(
        calls=pl.struct("api", "count", "blocked_ns", "gpu_idle_ns", "blame", "chains"))
    steps = trace.steps.select("step") if scope == "step" else pl.DataFrame({"step": [None]}, schema={"step": pl.Int64})
    table = steps.join(per_step, on="step", how="left", nulls_equal=True).with_columns(
        pl.col("calls").fill_null(pl.lit([], dtype=per_step.schema["calls"])))
    events = cuda_sync_events(trace, scope).rename({"name": "key"})
    return count_columns(table, events, "cuda_sync_events", sorted(set(events["key"]))).sort("step")
