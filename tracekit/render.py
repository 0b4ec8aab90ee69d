"""Rendering reports: table | json | csv | md. No computation happens here.

A report is a list of (trace, frame) pairs, one frame row per step. In JSON, dotted column
names nest (`syncs.cudaEventSynchronize` → `{"syncs": {"cudaEventSynchronize": n}}`) and the
shape is shared by every per-rank, per-step verb:
`{"traces": [{"path", "rank", "world_size", "steps": [{"step", ...}]}]}`.
"""

from __future__ import annotations

import json
import math

import polars as pl

from .views import VIEWS, Layout, View, chosen, table_text


def defined(value):
    """`value` with every NaN or infinite float (an undefined figure) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: defined(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [defined(v) for v in value]
    return value


def json_text(doc, indent: int | None = 1) -> str:
    """`doc` as strict JSON: an undefined figure (NaN, ±inf) is null, never `NaN`/`Infinity`."""
    return json.dumps(defined(doc), indent=indent, allow_nan=False)


def nest(row: dict) -> dict:
    """`{"a.b": 1}` → `{"a": {"b": 1}}`."""
    out: dict = {}
    for key, value in row.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def json_doc(report) -> dict:
    return {"traces": [
        {"path": t.path, "rank": t.rank, "world_size": t.world_size,
         "steps": [nest(row) for row in frame.to_dicts()]}
        for t, frame in report
    ]}


def flat_table(report) -> pl.DataFrame:
    """All traces' rows in one frame, path and rank in front. A list-of-records column (a
    ledger) becomes one row per record; a list of names is joined with " < " (innermost first);
    what is still nested is written as JSON text."""
    frames = []
    for t, frame in report:
        for col, dtype in frame.schema.items():
            if isinstance(dtype, pl.List) and isinstance(dtype.inner, pl.Struct):
                frame = frame.explode(col).unnest(col, separator=".")
        frame = frame.with_columns(pl.col(c).list.join(" < ") for c, dt in frame.schema.items()
                                   if isinstance(dt, pl.List) and dt.inner == pl.String)
        frames.append(flattened(frame).select(pl.lit(t.path).alias("path"), pl.lit(t.rank).alias("rank"), pl.all()))
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def flattened(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with every nested (list or struct) column written as JSON text."""
    return frame.with_columns(
        pl.col(c).map_elements(lambda v: json_text(v.to_list() if isinstance(v, pl.Series) else v, None),
                               return_dtype=pl.String)
        for c, dt in frame.schema.items() if isinstance(dt, (pl.List, pl.Struct)))


def render(report, fmt: str, view: str | None = None, layout: Layout = Layout()) -> str:
    """The report as text in `fmt`; the table shows `view`'s columns (`views.py`)."""
    if fmt == "json":
        return json_text(json_doc(report))
    return render_frame(flat_table(report), fmt, view, layout)


def render_frame(frame: pl.DataFrame, fmt: str, view: str | None = None, layout: Layout = Layout()) -> str:
    """json rows, csv and md of every column at full precision and full text (nested columns
    as JSON text), or the terminal table of `view` (`views.py`)."""
    if fmt == "json":
        return json_text(frame.to_dicts())
    frame = flattened(frame)
    if fmt == "csv":
        return frame.write_csv()
    if fmt == "table":
        return table_text(chosen(frame, VIEWS.get(view, View()), layout))
    with pl.Config(tbl_formatting="MARKDOWN", tbl_rows=-1, tbl_cols=-1, tbl_width_chars=65_000,
                   fmt_str_lengths=65_000, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        return str(frame)


def render_lint(per_trace, per_run, fmt: str, layout: Layout = Layout()) -> str:
    """`tracekit lint` output: `{"traces": [{path, rank, world_size, findings}], "runs":
    [{path, findings}]}` in JSON, else one row per finding."""
    if fmt == "json":
        return json_text({
            "traces": [{"path": t.path, "rank": t.rank, "world_size": t.world_size, "findings": f.to_dicts()}
                       for t, f in per_trace],
            "runs": [{"path": run.path, "findings": f.to_dicts()} for run, f in per_run]})
    rows = [f.select(pl.lit(t.path).alias("path"), pl.lit(t.rank, pl.Int64).alias("rank"), pl.all())
            for t, f in per_trace]
    rows += [f.select(pl.lit(run.path).alias("path"), pl.lit(None, pl.Int64).alias("rank"), pl.all())
             for run, f in per_run]
    return render_frame(pl.concat(rows, how="vertical_relaxed"), fmt, "lint", layout)


def diff_doc(a_path: str, b_path: str, diff, ranks: list | None = None) -> dict:
    """The documented `tracekit diff` JSON object for one rank (or the sum over ranks, rank null)."""
    doc = {"a": a_path, "b": b_path, "rank": diff.rank, "step": diff.a_step, "b_step": diff.b_step,
           "a_step_ns": diff.a_step_ns, "b_step_ns": diff.b_step_ns, "step_delta_ns": diff.step_delta_ns,
           "items": diff.items.to_dicts(), "syncs": diff.syncs.to_dicts(),
           "collectives": diff.collectives.to_dicts()}
    if ranks:
        doc["ranks"] = [diff_doc(a_path, b_path, d) for d in ranks]
    return doc


def render_diff(a_path: str, b_path: str, result, fmt: str, layout: Layout = Layout()) -> str:
    """`tracekit diff` output (a `RunDiff`): JSON object, the items as CSV, or a headed
    table/markdown."""
    diff = result.shown
    if fmt == "json":
        doc = diff_doc(a_path, b_path, diff, result.per_rank if len(result.per_rank) > 1 else None)
        if result.real:
            doc["real"] = result.real
            doc["reconciliation"] = result.reconciled.to_dicts()
        return json_text(doc)
    if fmt == "csv":
        return diff.items.write_csv()
    who = "all ranks (summed)" if diff.rank is None else f"rank {diff.rank}"
    head = (f"A {a_path} step {diff.a_step}: {diff.a_step_ns:,} ns\n"
            f"B {b_path} step {diff.b_step}: {diff.b_step_ns:,} ns\n"
            f"B − A ({who}): {diff.step_delta_ns:+,} ns = sum of delta_ns below")
    parts = [head]
    if result.real:
        u = result.real
        overhead = ", ".join(f"{side} {u[f'{side.lower()}_profiler_overhead']}× ({u[f'{side.lower()}_profile_mode']})"
                             for side in "AB" if u[f"{side.lower()}_profiler_overhead"] is not None)
        parts += [f"real Δ (timed steps): B − A = {u['step']['d_ms']:+.3f} ms {u['step']['d_ms_ci']} (95 %): "
                  f"{u['step']['verdict']}"
                  + (f"\nrecorded steps ÷ timed: {overhead}" if overhead else "")
                  + "\nB − A per phase, ms: real (the timed steps' timers), recorded (the recorded steps'"
                  "\ntimers), attributed (the trace, mean rank) = device + idle:",
                  render_frame(result.reconciled, fmt, "diff.reconciliation", layout)]
    parts.append(render_frame(diff.items, fmt, "diff.items", layout))
    for title, frame in (("syncs", diff.syncs), ("collectives", diff.collectives)):
        if frame.height:
            parts += [f"{title}:", render_frame(frame, fmt, f"diff.{title}", Layout(wide=layout.wide))]
    return "\n\n".join(parts)
