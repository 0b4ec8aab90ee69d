"""Perfetto export: a trace (or run, or two variants side by side) with what the analyses
found, written as a Perfetto protobuf trace through the `perfetto` package's streaming
builder (`StreamingTraceProtoBuilder`): packets go to the file as they are made, and a run is
loaded one rank at a time.

Per rank, one process with these tracks:
- `CPU thread <tid>`: CPU ops, annotations and runtime calls, nested as in the source;
- `GPU <device> stream <stream>`: one slice per kernel, memcpy and memset (args: correlation,
  External id, step, category, bytes, grid/block, collective args);
- `GPU annotations`, `cuda_sync (CUPTI)`: the source's GPU-side records;
- `tracekit: steps` (ProfilerStep windows), `tracekit: GPU span` (each step's span);
- `tracekit: exposed comm`, `tracekit: overlapped comm`, `tracekit: idle` (with its cause),
  from the step partition; `tracekit: host syncs` (blocked time, GPU idle time, blame);
- counters `tracekit: GPU activities running` and `tracekit: collectives in flight`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackDescriptor, TrackEvent, TracePacket
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from tracekit.analyses.breakdown import slice_segments, step_slices
from tracekit.analyses.diff import VIEWS
from tracekit.analyses.summary import gpu_step_table
from tracekit.analyses.syncs import host_syncs
from tracekit.model import Trace

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


def running_count(frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(times, values): how many intervals of `frame` are running, at each change."""
    times = np.concatenate([frame["start"].to_numpy(), frame["end"].to_numpy()])
    delta = np.concatenate([np.ones(frame.height, np.int64), -np.ones(frame.height, np.int64)])
    order = np.lexsort((delta, times))
    times, level = times[order], np.cumsum(delta[order])
    last = np.append(times[1:] != times[:-1], True)
    return times[last], level[last]


def merged_segments(segments: pl.DataFrame, keep: pl.Expr, name: pl.Expr) -> pl.DataFrame:
    """Runs of adjacent segments that satisfy `keep` and share `name`, as slices."""
    chosen = segments.with_columns(name=name).filter(keep)
    return (chosen.with_columns(run=((pl.col("start") != pl.col("end").shift(1)) |
                                     (pl.col("name") != pl.col("name").shift(1))).fill_null(True).cum_sum())
            .group_by("run", maintain_order=True).agg(pl.col("name").first(), pl.col("start").min(), pl.col("end").max()))


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
    pieces = step_slices(trace)
    if pieces:
        segments = pl.concat([slice_segments(piece) for piece in pieces.values()])
        spans = gpu_step_table(trace).select(
            pl.col("gpu_start").alias("start"), pl.col("gpu_end").alias("end"),
            pl.format("GPU span, step {}", "step").alias("name"))
        writer.slices(track("tracekit: GPU span"), spans, shift)
        for title, keep, name in (
            ("tracekit: exposed comm", pl.col("category") == "comm", pl.format("exposed {}", "cause")),
            ("tracekit: overlapped comm", (pl.col("category") == "compute") & (pl.col("n_comm") > 0),
             pl.lit("comm overlapped by compute")),
            ("tracekit: idle", pl.col("category") == "idle", pl.format("idle: {}", "cause")),
        ):
            writer.slices(track(title), merged_segments(segments, keep, name), shift)
    syncs = host_syncs(trace)
    if syncs.height:
        writer.slices(track("tracekit: host syncs"), syncs.select(
            "start", "end", pl.col("api").alias("name"), "blocked_ns", "gpu_idle_ns",
            pl.col("blame").list.join(" < ").alias("blame")), shift, ("blocked_ns", "gpu_idle_ns", "blame"))
    if trace.gpu.height:
        writer.counter(track("tracekit: GPU activities running", counter=True), *running_count(trace.gpu), shift)
        comm = trace.gpu.filter(pl.col("category") == "comm")
        if comm.height:
            writer.counter(track("tracekit: collectives in flight", counter=True), *running_count(comm), shift)


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


def export_traces(paths: list, out, options: dict) -> int:
    """Every trace file under `paths`, one process per rank, loaded one at a time."""
    from tracekit.loading import NotATrace, load_trace, trace_files

    written = 0

    def write(writer):
        nonlocal written
        for file in (f for p in paths for f in trace_files(Path(p))):
            try:
                trace = load_trace(file, comm_kernels=options["comm_kernels"])
            except NotATrace:
                continue
            write_trace(writer, trace, f"rank {trace.rank} · {file.parent.name}/{file.name}", 0)
            written += 1
    write_atomically(out, write)
    return written


def export_diff(a_traces: list[Trace], b_traces: list[Trace], per_rank: list[dict], together: dict,
                labels: tuple[str, str], out, top: int) -> None:
    """A and B as two groups of processes, each rank's step span starting at the same time,
    with a track per top GPU diff item (largest |delta| over all ranks, idle left out) marking
    where its activities ran on each side. The diffs (`diff.diff_runs`) carry each side's items."""
    base = 1_000_000_000  # both sides' step spans start at 1 s
    by_rank = {d["rank"]: d for d in per_rank}
    top_items = together["all_items"].filter(pl.col("kind") != "idle").head(top)

    def write(writer):
        for side, traces, label in (("a", a_traces, labels[0]), ("b", b_traces, labels[1])):
            for trace in traces:
                diff = by_rank.get(trace.rank, together)
                span_start = trace.gpu.filter(pl.col("step") == diff[f"{side}_step"])["start"].min()
                shift = base - span_start  # on the trace's own times
                write_trace(writer, trace, f"{side.upper()} {label} · rank {trace.rank}",
                            shift - trace.origin_us * 1000)
                if trace.rank in by_rank:
                    _item_tracks(writer, trace, diff[f"{side}_items"], top_items, side, shift)
    write_atomically(out, write)


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
