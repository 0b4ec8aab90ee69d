"""Rendering reports: table | json | csv | md. No computation happens here.

A report is a list of (trace, frame) pairs, one frame row per step. In JSON, dotted column
names nest (`syncs.cudaEventSynchronize` → `{"syncs": {"cudaEventSynchronize": n}}`) and the
shape is shared by every per-rank, per-step verb:
`{"traces": [{"path", "rank", "world_size", "steps": [{"step", ...}]}]}`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from functools import partial

import polars as pl

from .views import (VIEWS, Layout, View, chosen, column_width, decimals, filled, kernel_column, path_text, paths_line,
                    short_chain, shown_name, table_text, terminal_width, with_figures)


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
                frame = frame.explode(col).with_columns(pl.col(col).name.prefix_fields(f"{col}.")).unnest(col)
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
    if fmt == "table" and f"{view}.items" in VIEWS and not (layout.columns or layout.wide):
        return steps_then_items(flat_table(report), view, layout)
    return render_frame(flat_table(report), fmt, view, layout)


def steps_then_items(frame: pl.DataFrame, view: str, layout: Layout) -> str:
    """The default table of a view of steps and their items (critical-path): one row per step
    with its figures (every share of its span: they add up to 100 %), then the steps' items
    (`VIEW.items`), so that neither crowds the other's names out of 100 columns."""
    items = [c for c in frame.columns if c.startswith("items.")]
    steps = frame.drop(items).unique(maintain_order=True)
    shown = [part for part in (render_frame(steps, "table", view, layout),
                               render_frame(frame, "table", f"{view}.items", layout)) if part]
    return "\n\n".join(shown)


def render_frame(frame: pl.DataFrame, fmt: str, view: str | None = None, layout: Layout = Layout()) -> str:
    """json rows and csv of every column at full precision and full text (nested columns as
    JSON text), md of every column for reading (`markdown`), or the terminal table of `view`
    (`views.py`)."""
    if fmt == "json":
        return json_text(frame.to_dicts())
    if fmt == "table":  # the intervals (`d_ms_ci`) in ms as every ms figure: [12.310, 18.582], not [12.31, 18.582]
        frame = frame.with_columns(pl.col(c).map_elements(interval_text, return_dtype=pl.String)
                                   for c, t in frame.schema.items() if t == pl.List(pl.Float64))
    frame = flattened(frame)
    if fmt == "csv":
        return with_whole_counts(frame).write_csv()
    if fmt == "table":
        shown = VIEWS.get(view, View())
        text, note = table_of(frame, shown, layout)
        if shown.kernel_names and "…" in text and not (layout.wide or layout.columns):  # elided for want of room only
            column = shown_name(shown.kernel_names[0], shown)
            longer = table_of(frame, shown, replace(layout, longest=roomier(text, column, layout.longest)))
            text, note = longer if max(map(len, longer[0].splitlines())) <= terminal_width() else (text, note)
        return text + note
    return markdown(frame, VIEWS.get(view, View()))


def roomier(text: str, column: str, longest: int) -> int:
    """How long the kernel names of the table `text` (their column: `column`) may be: what the
    terminal leaves beside the table more, or, where the column wraps (the table takes the
    terminal), two of its lines; `longest` at least."""
    room = terminal_width() - max(map(len, text.splitlines()))
    return max(longest, longest + room if room > 0 else 2 * column_width(text, column))


def table_of(frame: pl.DataFrame, shown: View, layout: Layout) -> tuple[str, str]:
    """The terminal table of `frame` in the view `shown` (`views.table_text`; with `--wide`, the
    paths above it) and the line under it: the rows with a figure, the columns blank in every
    row left out with a line saying so, the `telling` columns only where they fit; one line
    where no row has a figure."""
    picked = chosen(frame, shown, layout)
    table = with_figures(picked)
    if not table.height:
        return filled(shown.empty, terminal_width()), ""
    whole = whole_in_steps(picked, frame)
    blank = [] if layout.columns or layout.wide else blank_columns(table)
    zero = [] if layout.columns or layout.wide else zero_parts(table, shown.parts)
    table = table.drop(zero)
    text = table_text(table.drop(blank), whole=whole, wide=layout.wide)
    if shown.telling and max(map(len, text.splitlines())) > terminal_width():  # they fit, or --wide shows them
        table = with_figures(chosen(frame, replace(shown, telling={}, default=tuple(
            c for c in shown.default if c not in shown.telling)), layout))
        text = table_text(table.drop([c for c in [*blank, *zero] if c in table.columns]), whole=whole, wide=layout.wide)
    above = paths_line(frame) + "\n" if layout.wide and paths_line(frame) else ""
    notes = ([blank_note(blank)] if blank else []) + ([f"(not shown, 0.0 in every row: {', '.join(zero)})"] if zero else [])
    notes += [] if layout.columns else one_step(frame, table, shown)  # the columns chosen: no line of its own
    return above + text, "".join("\n" + filled(note, terminal_width()) for note in notes)


def one_step(frame: pl.DataFrame, table: pl.DataFrame, shown: View) -> list[str]:
    """The line that names the one step of a per-step table whose `step` column is not shown
    (it takes one value): `(not shown, the same in every row: step 3)`; none otherwise."""
    if "step" not in frame.columns or "step" in table.columns or "agg" not in shown.default or not shown.one_step:
        return []
    steps = frame["step"].drop_nulls().unique()
    return [f"(not shown, the same in every row: step {steps[0]})"] if steps.len() == 1 else []


def zero_parts(table: pl.DataFrame, parts: tuple[str, ...]) -> list[str]:
    """The table's `parts` (shares that add up to 100) that are 0 in every row: left out, saying so."""
    there = [c for c in parts if c in table.columns]
    if not there or not table.height:
        return []
    zero = table.select(pl.col(there).fill_null(0).eq(0).all()).row(0)
    return [c for c, z in zip(there, zero, strict=True) if z]


UNBLANKED = ("run", "rank", "step", "agg", "path", "variant")  # they name the row, blank or not


def blank_columns(table: pl.DataFrame) -> list[str]:
    """The table's columns with no value in any row (a CPU-only trace's device figures):
    the default table leaves them out, saying so in one line."""
    candidates = [c for c in table.columns if c not in UNBLANKED]
    if not candidates:
        return []
    empty = table.select(pl.col(candidates).cast(pl.String).fill_null("").eq("").all()).row(0)  # one query
    return [c for c, blank in zip(candidates, empty, strict=True) if blank]


BLANK_WHY = ((r"comm|coll|busbw|algbw|^pg$|transfer|^wait", "no communication in these steps"),
             (r"^op$", "no CPU op encloses the launches"), (r"tflops|pct_peak", "no FLOPs from recorded shapes"))


def blank_note(blank: list[str]) -> str:
    """The line under a table that left out the columns `blank`, saying why: a CPU-only run
    (no device), no communication, no enclosing op, no FLOPs, else that nothing records them."""
    if "device" in blank:
        return f"(not shown, blank in every row: {', '.join(blank)}; nothing here records them: a CPU-only run " \
               "has no device figures)"
    why: dict[str, list[str]] = {}
    for c in blank:
        why.setdefault(next((w for pattern, w in BLANK_WHY if re.search(pattern, c)), "nothing here records them"),
                       []).append(c)
    return "(not shown, blank in every row: " + "; ".join(f"{', '.join(cs)}: {w}" for w, cs in why.items()) + ")"


def whole_in_steps(table: pl.DataFrame, frame: pl.DataFrame) -> set[str]:
    """The table's float columns whose values are whole in every step's row: counts that a
    statistic row (`agg`: a mean of 4.5) made floats, shown as the integers they are — not a
    time, share or rate that happens to be whole (a `busy_pct` of 0.0 in every step)."""
    if "agg" not in frame.columns:
        return set()
    steps = table.filter(frame["agg"].is_null())
    return {c for c, t in table.schema.items() if t.is_float() and steps[c].drop_nulls().len() > 0
            and not MEASURE.search(c) and steps[c].drop_nulls().eq(steps[c].drop_nulls().round(0)).all()}


MEASURE = re.compile(r"(?:^|_)(?:ms|pct|gbps|tflops|peak|ci)(?:_|$)")  # a figure no count: never shown as an integer


def with_whole_counts(frame: pl.DataFrame) -> pl.DataFrame:
    """With a statistic row (`agg`): a float column whose values in the steps' rows are all
    whole — a count, made a float by a mean such as 4.5 — written with its whole values as
    integers (`4`, not `4.0`; the mean's `4.5` as it is)."""
    if "agg" not in frame.columns:
        return frame
    steps = frame.filter(pl.col("agg").is_null())

    def whole(c: str) -> bool:
        values = steps[c].drop_nulls()
        return values.len() > 0 and values.eq(values.round(0)).all()

    counts = [c for c, t in frame.schema.items() if t.is_float() and whole(c)]
    return frame.with_columns(
        pl.when(pl.col(c) == pl.col(c).round(0)).then(pl.col(c).cast(pl.Int64).cast(pl.String))
        .otherwise(pl.col(c).cast(pl.String)).alias(c) for c in counts)


def interval_text(bounds, sign: str = "") -> str:
    """An interval of ms, 3 decimals as every ms figure: `[12.310, 18.582]` (`sign` "+": signed);
    a bound that rounds to 0 reads `0.000`, never `-0.000` (a step's interval clipped at -0.0)."""
    return "[" + ", ".join(f"{0.0 if round(b, 3) == 0 else b:{sign},.3f}" for b in bounds) + "]"


MD_CELL = 120  # characters of a Markdown cell at most: longer text has its middle elided


def for_reading(frame: pl.DataFrame, view: View) -> pl.DataFrame:
    """`frame` as Markdown shows it: every column, times in ms (`*_ns` → `*_ms`, 3 decimals, as
    the table), `view`'s kernel names and blame chains short as the table shows them, and no
    text cell but a sentence (`view.prose`) past `MD_CELL` characters (its middle elided; json
    and csv keep it whole)."""
    def shown(name: str, dtype) -> pl.Expr:
        col = pl.col(name)
        if name in view.kernel_names:
            col = kernel_column(col, view.kernel_kinds)
        elif name in view.chains:
            col = short_chain(col)
        if dtype == pl.String and name not in view.prose:
            return pl.when(col.str.len_chars() > MD_CELL).then(
                col.str.slice(0, MD_CELL - 21) + "…" + col.str.slice(-20)).otherwise(col).alias(name)
        leaf = name.rsplit(".", 1)[-1]
        if dtype.is_numeric() and (leaf == "ns" or leaf.endswith("_ns")):
            return (col / 1e6).round(3).alias(name[:-2] + "ms")
        return col

    return frame.select(shown(c, t) for c, t in frame.schema.items())


def markdown(frame: pl.DataFrame, view: View = View()) -> str:
    """A Markdown table of every column, for reading (`for_reading`: ms, long text elided); a
    float column's values with the decimals the table gives it (`views.decimals`: 3 for ms, what
    the values need for shares and the rest), the same on every row, never `7.203514e6`; a
    missing value blank, not `null`."""
    frame = for_reading(frame, view)
    frame = frame.with_columns(pl.col(c).map_elements(partial(fixed, places=decimals(frame[c])), return_dtype=pl.String)
                               for c, t in frame.schema.items() if t.is_float())
    frame = frame.with_columns(pl.all().cast(pl.String).fill_null(""))
    with pl.Config(tbl_formatting="MARKDOWN", tbl_rows=-1, tbl_cols=-1, tbl_width_chars=65_000,
                   fmt_str_lengths=65_000, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        return str(frame)


def fixed(value: float, places: int) -> str:
    return f"{value:.{places}f}" if math.isfinite(value) else {"nan": "NaN"}.get(str(value), str(value))


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
    """The documented `tracekit diff` JSON object for one rank (or over ranks, rank null)."""
    doc = {"a": a_path, "b": b_path, "rank": diff.rank, "step": diff.a_step, "b_step": diff.b_step,
           "a_step_ns": diff.a_step_ns, "b_step_ns": diff.b_step_ns, "step_delta_ns": diff.step_delta_ns,
           "steps": diff.steps, "rounds": diff.rounds, "step_delta_ci_ns": diff.step_delta_ci_ns,
           "items": diff.items.to_dicts(), "syncs": diff.syncs.to_dicts(),
           "collectives": diff.collectives.to_dicts(), "launches": diff.launches.to_dicts()}
    if ranks:
        doc["ranks"] = [diff_doc(a_path, b_path, d) for d in ranks]
    return doc


def full_diff_doc(a_path: str, b_path: str, result, ranks: str = "each", lead: list[str] | None = None) -> dict:
    """`diff_doc` of a `RunDiff`: the top level over ranks (their mean with `ranks` "mean",
    else their sum), `rank_agg`, the lead, `same` (what makes A and B one trace, or None), and
    the real Δ with its reconciliation."""
    several = len(result.per_rank) > 1
    doc = diff_doc(a_path, b_path, result.shown("mean" if ranks == "mean" else "sum"),
                   result.per_rank if several else None)
    if several:
        doc["rank_agg"] = "mean" if ranks == "mean" else "sum"
    doc["lead"] = lead or []
    doc["same"] = result.same
    doc["pairing"] = result.pairing
    if result.real:
        doc["real"] = result.real
        doc["reconciliation"] = result.reconciled.to_dicts()
    return doc


def steps_text(steps: dict) -> str:
    """`step 2` when every rank used it, else `step 2 (rank 0), 3 (rank 1)`."""
    if len(set(steps.values())) == 1:
        return f"step {next(iter(steps.values()))}"
    return "step " + ", ".join(f"{s} (rank {r})" for r, s in sorted(steps.items()))


def diff_head(a_path: str, b_path: str, diff, result, ranks: str) -> str:
    """Which rank and step each side used, both times and the Δ, in ms."""
    if diff.rank is None:
        who = f"{'sum' if ranks == 'sum' else 'mean'} over {len(result.per_rank)} ranks"
        a_steps, b_steps = steps_text(result.steps_used("a")), steps_text(result.steps_used("b"))
    else:
        who, a_steps, b_steps = f"rank {diff.rank}", f"step {diff.a_step}", f"step {diff.b_step}"
    if diff.steps > 1:  # the mean over the steps both have, each item with its interval over rounds
        a_steps = b_steps = f"mean of {diff.steps} steps"
    noise = ""
    if diff.step_delta_ci_ns:
        over = "rounds" if result.pairing == "rounds" else "steps paired by number"
        noise = f" {interval_text([x / 1e6 for x in diff.step_delta_ci_ns], '+')} (95 %, over {diff.rounds} {over})"
    return (f"A {a_path} {a_steps}: {diff.a_step_ns / 1e6:,.3f} ms ({who})\n"
            f"B {b_path} {b_steps}: {diff.b_step_ns / 1e6:,.3f} ms\n"
            f"B − A: {diff.step_delta_ns / 1e6:+,.3f} ms{noise} = the sum of delta below")


def real_text(real: dict) -> str:
    """The timed steps' Δ and, where known, each side's profiler overhead and recorded ÷ timed
    step (of one rank per side, `real_delta`)."""
    sides = [(side, real.get(f"{side.lower()}_rank")) for side in "AB"
             if real.get(f"{side.lower()}_profiler_overhead") is not None]
    recorded = "".join(f"\n  {side} rank {rank} ({real[f'{side.lower()}_profile_mode'] or 'mode not recorded'}): "
                       f"{real[f'{side.lower()}_profiler_overhead']}×, {real[f'{side.lower()}_recorded_to_timed']}×"
                       for side, rank in sides)
    step = real["step"]
    return (f"real Δ (timed steps): B − A = {step['d_ms']:+.3f} ms {interval_text(step['d_ms_ci'], '+')} (95 %): "
            f"{step['verdict']}"
            + ("\nrecorded steps ÷ the unprofiled steps around them (the profiler's cost), ÷ the timed steps:"
               + recorded if recorded else "")
            + "\nB − A per phase, ms: real (the timed steps' timers), recorded (the recorded steps'"
            "\ntimers), attributed (the trace, mean rank) = device + idle:")


def diff_blocks(a_path: str, b_path: str, diff, result, ranks: str, fmt: str, layout: Layout) -> list[str]:
    """One diff's header (in a table, each line wrapped to the terminal after its path, the
    path relative or elided to fit a line: `path_text`), items,
    syncs, collectives and launches."""
    if fmt == "table":  # each path in a line of its own at most
        a_path, b_path = (path_text(p, terminal_width() - 2) for p in (a_path, b_path))
    head = diff_head(a_path, b_path, diff, result, ranks)
    if fmt == "table":
        head = "\n".join(filled(line, terminal_width(), "  ") for line in head.splitlines())
    parts = [head, render_frame(diff.items, fmt, "diff.items", layout)]
    per_rank = ", mean per rank" if diff.rank is None and ranks == "mean" else ""  # counts such as 4.5
    for title, frame in (("syncs", diff.syncs), ("collectives", diff.collectives), ("launches", diff.launches)):
        if frame.height:
            parts += [f"{title}{per_rank}:", render_frame(frame, fmt, f"diff.{title}", Layout(wide=layout.wide))]
    return parts


def lead_text(lead: list[str], items: pl.DataFrame, fmt: str) -> str:
    """The lead's sentences as one paragraph; in a table, filled to the terminal (`filled`) with
    each kernel's name as the items' table shows it (`kernel_column`: a Tensile GEMM's 600
    characters short), the full names being in json."""
    text = " ".join(lead)
    if fmt != "table":
        return text
    if "name" in items.columns:  # not with `--by fsdp`: no names to shorten
        view = VIEWS["diff.items"]
        names = (items.select("name", "kind").unique()  # each name shortened once, not once an item
                 .select("name", short=kernel_column(pl.col("name"), view.kernel_kinds)).unique("name"))
        for full, short in sorted(names.iter_rows(), key=lambda r: -len(r[0] or "")):
            if full and short and full != short:
                text = text.replace(full, short)
    return filled(text, terminal_width())


def render_diff(a_path: str, b_path: str, result, fmt: str, layout: Layout = Layout(), ranks: str = "each",
                lead: list[str] | None = None) -> str:
    """`tracekit diff` output (a `RunDiff`): JSON object, the items as CSV (with `rank` for
    `ranks` "each"), or the lead then a headed table/markdown — one per rank for "each"."""
    if fmt == "json":
        return json_text(full_diff_doc(a_path, b_path, result, ranks, lead))
    each = ranks == "each" and len(result.per_rank) > 1
    if fmt == "csv":
        if each:
            return pl.concat([d.items.select(pl.lit(d.rank).alias("rank"), pl.all()) for d in result.per_rank],
                             how="diagonal_relaxed").write_csv()
        return result.shown(ranks).items.write_csv()
    parts = [lead_text(lead, result.shown(ranks).items, fmt)] if lead else []
    if result.real:
        parts += [real_text(result.real), render_frame(result.reconciled, fmt, "diff.reconciliation", Layout(wide=layout.wide))]
    for diff in result.per_rank if each else [result.shown(ranks)]:
        parts += diff_blocks(a_path, b_path, diff, result, ranks, fmt, layout)
    return "\n\n".join(parts)
