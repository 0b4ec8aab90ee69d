"""The one timeline: every time figure of every verb is a projection of it.

For each device and step, the span [first start, last end) of the device activities the step
launched is cut at every start and end of them and of other device work on that device into
elementary segments; idle segments are cut further at the starts and ends of the outermost
host calls and CPU ops, so that one cause holds over each. Per segment: how many of the
step's activities of each category run (`n_compute`, `n_comm`, `n_memcpy`, `n_memset`), the
category the partition gives it — the highest-priority one running: compute > comm > memcpy
> memset, else idle; the step's communication while compute of another step (or of none) runs
on the device is hidden, not exposed: compute, cause `other step's GPU work`, no activity's
share — and its `cause`: the collective kind of a comm segment (the first kind by name when
several run); for an idle one, highest priority first, `other step's GPU work`
(device work of another step, or of none, running) · `sync: <api>` · `launch: <api>` ·
`runtime: <api>` (a runtime/driver call covering it that no other call of its thread
contains; of several, on several threads, the last to start) · `cpu_op: <name>` (likewise a
CPU op or annotation, `ProfilerStep#` and Python frames left out) · `python: <frame>` (the
innermost Python frame that says something, `innermost_frames`) · `nothing recorded`.

The `trace` scope cuts each device's whole-trace span the same way, every device activity of
the trace its own (step null), in steps or not, launch record or not: what HTA counts, and
TraceLens with `--include_unlinked_kernels`. The `launched` scope is the same but leaves out
device work whose launch is not in the trace (launched before profiling started: `tracekit
lint` counts it), as TraceLens' default `gpu_timeline` does.

Shares: within a segment every activity of the winning category gets len / n_active of it;
each (device, step, category)'s shares are rounded by largest remainder to integers that sum
exactly to its part. Compute on one device never hides communication on another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl  # numpy is imported by the functions that build a timeline: a command that reads
# the timeline from the trace cache does not import it (`benchmarks/README.md`, the warm command)

from tracekit.core.model import Trace

PRIORITY = ("compute", "comm", "memcpy", "memset")  # highest first; a code is its index
COMPUTE, COMM, IDLE = 0, 1, len(PRIORITY)
SYNC_APIS = (
    "cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize",
    "cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize",
    "hipEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize",
    "cudaMemcpy", "hipMemcpy", "hipMemcpyWithStream",
)
LAUNCH = r"Launch|Memcpy|Memset"  # idle inside these calls is `launch:`, else `runtime:`
OTHER_WORK = "other step's GPU work"
SEGMENT_SCHEMA = {"step": pl.Int64, "device": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                  **{f"n_{c}": pl.Int64 for c in PRIORITY}, "category": pl.String, "cause": pl.String}


@dataclass(frozen=True)
class Timeline:
    """`coarse`: step, device, start, end, n_compute, n_comm, n_memcpy, n_memset, category,
    cause, other (another step's work running) — disjoint, covering each (device, step) span
    exactly; idle segments not yet cut at host boundaries (cause null): every figure but the
    idle causes. `segments`: the same with idle segments cut and given their causes (made on
    first use). `shares`: row (index into `trace.gpu`), step, device, category, cause,
    share_ns for every activity: they cover the segments but the idle ones and those of the
    step's comm hidden by another step's compute (`unshared`)."""

    coarse: pl.DataFrame
    shares: pl.DataFrame
    trace: Trace = field(repr=False)
    scope: str = "step"

    @property
    def segments(self) -> pl.DataFrame:
        return kept(self.trace, f"timeline-{self.scope}-segments", lambda: with_idle_causes(self.coarse, self.trace))


def kept(trace: Trace, key: str, make):
    """`trace.derived[key]`, made once (and, through the trace cache, kept for later commands)."""
    if key not in trace.derived:
        trace.derived[key] = make()
    return trace.derived[key]


def timeline(trace: Trace, scope: str = "step") -> Timeline:
    """The trace's timeline in `scope` (`step` | `trace` | `launched`), built once and kept on
    the trace."""
    if f"timeline-{scope}-coarse" not in trace.derived or f"timeline-{scope}-shares" not in trace.derived:
        trace.derived[f"timeline-{scope}-coarse"], trace.derived[f"timeline-{scope}-shares"] = build(trace, scope)
    return Timeline(trace.derived[f"timeline-{scope}-coarse"], trace.derived[f"timeline-{scope}-shares"], trace, scope)


def with_idle_causes(coarse: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    idle = pl.col("category") == "idle"
    return (pl.concat([coarse.filter(~idle), idle_causes(coarse.filter(idle), trace)])
            .sort("device", "step", "start", nulls_last=False))


def activities(trace: Trace, scope: str) -> pl.DataFrame:
    """The device activities a scope sees, with `row` (index into trace.gpu) and device 0 where
    the trace names none: `step` — those of a step; `trace` — every one, step null;
    `launched` — every one but those with a correlation id that no call of the trace has
    (launched before profiling started), step null."""
    gpu = trace.gpu.with_row_index("row").with_columns(pl.col("device").fill_null(0))
    if scope == "step":
        return gpu
    if scope == "launched":
        launched = gpu.join(trace.calls.select("correlation").unique(), on="correlation", how="semi")
        gpu = pl.concat([launched, gpu.filter(pl.col("correlation").is_null())]).sort("row")
    return gpu.with_columns(step=pl.lit(None, pl.Int64))


def build(trace: Trace, scope: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(coarse segments, shares) of the scope."""
    import numpy as np

    acts = activity_arrays(activities(trace, scope))
    pieces, shares = [], []
    for (device, step), own in acts.groups(own_steps=scope == "step"):
        others = acts.others(device, step, own) if scope == "step" else None
        seg, share = sweep(acts, own, others)
        pieces.append((device, step, seg))
        shares.append(pl.DataFrame({
            "row": acts.row[own], "category": pl.Series(acts.category_names[own].tolist(), dtype=pl.String),
            "cause": pl.Series(acts.kind[own].tolist(), dtype=pl.String), "share_ns": share}).with_columns(
            step=pl.lit(step, pl.Int64), device=pl.lit(device, pl.Int64)))
    segments = coarse(pieces)
    share_schema = {"row": pl.UInt32, "category": pl.String, "cause": pl.String, "share_ns": pl.Int64,
                    "step": pl.Int64, "device": pl.Int64}
    shares = pl.concat(shares) if shares else pl.DataFrame(schema=share_schema)
    return segments, shares.select(list(share_schema))


@dataclass
class Activities:
    """The trace's device activities as numpy arrays (in `trace.gpu` order); `by_device`:
    each device's activity indices sorted by start, `longest`: its longest activity (ns)."""

    row: np.ndarray
    device: np.ndarray
    step: np.ndarray  # -1 for none
    category: np.ndarray  # index into PRIORITY
    category_names: np.ndarray
    kind: np.ndarray  # collective kind (object), None for non-comm
    start: np.ndarray
    end: np.ndarray
    by_device: dict
    longest: dict

    def groups(self, own_steps: bool):
        """((device, step or None), indices of its activities) per device and step, or per
        device alone (`own_steps` False: the trace scope)."""
        import numpy as np

        step = self.step if own_steps else np.full(len(self.row), -1)
        idx = np.flatnonzero(step >= 0) if own_steps else np.arange(len(self.row))
        if len(idx) == 0:
            return
        order = idx[np.lexsort((self.start[idx], step[idx], self.device[idx]))]
        change = (np.diff(self.device[order]) != 0) | (np.diff(step[order]) != 0)
        for part in np.split(order, np.flatnonzero(change) + 1):
            s = int(step[part[0]])
            yield (int(self.device[part[0]]), s if s >= 0 else None), part

    def others(self, device: int, step: int, own: np.ndarray) -> np.ndarray:
        """Indices of the device's activities of other steps (or none) overlapping own's span."""
        import numpy as np

        lo, hi = self.start[own].min(), self.end[own].max()
        on_device = self.by_device[device]
        starts = self.start[on_device]
        window = on_device[np.searchsorted(starts, lo - self.longest[device]):np.searchsorted(starts, hi)]
        return window[(self.end[window] > lo) & (self.step[window] != step)]


def activity_arrays(gpu: pl.DataFrame) -> Activities:
    import numpy as np

    device, start, end = gpu["device"].to_numpy(), gpu["start"].to_numpy(), gpu["end"].to_numpy()
    by_device, longest = {}, {}
    for d in distinct(device):
        idx = np.flatnonzero(device == d)
        by_device[int(d)] = idx[np.argsort(start[idx], kind="stable")]
        longest[int(d)] = int((end[idx] - start[idx]).max())
    return Activities(
        row=gpu["row"].to_numpy(), device=device, step=gpu["step"].fill_null(-1).to_numpy(),
        category=gpu["category"].replace_strict({c: i for i, c in enumerate(PRIORITY)}, return_dtype=pl.Int8).to_numpy(),
        category_names=gpu["category"].to_numpy(), kind=gpu["coll_kind"].to_numpy(), start=start, end=end,
        by_device=by_device, longest=longest)


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (`np.unique`, by a sort: numpy 2.x's hash-based unique took
    30-60x longer on 0.4M int64 timestamps)."""
    import numpy as np

    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def active(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Number of intervals covering each elementary segment [bounds[i], bounds[i+1])."""
    import numpy as np

    delta = np.zeros(len(bounds) + 1, dtype=np.int64)
    np.add.at(delta, np.searchsorted(bounds, starts), 1)
    np.add.at(delta, np.searchsorted(bounds, ends), -1)
    return np.cumsum(delta)[: len(bounds) - 1]


def largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
    """Integers with the sum `total`, each the floor of its share or one more."""
    import numpy as np

    base = np.floor(shares).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        base[np.argsort(-(shares - base), kind="stable")[:short]] += 1
    return base


def sweep(acts: Activities, own: np.ndarray, others: np.ndarray | None) -> tuple[dict, np.ndarray]:
    """One (device, step) span: its elementary segments (bounds, counts per category, `other`
    running, category code, comm kind) and each own activity's share (integer ns)."""
    import numpy as np

    s, e, cat = acts.start[own], acts.end[own], acts.category[own]
    lo, hi = s.min(), e.max()
    parts = [s, e]
    if others is not None and len(others):
        parts += [np.clip(acts.start[others], lo, hi), np.clip(acts.end[others], lo, hi)]
    bounds = distinct(np.concatenate(parts))
    length = np.diff(bounds)
    counts = np.stack([active(bounds, s[cat == c], e[cat == c]) for c in range(IDLE)])
    running = counts > 0
    category = np.where(running.any(axis=0), running.argmax(axis=0), IDLE)
    other, other_compute = np.zeros(len(length), bool), np.zeros(len(length), bool)
    if others is not None and len(others):
        other = active(bounds, acts.start[others], acts.end[others]) > 0
        computing = others[acts.category[others] == COMPUTE]
        other_compute = active(bounds, acts.start[computing], acts.end[computing]) > 0
    category[(category == COMM) & other_compute] = COMPUTE  # comm hidden by another step's compute
    kind = np.full(len(length), None, dtype=object)
    comm = cat == COMM
    for name in sorted({k for k in acts.kind[own][comm] if k is not None}, reverse=True):
        pick = comm & (acts.kind[own] == name)
        kind[active(bounds, s[pick], e[pick]) > 0] = name
    kind[category != COMM] = None
    share = np.zeros(len(own), dtype=np.int64)
    i0, i1 = np.searchsorted(bounds, s), np.searchsorted(bounds, e)
    for c in range(IDLE):
        mine = cat == c
        if not mine.any():
            continue
        wins = (category == c) & (counts[c] > 0)  # not comm hidden by another step's compute
        per_segment = np.where(wins, length / np.maximum(counts[c], 1), 0.0)
        prefix = np.concatenate([[0.0], np.cumsum(per_segment)])
        share[mine] = largest_remainder(prefix[i1[mine]] - prefix[i0[mine]], int(length[wins].sum()))
    return {"start": bounds[:-1], "end": bounds[1:], "counts": counts, "category": category,
            "other": other, "kind": kind}, share


def coarse(pieces: list) -> pl.DataFrame:
    """All groups' segments in one table, sorted; a comm segment's cause is its kind."""
    import numpy as np

    if not pieces:
        return pl.DataFrame(schema={**SEGMENT_SCHEMA, "other": pl.Boolean})
    sizes = [len(seg["start"]) for _, _, seg in pieces]
    cat = np.concatenate([seg["category"] for _, _, seg in pieces])
    frame = pl.DataFrame({
        "step": np.repeat(np.array([-1 if s is None else s for _, s, _ in pieces]), sizes),
        "device": np.repeat(np.array([d for d, _, _ in pieces]), sizes),
        "start": np.concatenate([seg["start"] for _, _, seg in pieces]),
        "end": np.concatenate([seg["end"] for _, _, seg in pieces]),
        **{f"n_{c}": np.concatenate([seg["counts"][i] for _, _, seg in pieces]) for i, c in enumerate(PRIORITY)},
        "category": np.array([*PRIORITY, "idle"])[cat],
        "cause": pl.Series(np.concatenate([seg["kind"] for _, _, seg in pieces]).tolist(), dtype=pl.String),
        "other": np.concatenate([seg["other"] for _, _, seg in pieces]),
    })
    return frame.with_columns(
        pl.col("cause").fill_null(pl.when(pl.col("category") == "comm").then(pl.lit("other"))
                                  .when((pl.col("category") == "compute") & (pl.col("n_compute") == 0))
                                  .then(pl.lit(OTHER_WORK))),
        step=pl.when(pl.col("step") >= 0).then(pl.col("step")),
    ).sort("device", "step", "start", nulls_last=False).select(*SEGMENT_SCHEMA, "other")


def unshared(segments: pl.DataFrame) -> pl.DataFrame:
    """The segments no activity of their step has a share of: idle ones, and the step's comm
    hidden by another step's compute (category compute, no compute of the step running)."""
    return segments.filter((pl.col("category") == "idle")
                           | ((pl.col("category") == "compute") & (pl.col("n_compute") == 0)))


# Of the ops enclosing an interval, the innermost first (sort descending, ascending,
# descending): the latest start, then the earliest end, then the later row of trace.ops (a child
# whose µs-rounded start and end equal its parent's, as `aten::_local_scalar_dense` inside
# `aten::item`, is written after it). A total order: no choice rests on how a sort orders ties.
INNERMOST_FIRST = ("o_start", "o_end", "o_row")


def outermost(intervals: pl.DataFrame) -> pl.DataFrame:
    """The intervals no other of their thread contains: tid, start, end, name (of two with the
    same bounds, the later in the trace is the one inside). Per thread, sorted by start, their
    ends rise too."""
    reach = pl.col("end").cum_max().shift(1).over("tid")
    return (intervals.select("tid", "start", "end", "name")
            .sort("tid", "start", pl.col("end"), descending=[False, False, True], maintain_order=True)
            .filter(reach.is_null() | (pl.col("end") > reach)))


def host_layers(trace: Trace) -> list[tuple[pl.DataFrame, str]]:
    """The outermost runtime/driver calls, the outermost CPU ops and annotations (ProfilerStep#
    and Python frames left out) and the innermost Python frames (`innermost_frames`), each
    with the cause it names; calls first, then ops (they win)."""
    name = pl.col("name")
    calls = kept(trace, ("host", "calls"), lambda: outermost(trace.calls).with_columns(
        cause=pl.when(name.is_in(SYNC_APIS)).then(pl.lit("sync: ") + name)
        .when(name.str.contains(LAUNCH)).then(pl.lit("launch: ") + name).otherwise(pl.lit("runtime: ") + name)))
    frame = pl.col("cat") == "python_function"
    ops = kept(trace, ("host", "ops-not-frames"), lambda: outermost(
        trace.ops.filter(~name.str.starts_with("ProfilerStep#") & ~frame)).with_columns(
        cause=pl.lit("cpu_op: ") + name))
    frames = kept(trace, ("host", "frames"), lambda: innermost_frames(
        trace.ops.filter(frame).with_columns(name=short_frame(name))).with_columns(cause=pl.lit("python: ") + name))
    return [calls, ops, frames]


# Python frames that say nothing of what the program does: the interpreter's entry points
SILENT_FRAME = r"(^|: )<frozen runpy>|(^|: )<string>\(|runpy\.py\(|\): <module>$"


def short_frame(name: pl.Expr) -> pl.Expr:
    """A Python frame's name as tracekit shows it, the same on every machine and run: its file
    by its last two path components (`/sgl-workspace/sglang/…/model_executor/cuda_graph_runner.py
    (1333): replay` → `model_executor/cuda_graph_runner.py(1333): replay`), a bound builtin
    without its object's address (`<built-in method layer_norm of type object at 0x7499…>` →
    `<built-in method layer_norm>`)."""
    return (name.str.replace(r"^(<built-in (?:method|function) [\w.]+) of .*>$", "$1>")
            .str.replace(r"^[^ (]*/([^/ (]+/[^/ (]+\(\d+\): )", "$1"))


def innermost_frames(frames: pl.DataFrame) -> pl.DataFrame:
    """Nested intervals (tid, start, end, name: Python frames, annotations) flattened per thread
    into disjoint ones, each named for the innermost frame there that says something (not
    `SILENT_FRAME`; where none does, the outermost): tid, start, end, name. A frame that
    outlives its parent is cut at the parent's end."""
    out: dict[str, list] = {"tid": [], "start": [], "end": [], "name": []}

    def emit(tid, start, end, name):
        if start >= end:
            return
        if out["tid"] and out["tid"][-1] == tid and out["end"][-1] == start and out["name"][-1] == name:
            out["end"][-1] = end  # one piece with its neighbour of the same name
            return
        for k, v in zip(out, (tid, start, end, name)):
            out[k].append(v)

    rows = frames.select("tid", "start", "end", "name", says=~pl.col("name").str.contains(SILENT_FRAME)) \
        .sort("tid", "start", pl.col("end"), descending=[False, False, True], maintain_order=True)
    stack: list[tuple[int, str]] = []  # (end, the name it gives) of the frames open at `cursor`
    tid, cursor = None, 0
    for t, start, end, name, says in rows.iter_rows():
        if t != tid:
            while stack:
                top_end, top = stack.pop()
                emit(tid, cursor, top_end, top)
                cursor = max(cursor, top_end)
            tid, cursor = t, start
        while stack and stack[-1][0] <= start:
            top_end, top = stack.pop()
            emit(t, cursor, top_end, top)
            cursor = max(cursor, top_end)
        if stack:
            emit(t, cursor, start, stack[-1][1])
            end = min(end, stack[-1][0])
        cursor = start
        stack.append((end, stack[-1][1] if stack and not says else name))
    while stack:
        top_end, top = stack.pop()
        emit(tid, cursor, top_end, top)
        cursor = max(cursor, top_end)
    return pl.DataFrame(out, schema={"tid": frames.schema.get("tid", pl.Int64), "start": pl.Int64, "end": pl.Int64,
                                     "name": pl.String})


def outermost_ops(trace: Trace) -> pl.DataFrame:
    """The CPU ops (ProfilerStep# left out) no other of their thread contains (`outermost`)."""
    ops = trace.ops.select("tid", "start", "end", "name")  # the filter copies only what `outermost` reads
    return outermost(ops.filter(~pl.col("name").str.starts_with("ProfilerStep#")))


def idle_causes(idle: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    """Idle segments cut at every boundary of the outermost host calls and ops, each piece
    with its cause."""
    import numpy as np

    if idle.height == 0:
        return idle
    layers = host_layers(trace)
    cuts = distinct(np.concatenate([np.zeros(0, np.int64)] + [f[c].to_numpy() for f in layers for c in ("start", "end")]))
    a, b = idle["start"].to_numpy(), idle["end"].to_numpy()
    i0, i1 = np.searchsorted(cuts, a, "right"), np.searchsorted(cuts, b, "left")
    n = i1 - i0 + 1  # pieces per segment: the cuts strictly inside it, plus one
    seg = np.repeat(np.arange(len(a)), n)
    pos = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    edges = np.concatenate([cuts, [0]])  # a dummy last entry for the index arithmetic below
    start = np.where(pos == 0, a[seg], edges[i0[seg] + pos - 1])
    end = np.where(pos == n[seg] - 1, b[seg], edges[np.minimum(i0[seg] + pos, len(cuts))])
    # each piece's cause as a row of `causes`: nothing recorded, another step's work, a layer's row
    causes = pl.concat([pl.Series("cause", ["nothing recorded", OTHER_WORK], pl.String)]
                       + [layer["cause"].rename("cause") for layer in layers])
    found = idle["other"].to_numpy()[seg]
    code = found.astype(np.int64)
    offset = 2
    for layer in layers:
        hit = covering(layer, start, end)
        take = ~found & (hit >= 0)
        code[take] = offset + hit[take]
        found |= take
        offset += layer.height
    return idle[seg].with_columns(start=pl.Series(start), end=pl.Series(end), cause=causes.gather(code))


def covering(layer: pl.DataFrame, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each [start, end): the row of `layer` (outermost intervals) that covers it and
    started last, over all threads (of equal starts, the lowest thread id); -1 where none does.
    Within a thread the last to start before `start` has the latest end, so it alone is checked."""
    import numpy as np

    best = np.full(len(start), -1)
    best_start = np.full(len(start), np.iinfo(np.int64).min)
    tids = layer["tid"].to_numpy()
    for tid in distinct(tids):
        rows = np.flatnonzero(tids == tid)
        s, e = layer["start"].to_numpy()[rows], layer["end"].to_numpy()[rows]
        j = np.searchsorted(s, start, "right") - 1
        ok = (j >= 0) & (e[np.maximum(j, 0)] >= end)
        better = ok & (s[np.maximum(j, 0)] > best_start)
        best[better] = rows[j[better]]
        best_start[better] = s[j[better]]
    return best


def figures(segments: pl.DataFrame) -> pl.DataFrame:
    """Per (step, device), every time figure the verbs report (ns), read off the segments:
    span, busy (anything of the step running), idle, comm (the step's collectives running),
    compute (the step's compute running), overlap (the step's collectives running while any
    compute runs on the device, whichever step launched it: the partition gives such time to
    compute), exposed comm (collectives running with no compute at all: the partition's comm
    parts), comm alone (collectives running with no other device work at all, of any step),
    and overlap_pct = overlap / comm × 100 (null without comm)."""
    ns = pl.col("end") - pl.col("start")
    comm, compute = pl.col("n_comm") > 0, pl.col("n_compute") > 0
    alone = comm & ~compute & (pl.col("n_memcpy") == 0) & (pl.col("n_memset") == 0) & ~pl.col("other")
    return (segments.group_by("step", "device", maintain_order=True).agg(
        gpu_span_ns=ns.sum(), gpu_busy_ns=ns.filter(pl.col("category") != "idle").sum(),
        idle_ns=ns.filter(pl.col("category") == "idle").sum(),
        comm_ns=ns.filter(comm).sum(), compute_ns=ns.filter(compute).sum(),
        overlap_ns=ns.filter(comm & (pl.col("category") == "compute")).sum(),
        exposed_comm_ns=ns.filter(pl.col("category") == "comm").sum(), comm_alone_ns=ns.filter(alone).sum(),
        gpu_start=pl.col("start").min(), gpu_end=pl.col("end").max())
        .with_columns(overlap_pct=pl.when(pl.col("comm_ns") > 0)
                      .then((pl.col("overlap_ns") / pl.col("comm_ns") * 100).round(2))))


def busy_during(intervals: pl.DataFrame, segments: pl.DataFrame) -> np.ndarray:
    """For each interval (start, end): ns of it during which any device ran anything
    (segments that are not idle, on any device)."""
    import numpy as np

    busy = segments.filter(pl.col("category") != "idle")
    if intervals.height == 0 or busy.height == 0:
        return np.zeros(intervals.height, dtype=np.int64)
    bs, be = busy["start"].to_numpy(), busy["end"].to_numpy()
    s, e = intervals["start"].to_numpy(), intervals["end"].to_numpy()
    bounds = distinct(np.concatenate([bs, be, s, e]))
    covered = np.where(active(bounds, bs, be) > 0, np.diff(bounds), 0)
    prefix = np.concatenate([[0], np.cumsum(covered)])
    return prefix[np.searchsorted(bounds, e)] - prefix[np.searchsorted(bounds, s)]


HOST_WORK = r"^(cpu_op|python|launch|runtime): "  # idle causes where the host is busy with its own work


def host_idle(segments: pl.DataFrame) -> pl.DataFrame:
    """Per (step, device): `host_idle_ns`, the idle time while the host is in CPU ops or
    launch/runtime calls (not blocked in a sync, not nothing recorded) — the device waiting
    for the host. `host_bound`: that is more than half of the span."""
    ns = pl.col("end") - pl.col("start")
    return segments.group_by("step", "device").agg(
        host_idle_ns=ns.filter((pl.col("category") == "idle") & pl.col("cause").str.contains(HOST_WORK)).sum(),
        span=ns.sum()).with_columns(host_bound=pl.col("host_idle_ns") * 2 > pl.col("span")).drop("span")
