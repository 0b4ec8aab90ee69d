"""`tracekit breakdown`: an exact partition of each step's GPU span.

The span [first start, last end) of the GPU activities a step launched is cut at every
boundary (GPU activity and host event starts and ends) into elementary segments. A segment
goes to the highest-priority category active in it: compute (non-collective kernels) >
comm (collective kernels) > memcpy > memset > idle. Comm is split by collective kind. An idle
segment is split by what the host was doing meanwhile, in this order: GPU work of another
step running, blocked in a host sync (which API), inside a launch call (`launch:` for
kernel launches, copies and memsets; `runtime:` for other runtime/driver calls), inside a
CPU op (the outermost one, `ProfilerStep#` excluded), or nothing recorded.
Parts are integer ns and add up exactly to the span.

Item shares: within a segment every activity of the winning category gets len / n_active of
it, so a kernel's share is what the step would lose if it vanished while the others stayed.
Shares are rounded by largest remainder so that each category's shares sum exactly to its
part; idle parts are their own items. Sum of all shares == span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analyses.syncs import SYNC_APIS
from tracekit.model import Trace

PRIORITY = ("compute", "comm", "memcpy", "memset")
LAUNCH = r"Launch|Memcpy|Memset"  # idle inside these calls is `launch:`, else `runtime:`


def _active(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Number of intervals covering each elementary segment [bounds[i], bounds[i+1])."""
    delta = np.zeros(len(bounds) + 1, dtype=np.int64)
    np.add.at(delta, np.searchsorted(bounds, starts), 1)
    np.add.at(delta, np.searchsorted(bounds, ends), -1)
    return np.cumsum(delta)[: len(bounds) - 1]


def _largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integers with the same sum `total`, each the floor of its share or one more."""
    base = np.floor(shares).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        base[np.argsort(-(shares - base), kind="stable")[:short]] += 1
    return base


@dataclass(frozen=True)
class StepSlice:
    """What the partition of one step looks at, clipped to the step's span: its own GPU
    activities (`row` indexes trace.gpu), other steps' GPU activities, runtime/driver calls,
    and CPU ops (`ProfilerStep#` left out)."""

    own: pl.DataFrame
    others: pl.DataFrame
    calls: pl.DataFrame
    ops: pl.DataFrame


def step_slices(trace: Trace, steps: list[int] | None = None) -> dict[int, StepSlice]:
    """StepSlice of every step with GPU work (or of `steps`), cut from the tables in one join
    per table rather than one filter per step."""
    gpu = trace.gpu.with_row_index("row")
    assigned = gpu.filter(pl.col("step").is_not_null() & (pl.col("step").is_in(steps) if steps else True))
    spans = assigned.group_by("step").agg(lo=pl.col("start").min(), hi=pl.col("end").max()).rename(
        {"step": "span"})

    def overlapping(frame: pl.DataFrame, exclude_own: bool = False) -> dict[int, pl.DataFrame]:
        pairs = frame.join_where(spans, pl.col("start") < pl.col("hi"), pl.col("end") > pl.col("lo"))
        if exclude_own:
            pairs = pairs.filter(pl.col("step").is_null() | (pl.col("step") != pl.col("span")))
        pairs = pairs.with_columns(start=pl.col("start").clip(pl.col("lo"), pl.col("hi")),
                                   end=pl.col("end").clip(pl.col("lo"), pl.col("hi")))
        return {key[0]: part.drop("lo", "hi") for key, part in pairs.partition_by("span", as_dict=True).items()}

    own = {key[0]: part for key, part in assigned.partition_by("step", as_dict=True).items()}
    others = overlapping(gpu, exclude_own=True)
    calls = overlapping(trace.calls)
    ops = overlapping(trace.ops.filter(~pl.col("name").str.starts_with("ProfilerStep#")))
    empty = {"others": gpu.clear(), "calls": trace.calls.clear(), "ops": trace.ops.clear()}
    return {step: StepSlice(own[step], others.get(step, empty["others"]), calls.get(step, empty["calls"]),
                            ops.get(step, empty["ops"])) for step in sorted(own)}


def step_segments(trace: Trace, step: int) -> pl.DataFrame:
    """One step's segments (`slice_segments`)."""
    return slice_segments(step_slices(trace, [step])[step])


def slice_segments(piece: StepSlice) -> pl.DataFrame:
    """The step span's elementary segments: start, end, category, cause, and how many of the
    step's activities of each category are active (n_compute, n_comm, n_memcpy, n_memset)."""
    own, others, ops = piece.own, piece.others, piece.ops
    syncs = piece.calls.filter(pl.col("name").is_in(SYNC_APIS))
    launches = piece.calls.filter(~pl.col("name").is_in(SYNC_APIS))
    bounds = np.unique(np.concatenate([
        frame[col].to_numpy() for frame in (own, piece.calls, others, ops) for col in ("start", "end")]))
    category = np.full(len(bounds) - 1, "idle", dtype=object)
    cause = np.full(len(bounds) - 1, None, dtype=object)
    counts = {}
    for cat in reversed(PRIORITY):
        part = own.filter(pl.col("category") == cat)
        counts[cat] = _active(bounds, part["start"].to_numpy(), part["end"].to_numpy())
        category[counts[cat] > 0] = cat
    idle = category == "idle"
    seg = pl.DataFrame({"seg": np.arange(len(bounds) - 1), "start": bounds[:-1], "end": bounds[1:]})
    causes = _idle_causes(seg.filter(pl.Series(idle)), others, syncs, launches, ops)
    cause[idle] = "nothing recorded"
    cause[causes["seg"].to_numpy()] = causes["cause"].to_numpy()
    comm_kind = _winning_comm_kind(own, bounds, category)
    cause[category == "comm"] = comm_kind[category == "comm"]
    return seg.drop("seg").with_columns(
        category=pl.Series(category.tolist(), dtype=pl.String), cause=pl.Series(cause.tolist(), dtype=pl.String),
        **{f"n_{cat}": pl.Series(counts[cat]) for cat in PRIORITY})


def step_partition(trace: Trace, step: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(parts, items) of one step (`slice_partition`)."""
    return slice_partition(step_slices(trace, [step])[step])


def slice_partition(piece: StepSlice) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(parts, items) of one step. parts: category, cause, ns. items: row (index into
    `trace.gpu`) or idle cause, category, cause, share_ns."""
    segments = slice_segments(piece).with_columns(ns=pl.col("end") - pl.col("start"))
    parts = segments.group_by("category", "cause").agg(pl.col("ns").sum())
    bounds = np.append(segments["start"].to_numpy(), segments["end"][-1])
    seg_len, category = segments["ns"].to_numpy(), segments["category"].to_numpy()
    own = piece.own
    items = [_idle_items(parts)]
    for cat in PRIORITY:
        part = own.filter(pl.col("category") == cat)
        if part.height == 0:
            continue
        per_seg = np.where(category == cat, seg_len / np.maximum(segments[f"n_{cat}"].to_numpy(), 1), 0.0)
        prefix = np.concatenate([[0.0], np.cumsum(per_seg)])
        i0 = np.searchsorted(bounds, part["start"].to_numpy())
        i1 = np.searchsorted(bounds, part["end"].to_numpy())
        total = int(seg_len[category == cat].sum())
        items.append(pl.DataFrame({
            "row": part["row"], "category": cat, "cause": part["coll_kind"],
            "share_ns": _largest_remainder(prefix[i1] - prefix[i0], total)}))
    order = {c: i for i, c in enumerate([*PRIORITY, "idle"])}
    parts = parts.sort(pl.col("category").replace_strict(order), pl.col("ns"), descending=[False, True])
    return parts, pl.concat(items, how="diagonal_relaxed")


def _idle_items(parts: pl.DataFrame) -> pl.DataFrame:
    return parts.filter(pl.col("category") == "idle").select(
        pl.lit(None, pl.UInt32).alias("row"), "category", "cause", pl.col("ns").alias("share_ns"))


def _winning_comm_kind(own: pl.DataFrame, bounds: np.ndarray, category: np.ndarray) -> np.ndarray:
    """For each segment, the collective kind active in it (the first kind found, by name)."""
    kind = np.full(len(category), None, dtype=object)
    comm = own.filter(pl.col("category") == "comm").with_columns(pl.col("coll_kind").fill_null("other"))
    for name in comm["coll_kind"].unique().sort(descending=True):
        rows = comm.filter(pl.col("coll_kind") == name)
        kind[_active(bounds, rows["start"].to_numpy(), rows["end"].to_numpy()) > 0] = name
    return kind


def _idle_causes(segments: pl.DataFrame, others, syncs, launches, ops) -> pl.DataFrame:
    """(seg, cause) for idle segments covered by something, highest priority first: other
    step's GPU work > the outermost runtime/driver call (sync, launch, other) > the outermost
    CPU op. Segments are elementary (cut at every host event's ends), so an outermost event
    either covers a segment or misses it."""
    if segments.height == 0:
        return pl.DataFrame(schema={"seg": pl.Int64, "cause": pl.String})
    name = pl.col("h_name")
    calls = _outermost_covering(segments, pl.concat([syncs, launches]))
    op = _outermost_covering(segments, ops).select("seg", cause=pl.lit("cpu_op: ") + name)
    call = calls.select("seg", cause=pl.when(name.is_in(SYNC_APIS)).then(pl.lit("sync: ") + name)
                        .when(name.str.contains(LAUNCH)).then(pl.lit("launch: ") + name)
                        .otherwise(pl.lit("runtime: ") + name))
    bounds = segments["start"].to_numpy()
    busy = _active(np.append(bounds, segments["end"][-1]), others["start"].to_numpy(), others["end"].to_numpy()) > 0
    other = segments.filter(pl.Series(busy)).select("seg", cause=pl.lit("other step's GPU work"))
    ranked = pl.concat([other.with_columns(rank=3), call.with_columns(rank=2), op.with_columns(rank=1)])
    return ranked.sort("seg", "rank", descending=[False, True]).unique("seg", keep="first", maintain_order=True).drop("rank")


def _outermost_covering(segments: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """(seg, h_name, h_start): per segment, the earliest-starting of the outermost intervals
    (those not inside another on the same thread) covering it."""
    if intervals.height == 0:
        return pl.DataFrame(schema={"seg": pl.Int64, "h_name": pl.String, "h_start": pl.Int64})
    reach = pl.col("h_end").cum_max().shift(1).over("tid")
    outer = (intervals.select("tid", h_start="start", h_end="end", h_name="name")
             .sort("tid", "h_start", pl.col("h_end"), descending=[False, False, True])
             .filter(reach.is_null() | (pl.col("h_start") >= reach))
             .sort("h_start"))
    left = segments.join(outer.select("tid").unique(), how="cross").sort("start")
    hit = left.join_asof(outer, left_on="start", right_on="h_start", by="tid", strategy="backward",
                         check_sortedness=False)
    return (hit.filter(pl.col("h_end") >= pl.col("end")).sort("seg", "h_start")
            .unique("seg", keep="first", maintain_order=True).select("seg", "h_name", "h_start"))


def breakdown(trace: Trace) -> pl.DataFrame:
    """One row per step: span_ns and parts [{category, cause, ns}] with sum(ns) == span_ns."""
    rows = []
    for step, piece in step_slices(trace).items():
        parts, _ = slice_partition(piece)
        rows.append({"step": step, "span_ns": int(parts["ns"].sum()), "parts": parts.to_dicts()})
    schema = {"step": pl.Int64, "span_ns": pl.Int64,
              "parts": pl.List(pl.Struct({"category": pl.String, "cause": pl.String, "ns": pl.Int64}))}
    table = pl.DataFrame(rows, schema=schema)
    return trace.steps.select("step").join(table, on="step", how="left").sort("step")
