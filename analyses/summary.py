"""`tracekit summary`: one row per rank, step and device.

- cpu_ns: the step's CPU window, ProfilerStep end − start (host: the same on each device's row).
- gpu_span_ns, gpu_busy_ns, idle_ns, comm_ns, compute_ns, overlap_ns, overlap_pct,
  exposed_comm_ns, comm_alone_ns: the timeline's figures of the step on the device
  (`timeline.figures`; docs/metrics.md).
- kernels: kernel activities the step launched on the device.
- host_idle_ns: idle time of the span while the host was in CPU ops or launch/runtime calls
  (`timeline.host_idle`); host_bound: more than half the span — the step measures the host's
  Python and launch overhead, not its kernels.
- busy_pct, idle_pct, exposed_comm_pct, host_idle_pct: gpu_busy_ns, idle_ns, exposed_comm_ns,
  host_idle_ns over gpu_span_ns × 100 (2 decimals; null without a span): the step's own share,
  so that `--agg` gives the statistic of the steps' shares (the largest busy_pct with `max`).
- syncs.<api>: host-blocking runtime calls in the step's CPU window (host, as cpu_ns).
- collectives.<kind>: collective kernels the step launched on the device; on CPU-only traces
  the collective ops (`record_param_comms`, else the `c10d::` dispatcher ops).
- scope `trace`: one row per device over the whole trace (step null): every call and op of
  the trace and every device activity, in steps or not, launch record or not; cpu_ns from the
  first step's start to the last's end. Scope `launched`: the same without the device work
  whose launch is not in the trace (TraceLens' default).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.counts import count_columns
from tracekit.analyses.timeline import SYNC_APIS, activities, figures, host_idle, kept, timeline
from tracekit.core.model import Trace
from tracekit.core.names import collective_kind

ALWAYS_REPORTED_SYNCS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")
FIGURES = ("gpu_span_ns", "gpu_busy_ns", "idle_ns", "comm_ns", "compute_ns", "overlap_ns", "overlap_pct",
           "exposed_comm_ns", "comm_alone_ns")


def collective_ops(trace: Trace) -> pl.DataFrame:
    """CPU-side collective calls, with their kind: the `record_param_comms` ops where the trace
    has them, else the c10d dispatcher ops (`c10d::_allgather_base_`, `c10d::allreduce_`, …)
    that newer torch records for gloo."""
    records = trace.ops.filter((pl.col("name") == "record_param_comms") & pl.col("collective").is_not_null())
    if records.height:
        return records.with_columns(coll_kind=collective_kind(pl.col("collective")))
    return (trace.ops.filter(pl.col("name").str.starts_with("c10d::"))
            .with_columns(coll_kind=collective_kind(pl.col("name").str.strip_prefix("c10d::")))
            .filter(pl.col("coll_kind").is_not_null()))


def scoped(frame: pl.DataFrame, scope: str) -> pl.DataFrame:
    """`frame` as the scope sees it: its own steps, or (a whole-trace scope) everything as one
    step null."""
    if scope != "step":
        return frame.with_columns(step=pl.lit(None, pl.Int64))
    return frame.filter(pl.col("step").is_not_null())


def collective_counts(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """(step, device, coll_kind, n): kernels on GPU traces, collective ops on CPU-only ones."""
    if trace.has_gpu:
        source = activities(trace, scope).filter(pl.col("category") == "comm")
    else:
        source = collective_ops(trace).with_columns(device=pl.lit(None, pl.Int64))
    return scoped(source, scope).group_by("step", "device", "coll_kind").agg(n=pl.len())


def sync_counts(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """(step, api, n) for host-blocking calls."""
    return (scoped(trace.calls.filter(pl.col("name").is_in(SYNC_APIS)), scope)
            .group_by("step", pl.col("name").alias("api")).agg(n=pl.len()))


def step_rows(trace: Trace, scope: str) -> pl.DataFrame:
    """step, device, cpu_ns: one row per step and device it ran work on (a step without
    device work: one row, device null); scope `trace`: per device, step null."""
    steps = trace.steps.with_columns(cpu_ns=pl.col("cpu_end") - pl.col("cpu_start"))
    if scope != "step":
        steps = steps.select(step=pl.lit(None, pl.Int64), cpu_ns=pl.col("cpu_end").max() - pl.col("cpu_start").min())
    devices = scoped(activities(trace, scope).select("step", "device"), scope).unique()
    return (steps.select("step", "cpu_ns").join(devices, on="step", how="left", nulls_equal=True)
            .sort("step", "device", nulls_last=True))


SHARES = {"busy_pct": "gpu_busy_ns", "idle_pct": "idle_ns", "exposed_comm_pct": "exposed_comm_ns",
          "host_idle_pct": "host_idle_ns"}


def shares_of_span(shares: dict, span: str) -> list[pl.Expr]:
    """Each share (name → its part's column) as part / `span` × 100, 2 decimals; null where the
    span is null or 0."""
    return [pl.when(pl.col(span) > 0).then((pl.col(part) / pl.col(span) * 100).round(2)).alias(name)
            for name, part in shares.items()]


def summary(trace: Trace, scope: str = "step") -> pl.DataFrame:
    """One row per step and device: step, device, cpu_ns, the timeline figures, kernels,
    `syncs.<api>` and `collectives.<kind>` counts (dotted names nest in JSON). Kept with the
    trace (`timeline.kept`: a later command reads it from the trace cache)."""
    return kept(trace, f"summary-{scope}", lambda: made_summary(trace, scope))


def made_summary(trace: Trace, scope: str) -> pl.DataFrame:
    key = ["step", "device"]
    kernels = scoped(activities(trace, scope).filter(pl.col("kind") == "kernel"), scope).group_by(key).agg(
        kernels=pl.len().cast(pl.Int64))
    line = timeline(trace, scope)
    table = (step_rows(trace, scope)
             .join(figures(line.coarse).drop("gpu_start", "gpu_end"), on=key, how="left", nulls_equal=True)
             .join(host_idle(line.segments), on=key, how="left", nulls_equal=True)
             .join(kernels, on=key, how="left", nulls_equal=True)
             .with_columns(pl.when(pl.col("device").is_not_null()).then(pl.col(c).fill_null(0))  # zero-length work
                           for c in ("kernels", "host_idle_ns", *FIGURES) if c != "overlap_pct"))
    table = table.select(*key, "cpu_ns", *FIGURES[:3], "kernels", *FIGURES[3:], "host_idle_ns", "host_bound",
                         *shares_of_span(SHARES, "gpu_span_ns"))
    syncs = sync_counts(trace, scope).rename({"api": "key"})
    apis = list(ALWAYS_REPORTED_SYNCS) + sorted(set(syncs["key"]) - set(ALWAYS_REPORTED_SYNCS))
    colls = collective_counts(trace, scope).select(*key, pl.col("coll_kind").fill_null("other").alias("key"), "n")
    if not trace.has_gpu:  # CPU collectives: per step, on the step's one row
        colls = colls.drop("device")
    table = count_columns(table, syncs, "syncs", apis, ["step"])
    return count_columns(table, colls, "collectives", sorted(set(colls["key"])),
                         key if trace.has_gpu else ["step"])
