"""Naming a `lean` recording from the `full` step beside it (docs/metrics.md, "Lean items
named from the full step").

A lean (or `device`, `cupti`) trace holds kernels and at most runtime calls, no aten CPU ops
and no `record_param_comms`: a kernel's launching op and a collective's dtype are unknown. The
runner records one `full` step after the lean ones (OUT/<variant>/names/rank<r>…). The same
step runs the same kernels in the same order on each stream: each lean step is aligned with the
full step activity by activity (`align.aligned`), and an aligned activity takes the full one's
`op` and `dtype`. Unmatched activities keep null and are counted. A trace without runtime calls
(`cupti`) also keeps the full step's launch sites and host pieces (`align.host_context`), by
which `diff` names its idle gaps (`diff.idle_items`).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.align import aligned, host_context
from tracekit.analyses.phases import launch_context
from tracekit.core.model import Trace


def lean_names(lean: Trace, full: Trace) -> pl.DataFrame:
    """One row per lean GPU activity with a step (`row` into lean.gpu): `op`, `label` (its FSDP
    label with its unit, `FSDP::pre_forward (blocks.3)`) and `dtype` from the full trace's last
    step's activity it is aligned with (`full_row`, `align.aligned`; null where none), and
    `matched`."""
    context = launch_context(full).select(full_row="row", full_op="op", full_label=pl.when(pl.col("unit").is_null())
                                          .then("fsdp").otherwise(pl.format("{} ({})", "fsdp", "unit")))
    source = full.gpu.with_row_index("full_row").join(context, on="full_row").select(
        "full_row", "full_op", "full_label", full_dtype="dtype")
    mine = lean.gpu.with_row_index("row").select("row", "dtype").join(aligned(lean, full), on="row")
    joined = mine.join(source, on="full_row", how="left").with_columns(matched=pl.col("full_row").is_not_null())
    return joined.select("row", "full_row", op="full_op", label="full_label",
                         dtype=pl.coalesce("dtype", "full_dtype"), matched="matched").sort("row")


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
    lean.derived["lean-names"] = names.select("row", "op", "label")
    if lean.calls.height == 0:  # a `cupti` recording: its idle gaps are named from the full step
        lean.derived["aligned-sites"], lean.derived["aligned-host"] = host_context(names.select("row", "full_row"), full)
    return int(names["matched"].sum()), names.height
