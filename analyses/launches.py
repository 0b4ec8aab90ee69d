"""`tracekit launches`: how long the host takes to launch each step's device work, and how long
that work waits on the device before it starts — HTA's `get_cuda_kernel_launch_stats` per
step, and `nsys stats`' `cuda_api_sum` of the launching calls.

- A launch is a runtime/driver call (`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaMemcpyAsync`,
  `hipLaunchKernel`, a graph's `cudaGraphLaunch`, …) and the device activities (kernels,
  memcpy, memset) with its correlation id; it belongs to the step and device of its earliest
  activity (the step that launched it, as every verb counts). An activity whose call is not in
  the trace (launched before profiling began) is no launch: there is no call to measure.
- call_ns: the call's duration (end − start): the host's cost of the launch.
- delay_ns: the earliest activity's start − the call's end, 0 where the activity started first
  (HTA's `launch_delay`, clipped as HTA clips it): how long the work queued on the device. Near
  0 across a step, the device waits for the host (launch-bound); large, the host runs ahead.
- device_ns: Σ of the launch's activities' durations.
- HTA's three findings, with its default cutoffs: `short`, the launches whose device_ns is
  below their call_ns and whose call took at most RUNTIME_CUTOFF_NS (work that costs the host
  more to launch than the device to run); `long_calls`, those whose call took more than
  RUNTIME_CUTOFF_NS (HTA's runtime outliers: a blocking copy, a launch queued behind a full
  queue); `long_delays`, those whose delay is more than DELAY_CUTOFF_NS (HTA's launch delay
  outliers).
- Per API in the ledger `apis`: count, call_ns and device_ns summed, delay_p50_ns /
  delay_p90_ns / delay_max_ns (the delays' `lower` quantiles: an observed delay,
  sorted[floor(q·(n − 1))]), short, long_calls, long_delays; the ledger's largest call_ns
  first. The same over every API as the step's `total_<figure>`.
- Which calls: HTA takes `cudaLaunchKernel`, `cudaLaunchKernelExC`, `cudaMemcpyAsync`,
  `cudaMemsetAsync` and MTIA's `runFunction` only; here every call that launched device work
  counts — the NCCL and Triton kernels' `cuLaunchKernel(Ex)`, graph launches, HIP's calls, a
  blocking `cudaMemcpy` —, each under its own name, so HTA's figures are those of its APIs'
  rows.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.summary import step_rows
from tracekit.core.model import Trace

FIGURES = ("count", "call_ns", "device_ns", "delay_p50_ns", "delay_p90_ns", "delay_max_ns", "short", "long_calls",
           "long_delays")
RUNTIME_CUTOFF_NS = 50_000  # HTA's `runtime_cutoff` (50 µs)
DELAY_CUTOFF_NS = 100_000  # HTA's `launch_delay_cutoff` (100 µs)


def launch_rows(trace: Trace) -> pl.DataFrame:
    """One row per launch: step, device, api, correlation, activities, call_ns, device_ns,
    delay_ns, short (a bool)."""
    work = (trace.gpu.filter(pl.col("correlation").is_not_null())
            .with_columns(pl.col("device").fill_null(0))
            .sort("start")
            .group_by("correlation", maintain_order=True)
            .agg(pl.col("step").first(), pl.col("device").first(), first=pl.col("start").first(),
                 activities=pl.len().cast(pl.Int64), device_ns=(pl.col("end") - pl.col("start")).sum()))
    calls = trace.calls.filter(pl.col("correlation").is_not_null()).unique("correlation", keep="first").select(
        "correlation", api="name", call_start="start", call_end="end")
    return work.join(calls, on="correlation").select(
        "step", "device", "api", "correlation", "activities",
        call_ns=pl.col("call_end") - pl.col("call_start"), device_ns="device_ns",
        delay_ns=(pl.col("first") - pl.col("call_end")).clip(lower_bound=0)).with_columns(
        short=(pl.col("device_ns") < pl.col("call_ns")) & (pl.col("call_ns") <= RUNTIME_CUTOFF_NS))


def figures() -> list[pl.Expr]:
    """The FIGURES of a group of launches."""
    delay = pl.col("delay_ns")
    return [pl.len().cast(pl.Int64).alias("count"), pl.col("call_ns").sum(), pl.col("device_ns").sum(),
            *[delay.quantile(q, "lower").cast(pl.Int64).alias(f"delay_p{round(q * 100)}_ns") for q in (0.5, 0.9)],
            delay.max().alias("delay_max_ns"), pl.col("short").sum().cast(pl.Int64).alias("short"),
            (pl.col("call_ns") > RUNTIME_CUTOFF_NS).sum().cast(pl.Int64).alias("long_calls"),
            (delay > DELAY_CUTOFF_NS).sum().cast(pl.Int64).alias("long_delays")]


def launches(trace: Trace) -> pl.DataFrame:
    """One row per step and device: `total_<figure>` of the FIGURES of its launches, and the
    ledger `apis` = [{api, FIGURES}] per launching API, largest call_ns first (a step without
    device work: one row, device null; device work without a launching call in the trace:
    its device's row, figures null)."""
    rows = launch_rows(trace).filter(pl.col("step").is_not_null())
    per_api = (rows.group_by("step", "device", "api").agg(*figures())
               .sort("step", "device", "call_ns", "api", descending=[False, False, True, False]))
    ledger = per_api.group_by("step", "device", maintain_order=True).agg(apis=pl.struct("api", *FIGURES))
    table = (rows.group_by("step", "device").agg(*figures()).rename({f: f"total_{f}" for f in FIGURES})
             .join(ledger, on=["step", "device"]))
    return (step_rows(trace, "step").select("step", "device")
            .join(table, on=["step", "device"], how="left", nulls_equal=True)
            .sort("step", "device", nulls_last=True))
