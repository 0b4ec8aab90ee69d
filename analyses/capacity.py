"""`tracekit capacity`: the largest preset and batch each variant trains."""

from __future__ import annotations

import polars as pl


def capacity_table(result: dict) -> pl.DataFrame:
    """Per variant: the largest preset (in the order probed) and, within it, the largest batch
    that trained; then what stopped it (the first failing probe after it)."""
    probes = pl.DataFrame(result["probes"], schema={
        "preset": pl.String, "batch": pl.Int64, "variant": pl.String, "status": pl.String, "message": pl.String,
        "peak_allocated_bytes": pl.Int64, "manifest": pl.String})
    order = {p: i for i, p in enumerate(result["presets"])}
    probes = probes.with_columns(size=pl.col("preset").replace_strict(order, return_dtype=pl.Int64))
    rows = []
    for (variant,), tried in probes.sort("size", "batch").group_by("variant", maintain_order=True):
        tried = tried.with_row_index("order")
        ok = tried.filter(pl.col("status") == "ok")
        best = ok.row(-1, named=True) if ok.height else None
        failed = tried.filter((pl.col("status") != "ok") & (pl.col("order") > (best["order"] if best else -1)))
        stop = failed.row(0, named=True) if failed.height else None
        rows.append({"variant": variant, "largest_preset": best and best["preset"], "largest_batch": best and best["batch"],
                     "peak_allocated_bytes": best and best["peak_allocated_bytes"],
                     "stopped_by": stop and f"{stop['status']} at {stop['preset']} batch {stop['batch']}",
                     "probes": tried.height})
    return pl.DataFrame(rows, schema={"variant": pl.String, "largest_preset": pl.String, "largest_batch": pl.Int64,
                                      "peak_allocated_bytes": pl.Int64, "stopped_by": pl.String, "probes": pl.Int64})
