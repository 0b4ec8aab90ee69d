"""Naming a `lean` recording from the `full` step beside it (docs/metrics.md, "Lean items
named from the full step").

A lean trace holds kernels and runtime calls but no aten CPU ops and no
`record_param_comms`: a kernel's launching op and a collective's dtype are unknown. The runner
records one `full` step after the lean ones (OUT/<variant>/names/rank<r>…). The same step runs
the same kernels in the same order on each stream, so the k-th kernel (by start) of a
(device, stream) in a lean step is matched with the k-th of that (device, stream) in the full
step; where their names agree, the full one's `op` and `dtype` are copied over. Unmatched
kernels keep null and are counted.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.phases import launch_context
from tracekit.core.model import Trace

PLACE = ["device", "stream", "order"]


def in_order(gpu: pl.DataFrame) -> pl.DataFrame:
    """The activities with their order of start within their (step, device, stream)."""
    return gpu.with_columns(order=pl.col("start").rank("ordinal").over("step", "device", "stream").cast(pl.Int64))


def lean_names(lean: Trace, full: Trace) -> pl.DataFrame:
    """One row per lean GPU activity with a step (`row` into lean.gpu): `op` and `dtype` from the
    full trace's last step's activity at the same place whose name agrees (null otherwise),
    and `matched`."""
    step = full.gpu["step"].max()
    source = (in_order(full.gpu.with_row_index("row").join(launch_context(full).select("row", "op"), on="row"))
              .filter(pl.col("step") == step).select(*PLACE, full_name="name", full_op="op", full_dtype="dtype"))
    mine = in_order(lean.gpu.with_row_index("row").filter(pl.col("step").is_not_null()))
    joined = mine.join(source, on=PLACE, how="left").with_columns(matched=pl.col("name") == pl.col("full_name"))
    return joined.select("row", op=pl.when("matched").then("full_op"),
                         dtype=pl.coalesce("dtype", pl.when("matched").then("full_dtype")),
                         matched=pl.col("matched").fill_null(False)).sort("row")


def named(lean: Trace, full: Trace) -> tuple[int, int]:
    """Gives the lean trace the full step's names: the collectives' dtype into `lean.gpu`, the
    launching ops into `derived["lean-names"]` (read by `phases.launch_context`); (matched,
    activities with a step)."""
    names = lean_names(lean, full)
    dtype = lean.gpu.with_row_index("row").join(names.select("row", new="dtype"), on="row", how="left")
    lean.gpu = lean.gpu.with_columns(dtype=pl.coalesce(dtype["new"], dtype["dtype"]))
    if hasattr(lean.derived, "rebased"):  # cached tables: those made from now on are of the named trace
        lean.derived.rebased(f"named from {full.path} {getattr(full.derived, 'entry', '')}")
    lean.derived.clear()
    lean.derived["lean-names"] = names.select("row", "op")
    return int(names["matched"].sum()), names.height
