"""A recorded step aligned with the `full` step of its variant, and its idle gaps named by the
host work of that full step (docs/metrics.md, "Recorded steps named from the full step").

A `cupti` recording times the steps cheaply but holds device work only; the `full` step the
runner records after it (`OUT/<variant>/names/`) holds every host op, annotation and runtime
call and the same activities in the same order on each stream, at wrong times (~1.3× slower).
Its sequence is used, never its times.

- `aligned`: per recorded step and (device, stream), the activities' kernel identities
  (`names.kernel_identity`) in order of start, matched with the full trace's last step's on
  the same (device, stream): identical sequences one to one, else difflib's matching blocks
  (a longest common subsequence: what matches keeps its order, the rest is unmatched).
- `host_pieces`: the full step's host time on each thread, cut at every op boundary, each
  piece named `<op> in <annotation>`: the innermost annotation (`record_function` range:
  FSDP's, the optimizer's, a user's — not `ProfilerStep#N` nor the runner's `tracekit#<phase>`)
  and the outermost CPU op inside it; `<annotation>` alone where it runs no op, `<op>` where
  no annotation holds it; an annotation's unit (an FQN in parentheses) goes to `unit`.
- `gap_causes`: a gap of a recorded step lies between the activity that ended last before it
  (`prev`) and the one that starts first after it (`next`). In the full step the host work
  that separated their launches is that on `next`'s launching thread from the end of `prev`'s
  launch call to the start of `next`'s (from the full step's start where `prev` is of another
  step or none). The gap's recorded time is split among that window's names in proportion to
  their time in it (integer ns, largest remainder: the parts sum to the gap); window time in
  no op is `before <next's name>` (the host had not reached the launch). Where `next` was
  launched before `prev`'s launch ended, the host did not hold the device: `launched before
  the gap`. A gap whose `prev` or `next` is not aligned is not named here.
"""

from __future__ import annotations

import difflib

import polars as pl

from tracekit.core.model import Trace
from tracekit.core.names import kernel_identity

MARKS = r"^(ProfilerStep#|tracekit#)"  # the step's and the runner's phase marks: never a name
EARLY = "launched before the gap"
PLACE = ("device", "stream")


def matched_pairs(mine: list[str], theirs: list[str]) -> list[tuple[int, int]]:
    """(i, j) pairs of equal elements of two sequences, in order: all of them where the
    sequences are equal, else difflib's matching blocks (no junk heuristic)."""
    if mine == theirs:
        return [(i, i) for i in range(len(mine))]
    blocks = difflib.SequenceMatcher(None, mine, theirs, autojunk=False).get_matching_blocks()
    return [(b.a + k, b.b + k) for b in blocks for k in range(b.size)]


def in_sequence(gpu: pl.DataFrame, index: str) -> pl.DataFrame:
    """The activities with a step and their identity, by (device, stream) and start."""
    return (gpu.with_row_index(index).filter(pl.col("step").is_not_null())
            .select(index, "step", *PLACE, "start", identity=kernel_identity(pl.col("name")))
            .sort(*PLACE, "start", index))


def aligned(recorded: Trace, full: Trace) -> pl.DataFrame:
    """One row per activity of `recorded` with a step: `row` (into recorded.gpu) and
    `full_row` (into full.gpu: the activity of the full trace's last step it is aligned with,
    null where none)."""
    schema = {"row": pl.UInt32, "full_row": pl.UInt32}
    theirs = in_sequence(full.gpu, "full_row")
    theirs = theirs.filter(pl.col("step") == theirs["step"].max())
    by_place = {k: (g["identity"].to_list(), g["full_row"].to_list())
                for k, g in theirs.partition_by(*PLACE, as_dict=True).items()}
    mine = in_sequence(recorded.gpu, "row")
    rows, full_rows = [], []
    for (_, *place), group in mine.partition_by("step", *PLACE, as_dict=True, maintain_order=True).items():
        names, other_rows = by_place.get(tuple(place), ([], []))
        own = group["row"].to_list()
        pairs = dict(matched_pairs(group["identity"].to_list(), names))
        rows += own
        full_rows += [other_rows[pairs[i]] if i in pairs else None for i in range(len(own))]
    return pl.DataFrame({"row": rows, "full_row": full_rows}, schema=schema).sort("row")


def host_pieces(full: Trace) -> pl.DataFrame:
    """The host time of the full trace's last step on each thread cut at every boundary of its
    CPU ops and annotations, the pieces inside some op (`module docstring`): tid, start, end,
    name, op (the outermost CPU op inside the innermost annotation, or null), unit, label (that
    annotation without its unit). Adjacent
    pieces of one name are one."""
    schema = {"tid": pl.Int64, "start": pl.Int64, "end": pl.Int64, "name": pl.String, "op": pl.String,
              "unit": pl.String, "label": pl.String}
    if full.steps.height == 0:
        return pl.DataFrame(schema=schema)
    last = full.steps.sort("step").row(-1, named=True)
    ops = (full.ops.filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & ~pl.col("name").str.contains(MARKS)
                           & (pl.col("start") < last["cpu_end"]) & (pl.col("end") > last["cpu_start"]))
           .select("tid", "cat", "name", o_start=pl.col("start").clip(last["cpu_start"]),
                   o_end=pl.col("end").clip(upper_bound=last["cpu_end"])).filter(pl.col("o_end") > pl.col("o_start")))
    found = []
    for _, own in ops.partition_by("tid", as_dict=True).items():
        bounds = pl.concat([own["o_start"], own["o_end"]]).unique().sort()
        cuts = pl.DataFrame({"start": bounds[:-1], "end": bounds[1:]})
        found.append(cuts.join_where(own, pl.col("o_start") <= pl.col("start"), pl.col("o_end") >= pl.col("end")))
    if not found:
        return pl.DataFrame(schema=schema)
    covering = pl.concat(found)
    annotation = (covering.filter(pl.col("cat") == "user_annotation")
                  .sort("tid", "start", "o_start", "o_end", descending=[False, False, True, False])
                  .group_by("tid", "start", maintain_order=True).agg(a_name=pl.col("name").first(),
                                                                     a_start=pl.col("o_start").first()))
    op = (covering.join(annotation, on=["tid", "start"], how="left")
          .filter((pl.col("cat") == "cpu_op") & (pl.col("a_start").is_null() | (pl.col("o_start") >= pl.col("a_start"))))
          .sort("tid", "start", "o_start", "o_end", descending=[False, False, False, True])
          .group_by("tid", "start", maintain_order=True).agg(op=pl.col("name").first()))
    named = (covering.select("tid", "start", "end").unique().join(annotation, on=["tid", "start"], how="left")
             .join(op, on=["tid", "start"], how="left")
             .with_columns(label=pl.col("a_name").str.replace(r" \(.*\)$", ""),
                           unit=pl.col("a_name").str.extract(r"\((.*)\)$", 1))
             .select("tid", "start", "end", "op", "unit", "label",
                     name=pl.when(pl.col("op").is_not_null() & pl.col("label").is_not_null())
                     .then(pl.format("{} in {}", "op", "label")).otherwise(pl.coalesce("op", "label")))
             .sort("tid", "start"))
    run = ((pl.col("start") != pl.col("end").shift(1)) | (pl.col("name") != pl.col("name").shift(1))
           | (pl.col("unit").ne_missing(pl.col("unit").shift(1)))
           | (pl.col("label").ne_missing(pl.col("label").shift(1)))).over("tid").fill_null(True).cum_sum()
    return (named.with_columns(run=run).group_by("run", maintain_order=True)
            .agg(pl.col("tid").first(), pl.col("start").first(), pl.col("end").last(), pl.col("name").first(),
                 pl.col("op").first(), pl.col("unit").first(), pl.col("label").first())
            .select(*schema).cast(schema))


def launch_sites(full: Trace, pieces: pl.DataFrame) -> pl.DataFrame:
    """Per activity of the full trace's last step with a launching call: full_row, the call's
    l_tid, l_start, l_end, and the host piece the launch lies in (`at_name`, `at_op`,
    `at_unit`; null outside any op); `f_start`, the step's start (ns of the full trace)."""
    last = full.steps.sort("step").row(-1, named=True)
    calls = full.calls.select("correlation", l_tid="tid", l_start="start", l_end="end").unique("correlation")
    sites = (full.gpu.with_row_index("full_row").filter(pl.col("step") == last["step"])
             .select("full_row", "correlation").join(calls, on="correlation").drop("correlation").sort("l_start"))
    at = pieces.select(l_tid="tid", p_start="start", p_end="end", at_name="name", at_op="op", at_unit="unit",
                       at_label="label").sort("p_start")
    return (sites.join_asof(at, left_on="l_start", right_on="p_start", by="l_tid", strategy="backward",
                             check_sortedness=False)
            .with_columns([pl.when(pl.col("p_end") > pl.col("l_start")).then(c).alias(c)
                           for c in ("at_name", "at_op", "at_unit", "at_label")])
            .select("full_row", "l_tid", "l_start", "l_end", "at_name", "at_op", "at_unit", "at_label",
                    f_start=pl.lit(last["cpu_start"], pl.Int64)).sort("full_row"))


def host_context(pairs: pl.DataFrame, full: Trace) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What `gap_causes` reads of the full step for a recorded trace aligned with it (`pairs`:
    row, full_row, as `aligned` gives them): (the recorded activities' launch sites —
    `launch_sites` by `row`, aligned ones only —, the full step's `host_pieces`)."""
    pieces = host_pieces(full)
    sites = pairs.join(launch_sites(full, pieces), on="full_row")
    return sites.sort("row"), pieces


def gap_causes(gaps: pl.DataFrame, gpu: pl.DataFrame, sites: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """The gaps (`gap` id, step, start, end, and `device` — and `stream` — where they are a
    device's (a stream's): else any device's activities bound them) named by the host work of the full step (module docstring):
    one row per part — gap, cause (`host: <name>` or `launched before the gap`), op, unit,
    label (the annotation, unit stripped), ns
    (the parts of a gap sum to its end − start). `gpu`: the recorded trace's activities;
    `sites`/`pieces`: `host_context`. Gaps that cannot be named have no row."""
    by = [c for c in PLACE if c in gaps.columns] or None
    acts = gpu.with_row_index("row").select("row", "step", *PLACE, "start", "end")
    keep = [*(by or []), "row", "step"]
    prev = acts.select(*keep, "end").rename({"row": "p_row", "step": "p_step", "end": "p_end"}).sort("p_end")
    nxt = acts.select(*keep, "start").rename({"row": "n_row", "step": "n_step", "start": "n_start"}).sort("n_start")
    ends = sites.select("row", "l_tid", "l_start", "l_end", "at_name", "at_op", "at_unit", "at_label", "f_start")
    bounded = (gaps.sort("start").join_asof(prev, left_on="start", right_on="p_end", by=by, strategy="backward",
                                          check_sortedness=False)
               .sort("end").join_asof(nxt, left_on="end", right_on="n_start", by=by, strategy="forward",
                                        check_sortedness=False)
               .with_columns(p_row=pl.when(pl.col("p_step") == pl.col("step")).then("p_row"))
               .join(ends.select(p_row="row", p_end_call="l_end"), on="p_row", how="left")
               .join(ends.rename({"row": "n_row"}), on="n_row", how="inner")  # next aligned
               .filter((pl.col("n_step") == pl.col("step")) & (pl.col("p_row").is_null() | pl.col("p_end_call").is_not_null()))
               .with_columns(w0=pl.coalesce("p_end_call", "f_start"), w1=pl.col("l_start"), ns=pl.col("end") - pl.col("start")))
    early = bounded.filter(pl.col("w1") <= pl.col("w0")).select(
        "gap", cause=pl.lit(EARLY), op=pl.lit(None, pl.String), unit=pl.lit(None, pl.String),
        label=pl.lit(None, pl.String), ns="ns")
    windows = (bounded.filter(pl.col("w1") > pl.col("w0"))
               .select("l_tid", "w0", "w1", "at_name", "at_op", "at_unit", "at_label").unique())
    inside = (windows.join_where(pieces, pl.col("end") > pl.col("w0"), pl.col("start") < pl.col("w1"))
              .filter(pl.col("tid") == pl.col("l_tid"))
              .group_by("l_tid", "w0", "w1", "name", "op", "unit", "label")
              .agg(weight=(pl.min_horizontal("end", "w1") - pl.max_horizontal("start", "w0")).sum()))
    before = (windows.join(inside.group_by("l_tid", "w0", "w1").agg(busy=pl.col("weight").sum()),
                           on=["l_tid", "w0", "w1"], how="left")
              .select("l_tid", "w0", "w1", name=pl.format("before {}", pl.coalesce("at_name", pl.lit("the next launch"))),
                      op="at_op", unit="at_unit", label="at_label", weight=pl.col("w1") - pl.col("w0") - pl.col("busy").fill_null(0))
              .filter(pl.col("weight") > 0))
    parts = (bounded.filter(pl.col("w1") > pl.col("w0")).select("gap", "l_tid", "w0", "w1", "ns")
             .join(pl.concat([inside, before], how="vertical_relaxed"), on=["l_tid", "w0", "w1"]))
    named = split(parts).select("gap", cause=pl.format("host: {}", "name"), op="op", unit="unit", label="label",
                                ns="share")
    return pl.concat([named, early]).sort("gap", "ns", "cause", descending=[False, True, False])


def split(parts: pl.DataFrame) -> pl.DataFrame:
    """Each gap's `ns` split among its parts in proportion to their `weight`: `share`, integer
    ns by largest remainder (floors first, the ns left over one each to the largest remainders,
    ties by name), summing exactly to `ns`."""
    exact = pl.col("ns") * pl.col("weight")
    total = pl.col("weight").sum().over("gap")
    floor = exact // total
    parts = parts.sort("gap", "name", "op", "unit", nulls_last=True).with_columns(floor=floor, rest=exact % total)
    left = pl.col("ns") - pl.col("floor").sum().over("gap")
    rank = pl.col("rest").rank("ordinal", descending=True).over("gap")
    return parts.with_columns(share=pl.col("floor") + (rank <= left).cast(pl.Int64))


def named_gaps(trace: Trace, gaps: pl.DataFrame) -> pl.DataFrame:
    """`gap_causes` of `gaps` of a trace named from its full step (`naming.named` keeps the
    `host_context` on it); no row for any other trace."""
    if "aligned-sites" not in trace.derived:
        return pl.DataFrame(schema={"gap": gaps.schema["gap"], "cause": pl.String, "op": pl.String, "unit": pl.String,
                                    "label": pl.String, "ns": pl.Int64})
    return gap_causes(gaps, trace.gpu, trace.derived["aligned-sites"], trace.derived["aligned-host"])


GAP = "stream gap, launch not recorded"  # path_graph's kind of a device-only capture's stream gap


def path_gap_items(trace: Trace, edges: pl.LazyFrame) -> pl.DataFrame:
    """The stream gaps among critical-path `edges` (step, start, end, kind; `edge`: their row
    index) of a trace named from its full step, named by the host work between the launches
    around them (`gap_causes` on their stream: the one whose activity ends where the gap
    starts): per part, edge, step, category `waiting`, kind `stream gap`, name (the cause),
    ns. Gaps that cannot be named have no row; of a trace not so named, `edges` is not read."""
    if "aligned-sites" not in trace.derived:
        return pl.DataFrame(schema={"edge": pl.UInt32, "step": pl.Int64, "category": pl.String, "kind": pl.String,
                                    "name": pl.String, "ns": pl.Int64})
    gaps = (edges.with_row_index("gap").filter(pl.col("kind") == GAP).select("gap", "step", "start", "end")
            .collect())
    ends = trace.gpu.select("step", *PLACE, start="end").unique(["step", "start"], keep="first")
    causes = named_gaps(trace, gaps.join(ends, on=["step", "start"]))
    return causes.join(gaps.select("gap", "step"), on="gap").select(
        edge="gap", step="step", category=pl.lit("waiting"), kind=pl.lit("stream gap"),
        name="cause", ns="ns")
