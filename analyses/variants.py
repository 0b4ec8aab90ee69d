"""Comparing the variants of one `tracekit profile` output, and checking the traces against
what the runtime counted.

- `variant_table`: one row per variant and rank: status, unprofiled step time (median ms),
  the recorded step's summary figures, and the deltas against the first variant that ran.
- `count_check`: trace-derived counts against the runtime's own counts in the manifest.
  Compared: `Event.synchronize` ↔ host `cudaEventSynchronize` (GPU traces), and each
  collective kind ↔ the Python collective calls of that kind, for all_gather and
  reduce_scatter always and for other kinds when the runtime saw any. Kinds issued from C++
  (DDP's reducer all-reduces) are invisible to the runtime counters and not compared.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.diff import RunDiff, diff_runs
from tracekit.analyses.summary import summary
from tracekit.model import Run

# runtime counter → (summary column prefix, field)
RUNTIME_KEYS = {
    "Event.synchronize": ("syncs", "cudaEventSynchronize"),
    "all_gather_into_tensor": ("collectives", "all_gather"), "all_gather_single": ("collectives", "all_gather"),
    "all_gather": ("collectives", "all_gather"),
    "reduce_scatter_tensor": ("collectives", "reduce_scatter"), "reduce_scatter_single": ("collectives", "reduce_scatter"),
    "reduce_scatter": ("collectives", "reduce_scatter"),
    "all_reduce": ("collectives", "all_reduce"), "broadcast": ("collectives", "broadcast"),
    "reduce": ("collectives", "reduce"), "all_to_all_single": ("collectives", "all_to_all"),
    "all_to_all": ("collectives", "all_to_all"),
}
ALWAYS_COMPARED = ("syncs.cudaEventSynchronize", "collectives.all_gather", "collectives.reduce_scatter")


def recorded_step(run: Run) -> dict[int, dict]:
    """rank → the summary row of the recorded step (the last step of each trace)."""
    return {t.rank: summary(t).sort("step").row(-1, named=True) for t in run.traces}


def variant_table(manifest: dict, runs: dict[str, Run]) -> pl.DataFrame:
    rows = []
    for variant, entry in manifest["variants"].items():
        if entry["status"] != "ok":
            rows.append({"variant": variant, "status": entry["status"], "message": entry.get("message")})
            continue
        steps = recorded_step(runs[variant])
        for r in entry["ranks"]:
            s = steps[r["rank"]]
            rows.append({
                "variant": variant, "rank": r["rank"], "status": "ok", "step_ms": round(r["step_ms"]["median"], 3),
                "peak_allocated_bytes": r["peak_allocated_bytes"], "cpu_ns": s["cpu_ns"],
                "gpu_span_ns": s["gpu_span_ns"], "gpu_busy_ns": s["gpu_busy_ns"],
                "exposed_comm_ns": s["exposed_comm_ns"], "idle_ns": s["idle_ns"],
                "syncs": sum(v for k, v in s.items() if k.startswith("syncs.")),
                "collectives": sum(v for k, v in s.items() if k.startswith("collectives.")),
                "loss": r["first_step"]["loss"],
            })
    table = pl.DataFrame(rows, infer_schema_length=None)
    if "rank" not in table.columns:
        return table
    base = table.filter(pl.col("status") == "ok").group_by("rank", maintain_order=True).first()
    base = base.select("rank", pl.col("step_ms").alias("base_ms"), pl.col("gpu_span_ns").alias("base_span"))
    return table.join(base, on="rank", how="left", maintain_order="left").with_columns(
        d_step_ms=(pl.col("step_ms") - pl.col("base_ms")).round(3),
        d_gpu_span_ns=pl.col("gpu_span_ns") - pl.col("base_span"),
    ).drop("base_ms", "base_span")


def variant_diffs(runs: dict[str, Run], top: int) -> dict[tuple[str, str], RunDiff]:
    """Each variant against the first one that ran (`diff.diff_runs`); CPU-only runs have no
    GPU span to attribute and give none."""
    names = [n for n, run in runs.items() if run.traces[0].has_gpu]
    return {(names[0], other): diff_runs(runs[names[0]].traces, runs[other].traces, "all", top)
            for other in names[1:]}


MODEL_KEYS = ("preset", "overrides", "seed")


def config_mismatch(a: dict | None, b: dict | None) -> list[str]:
    """Warnings when two profile runs' manifests say they trained different models or data."""
    if not a or not b:
        return []
    return [f"A and B ran different {key}: {a['config'].get(key)} vs {b['config'].get(key)}"
            for key in MODEL_KEYS if a["config"].get(key) != b["config"].get(key)]


def count_check(manifest: dict, runs: dict[str, Run]) -> pl.DataFrame:
    """One row per (variant, rank, counted thing): runtime, trace, match."""
    rows = []
    for variant, run in runs.items():
        steps = recorded_step(run)
        for r in manifest["variants"][variant]["ranks"]:
            step, gpu = steps[r["rank"]], run.traces[0].has_gpu
            runtime: dict[str, int] = {}
            for key, n in r["runtime_counts"].items():
                if key in RUNTIME_KEYS:
                    col = ".".join(RUNTIME_KEYS[key])
                    runtime[col] = runtime.get(col, 0) + n
            compared = set(runtime) | set(ALWAYS_COMPARED)
            if not gpu:
                compared.discard("syncs.cudaEventSynchronize")
            for col in sorted(compared):
                trace_n, runtime_n = step.get(col) or 0, runtime.get(col, 0)
                rows.append({"variant": variant, "rank": r["rank"], "count": col, "runtime": runtime_n,
                             "trace": trace_n, "match": trace_n == runtime_n})
    return pl.DataFrame(rows, schema={"variant": pl.String, "rank": pl.Int64, "count": pl.String,
                                      "runtime": pl.Int64, "trace": pl.Int64, "match": pl.Boolean})
