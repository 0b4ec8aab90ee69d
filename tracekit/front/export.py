"""Perfetto export: a trace (or run, or two variants side by side) with what the analyses
found, written as a Perfetto protobuf trace through the `perfetto` package's streaming
builder (`StreamingTraceProtoBuilder`): packets go to the file as they are made, and a run is
loaded one rank at a time.

Per rank, one process with these tracks:
- `CPU thread <tid>`: CPU ops, annotations and runtime calls, nested as in the source;
- `GPU <device> stream <stream>`: one slice per kernel, memcpy and memset (args: correlation,
  External id, step, category, bytes, grid/block, collective args);
- `GPU annotations`, `cuda_sync (CUPTI)`: the source's GPU-side records;
- `tracekit: steps` (ProfilerStep windows);
- per device, `tracekit: GPU span · GPU d` (each step's span), `tracekit: exposed comm · GPU
  d`, `tracekit: overlapped comm · GPU d`, `tracekit: idle · GPU d` (with its cause): the step
  timeline's segments (`analyses/timeline.py`), each slice with its `step`, so the slices of
  one step add up to the span, exposed comm, overlap and idle figures of `summary` and
  `breakdown`. A step whose span overlaps an earlier one's (device work lagging) goes to a
  second set of these tracks (`· 2`), so that slices never nest;
  `tracekit: host syncs` (blocked time, GPU idle time, blame);
- `tracekit: critical path`: each step's critical path (`analyses/critical_path.py`), one
  slice per stretch of it, named `<category>: <what spent it>` (host op, runtime call,
  kernel, or the kind of wait), args step, category, kind;
- counters `tracekit: GPU activities running` and `tracekit: collectives in flight`, from the
  trace-scope timeline's counts.
Beside a rank whose memory step was recorded (`tracekit profile`), a process `memory step ·
rank r · <variant>` with counters of the bytes allocated and reserved over that step.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackDescriptor, TrackEvent, TracePacket
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from tracekit.analyses.critical_path import path_edges
from tracekit.analyses.diff import VIEWS, RunDiff
from tracekit.analyses.syncs import host_syncs
from tracekit.analyses.timeline import figures, timeline
from tracekit.core.errors import TraceError
from tracekit.core.model import Trace

SEQUENCE = 1
GPU_ARGS = ("correlation", "ext_id", "step", "category", "bytes", "grid", "block", "collective", "dtype",
            "in_nelems", "out_nelems", "pg_name")


class PerfettoWriter:
    """Tracks and slices into a Perfetto trace file, one packet at a time."""

    def __init__(self, file):
        self.builder = StreamingTraceProtoBuilder(file)
        self.uuid = 0
        self.pid = 0
        self.first = True

    def _packet(self) -> TracePacket:
        packet = self.builder.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        if self.first:
            packet.sequence_flags = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return packet

    def process(self, name: str) -> int:
        self.uuid += 1
        self.pid += 1
        packet = self._packet()
        track = packet.track_descriptor
        track.uuid, track.process.pid, track.process.process_name = self.uuid, self.pid, name
        track.child_ordering = TrackDescriptor.EXPLICIT
        self.builder.write_packet(packet)
        return self.uuid

    def track(self, parent: int, name: str, rank: int, counter: bool = False) -> int:
        self.uuid += 1
        packet = self._packet()
        track = packet.track_descriptor
        track.uuid, track.parent_uuid, track.name, track.sibling_order_rank = self.uuid, parent, name, rank
        if counter:
            track.counter.SetInParent()
        self.builder.write_packet(packet)
        return self.uuid

    def _event(self, track: int, ts: int, kind, name: str | None = None, args: dict | None = None):
        packet = self._packet()
        packet.timestamp = int(ts)
        event = packet.track_event
        event.type, event.track_uuid = kind, track
        if name is not None:
            event.name = name
        for key, value in (args or {}).items():
            if value is None:
                continue
            note = event.debug_annotations.add()
            note.name = key
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                note.string_value = str(value)
            elif isinstance(value, int):
                note.int_value = value
            else:
                note.double_value = value
        self.builder.write_packet(packet)

    def slices(self, track: int, frame: pl.DataFrame, shift: int, arg_columns=()) -> None:
        """Slices from `frame` (start, end, name, args), nested: a slice that starts inside
        another is clipped to its parent's end."""
        stack: list[int] = []
        for row in frame.sort("start", pl.col("end"), descending=[False, True]).iter_rows(named=True):
            start, end = row["start"] + shift, row["end"] + shift
            while stack and stack[-1] <= start:
                self._event(track, stack.pop(), TrackEvent.TYPE_SLICE_END)
            if stack:
                end = min(end, stack[-1])
            self._event(track, start, TrackEvent.TYPE_SLICE_BEGIN, row["name"], {c: row[c] for c in arg_columns})
            stack.append(end)
        while stack:
            self._event(track, stack.pop(), TrackEvent.TYPE_SLICE_END)

    def counter(self, track: int, times: np.ndarray, values: np.ndarray, shift: int) -> None:
        for ts, value in zip(times.tolist(), values.tolist()):
            packet = self._packet()
            packet.timestamp = ts + shift
            packet.track_event.type, packet.track_event.track_uuid = TrackEvent.TYPE_COUNTER, track
            packet.track_event.counter_value = value
            self.builder.write_packet(packet)


def counter_values(segments: pl.DataFrame, running: pl.Expr) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) of a counter: `running` at each segment's start, 0 at each gap."""
    segments = segments.sort("start").with_columns(value=running)
    gaps = segments.filter(pl.col("end") != pl.col("start").shift(-1).fill_null(-1))
    times = np.concatenate([segments["start"].to_numpy(), gaps["end"].to_numpy()])
    values = np.concatenate([segments["value"].to_numpy(), np.zeros(gaps.height, np.int64)])
    order = np.argsort(times, kind="stable")
    return times[order], values[order]


def merged_segments(segments: pl.DataFrame, keep: pl.Expr, name: pl.Expr) -> pl.DataFrame:
    """Runs of adjacent segments of one step that satisfy `keep` and share `name`, as slices
    (start, end, name, step)."""
    chosen = segments.with_columns(name=name).filter(keep)
    new_run = ((pl.col("start") != pl.col("end").shift(1)) | (pl.col("name") != pl.col("name").shift(1))
               | (pl.col("step") != pl.col("step").shift(1))).fill_null(True)
    return (chosen.with_columns(run=new_run.cum_sum())
            .group_by("run", maintain_order=True).agg(pl.col("name", "step").first(), pl.col("start").min(),
                                                      pl.col("end").max()))


def lanes(spans: pl.DataFrame) -> dict[tuple, int]:
    """(device, step) → a lane such that the spans of one lane never overlap (a step's device
    work that lags into the next step's would otherwise nest on one track)."""
    ends: dict[int, list[int]] = {}
    out = {}
    for device, step, start, end in spans.sort("gpu_start").select("device", "step", "gpu_start", "gpu_end").iter_rows():
        free = ends.setdefault(device, [])
        lane = next((i for i, last in enumerate(free) if last <= start), len(free))
        free[lane:lane + 1] = [end]
        out[(device, step)] = lane
    return out


def write_trace(writer: PerfettoWriter, trace: Trace, label: str, shift: int) -> None:
    """One rank as one process; `shift` (ns) is added to every time."""
    shift += trace.origin_us * 1000
    process = writer.process(label)
    order = 0

    def track(name, counter=False):
        nonlocal order
        order += 1
        return writer.track(process, name, order, counter)

    for tid in trace.ops["tid"].unique().sort().to_list():
        ops = trace.ops.filter(pl.col("tid") == tid).select("start", "end", "name", "ext_id")
        calls = trace.calls.filter(pl.col("tid") == tid).select("start", "end", "name", "correlation")
        writer.slices(track(f"CPU thread {tid}"), pl.concat([ops, calls], how="diagonal"), shift,
                      ("ext_id", "correlation"))
    gpu = trace.gpu.with_columns(pl.col("device").fill_null(0), pl.col("stream").fill_null(-1))
    for device, stream in gpu.select("device", "stream").unique().sort("device", "stream").iter_rows():
        rows = gpu.filter((pl.col("device") == device) & (pl.col("stream") == stream))
        writer.slices(track(f"GPU {device} stream {stream}"), rows, shift, GPU_ARGS)
    for cat, title in (("gpu_user_annotation", "GPU annotations"), ("cuda_sync", "cuda_sync (CUPTI)")):
        marks = trace.marks.filter(pl.col("cat") == cat)
        if marks.height:
            writer.slices(track(title), marks.select("start", "end", "name", "correlation"), shift, ("correlation",))
    writer.slices(track("tracekit: steps"), trace.steps.select(
        pl.col("cpu_start").alias("start"), pl.col("cpu_end").alias("end"),
        pl.format("ProfilerStep#{}", "step").alias("name")), shift)
    segments = timeline(trace).segments
    if segments.height:
        spans = figures(segments)
        lane_of = lanes(spans)
        lane = pl.struct("device", "step").map_elements(lambda k: lane_of[(k["device"], k["step"])],
                                                        return_dtype=pl.Int64)
        spans = spans.with_columns(lane=lane).select(
            "device", "lane", "step", pl.col("gpu_start").alias("start"), pl.col("gpu_end").alias("end"),
            pl.format("step {}", "step").alias("name"))
        segments = segments.with_columns(lane=lane)
        for (device, n), part in sorted(segments.partition_by("device", "lane", as_dict=True).items()):
            where = f" · GPU {device}" + (f" · {n + 1}" if n else "")
            mine = spans.filter((pl.col("device") == device) & (pl.col("lane") == n))
            writer.slices(track("tracekit: GPU span" + where), mine, shift, ("step",))
            for title, keep, name in (
                ("tracekit: exposed comm", pl.col("category") == "comm", pl.format("exposed {}", "cause")),
                ("tracekit: overlapped comm", (pl.col("category") == "compute") & (pl.col("n_comm") > 0),
                 pl.lit("comm overlapped by compute")),
                ("tracekit: idle", pl.col("category") == "idle", pl.format("idle: {}", "cause")),
            ):
                writer.slices(track(title + where), merged_segments(part.sort("step", "start"), keep, name), shift,
                              ("step",))
    syncs = host_syncs(trace)
    if syncs.height:
        writer.slices(track("tracekit: host syncs"), syncs.select(
            "start", "end", pl.col("api").alias("name"), "blocked_ns", "gpu_idle_ns",
            pl.col("blame").list.join(" < ").alias("blame")), shift, ("blocked_ns", "gpu_idle_ns", "blame"))
    path = path_edges(trace).filter(pl.col("end") > pl.col("start"))
    if path.height:
        writer.slices(track("tracekit: critical path"), path.select(
            "start", "end", "step", "category", "kind",
            name=pl.format("{}: {}", "category", pl.coalesce("name", "kind"))), shift, ("step", "category", "kind"))
    whole = timeline(trace, "trace").coarse
    if whole.height:
        for device in whole["device"].unique().sort().to_list():
            on_device = whole.filter(pl.col("device") == device)
            writer.counter(track(f"tracekit: GPU {device} activities running", counter=True), *counter_values(
                on_device, pl.sum_horizontal("n_compute", "n_comm", "n_memcpy", "n_memset")), shift)
            if (on_device["n_comm"] > 0).any():
                writer.counter(track(f"tracekit: GPU {device} collectives in flight", counter=True),
                               *counter_values(on_device, pl.col("n_comm")), shift)


def write_memory(writer: PerfettoWriter, file: str, trace: Trace) -> None:
    """The memory step recorded beside a rank's trace (`<variant>/memory/rank<r>.json.gz`), if
    any: a process `memory step · rank r · <variant>` with counters of the bytes allocated and
    reserved, on the trace's clock (the record's wall-clock ns less the trace's base time)."""
    from tracekit.analyses.memory import live_curve
    from tracekit.core.memory_files import memory_beside, read_json

    beside = memory_beside(file)
    if beside is None:
        return
    record = read_json(beside)
    shift = -(trace.meta.get("base_time_ns") or 0)
    process = writer.process(f"memory step · rank {trace.rank} · {Path(file).parent.name}")
    curve = live_curve(record.blocks)
    curve = curve.with_columns(t_ns=curve["t_ns"].clip(record.start_ns))  # what was live before, from the start
    writer.counter(writer.track(process, "tracekit: memory allocated (bytes)", 1, counter=True),
                   curve["t_ns"].to_numpy(), curve["allocated_bytes"].to_numpy(), shift)
    if record.reserved.height:
        writer.counter(writer.track(process, "tracekit: memory reserved (bytes)", 2, counter=True),
                       record.reserved["t_ns"].to_numpy(), record.reserved["reserved_bytes"].to_numpy(), shift)


def write_atomically(path, write) -> None:
    """Call write(file) on a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(PerfettoWriter(f))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def export_traces(paths: list, out, options: dict, rank: int | None = None) -> tuple[int, dict[str, list[str]]]:
    """Every trace file under `paths` (or `rank`'s only), one process per rank, loaded one at a
    time, of a worker with several profiling cycles the one `options["cycle"]` names (as
    `files.cycles_by_name` chooses); nothing is written when no trace is of `rank`. (The
    traces written, each written cycle's file → every cycle of its worker.)"""
    from tracekit.core.files import cycles_by_name, runs_in, trace_files
    from tracekit.core.loading import NotATrace, load_traces

    written, others, chosen = 0, {}, []
    for run in (run for p in paths for run in runs_in(p)):
        files, more = cycles_by_name(trace_files(run), options.get("cycle", "last"))
        chosen += files
        others.update(more)

    def write(writer):
        nonlocal written
        for file in chosen:
            try:
                traces = load_traces(file, comm_kernels=options["comm_kernels"], cache=options["cache"])
            except NotATrace:
                continue
            for trace in traces:
                if rank is None or trace.rank == rank:
                    write_trace(writer, trace, f"rank {trace.rank} · {'/'.join(file.rstrip('/').rsplit('/', 2)[-2:])}", 0)
                    write_memory(writer, file, trace)
                    written += 1
        if rank is not None and not written:
            raise TraceError(", ".join(map(str, paths)), f"no trace of rank {rank}")
    write_atomically(out, write)
    return written, others


def export_diff(a_traces: list[Trace], b_traces: list[Trace], diff: RunDiff, labels: tuple[str, str], out,
                top: int) -> None:
    """A and B as two groups of processes, each rank's step span starting at the same time,
    with a track per top GPU diff item (largest |delta| over all ranks, idle left out) marking
    where its activities ran on each side. The diffs (`diff.diff_runs`) carry each side's items."""
    by_rank = {d.rank: d for d in diff.per_rank}
    top_items = diff.together.all_items.filter(pl.col("kind") != "idle").head(top)
    # (side, trace, label, the diff shown for its rank, its compared step's span start)
    sides = []
    for side, traces, label in (("a", a_traces, labels[0]), ("b", b_traces, labels[1])):
        for trace in traces:
            shown = by_rank.get(trace.rank, diff.together)
            step = shown.a_step if side == "a" else shown.b_step
            sides.append((side, trace, label, shown, step_span_start(trace, step)))
    # every side's step span starts at one time: 1 s, or later where a step starts later into its
    # trace (a recording in rounds), so that no event lands before 0
    base = max(1_000_000_000, *(start for *_, start in sides))

    def write(writer):
        for side, trace, label, shown, start in sides:
            shift = base - start  # on the trace's own times
            write_trace(writer, trace, f"{side.upper()} {label} · rank {trace.rank}", shift - trace.origin_us * 1000)
            if trace.rank in by_rank:
                _item_tracks(writer, trace, shown.a_items if side == "a" else shown.b_items, top_items, side, shift)
    write_atomically(out, write)


def step_span_start(trace: Trace, step: int | None) -> int:
    """Where a step's span starts (ns from the trace's origin): its first device activity,
    else (a CPU-only trace) its CPU window's start, else (no such step) the origin."""
    gpu_start = trace.gpu.filter(pl.col("step") == step)["start"].min()
    if gpu_start is not None:
        return gpu_start
    window = trace.steps.filter(pl.col("step") == step)["cpu_start"]
    return window.item(0) if window.len() else 0


def _item_tracks(writer, trace, items: pl.DataFrame, top_items: pl.DataFrame, side: str, shift: int) -> None:
    """Under a process of its own: for each top item, a track with its activities' slices."""
    if top_items.height == 0:
        return
    process = writer.process(f"{side.upper()} rank {trace.rank} · top diff items")
    key = VIEWS["kernel"]
    gpu = trace.gpu.with_row_index("row")
    for order, item in enumerate(top_items.iter_rows(named=True), 1):
        rows = items.join(pl.DataFrame([{k: item[k] for k in key}], schema={k: pl.String for k in key}),
                          on=key, nulls_equal=True)
        title = f"{item['delta_ns'] / 1e6:+.3f} ms · {item['kind']}: {item['name']} ({item['phase']})"
        slices = gpu.join(rows.select("row"), on="row").select("start", "end", "name")
        writer.slices(writer.track(process, title, order), slices, shift)
