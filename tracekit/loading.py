"""Loading Kineto trace files into `Trace` tables, and directories into a `Run`.

Events are decoded by msgspec into typed structs (`kineto.py`), a chunk at a time, and moved
column by column into polars; no dict is built per event (`docs/trace-model.md`).
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from operator import attrgetter, itemgetter
from pathlib import Path

import msgspec
import numpy as np
import polars as pl

from .errors import TraceError
from .kineto import DECODER, EVENTS, FLOWS
from .model import Run, Trace
from .names import collective_kind, gpu_category
from .steps import assign_steps, steps_table, whole_trace_step

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CALL_CATS = ("cuda_runtime", "cuda_driver")
OP_CATS = ("cpu_op", "user_annotation", "python_function")
MARK_CATS = ("cuda_sync", "gpu_user_annotation")
TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def load(path) -> Trace | Run:
    """A trace file → `Trace`; a directory of per-rank traces → `Run`."""
    path = Path(path)
    if path.is_dir():
        return load_run(path)
    return load_trace(path)


def trace_files(path: Path) -> list[Path]:
    """`path` itself, or the `.json`/`.json.gz` files directly in the directory `path`."""
    if not path.is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def load_run(path) -> Run:
    """Every trace file directly in `path`, one per rank. Non-trace JSON is skipped with a note."""
    path = Path(path)
    traces, notes = [], []
    for file in trace_files(path):
        try:
            traces.append(load_trace(file))
        except NotATrace:
            notes.append(f"{file}: skipped, not a trace")
    if not traces:
        raise TraceError(path, "no trace files in this directory")
    by_rank: dict[int, str] = {}
    for t in traces:
        if t.rank in by_rank:
            raise TraceError(path, f"rank {t.rank} twice: {by_rank[t.rank]} and {t.path}")
        by_rank[t.rank] = t.path
    traces.sort(key=lambda t: t.rank)
    return Run(path=str(path), traces=traces, notes=notes)


class NotATrace(TraceError):
    """Valid JSON that is not a Kineto trace (a manifest, a summary)."""


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip; bad input raises TraceError."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(path, f"corrupt or truncated gzip ({e})") from None
    if not raw.strip():
        raise TraceError(path, "empty file")
    return raw


CHUNK = 50_000  # events decoded at a time


def load_trace(path) -> Trace:
    """One Kineto trace file → `Trace` with steps assigned."""
    path = Path(path)
    raw = read_bytes(path)
    try:
        doc = DECODER.decode(raw)
    except msgspec.ValidationError as e:
        if _is_not_a_trace(str(e)):
            raise NotATrace(path, "not a Kineto trace (no traceEvents)") from None
        raise TraceError(path, f"not a Kineto trace: {e}") from None
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    if not doc.traceEvents:
        raise TraceError(path, "no complete ('X') events in the trace")
    parts = [_chunk_tables(path, doc.traceEvents, first) for first in range(0, len(doc.traceEvents), CHUNK)]
    doc.traceEvents = []  # the raw views; with them goes the file's text
    del raw
    rank, rank_note = _rank(path, doc)
    info = doc.distributedInfo
    tables = {name: pl.concat([p[name] for p in parts], how="diagonal_relaxed").drop("idx", strict=False)
              for name in TABLES}
    del parts
    complete = pl.concat([tables[t].select("ts", "dur") for t in ("gpu", "calls", "ops", "marks", "other")])
    if complete.height == 0:
        raise TraceError(path, "no complete ('X') events in the trace")
    origin_us = int(math.floor(complete["ts"].min()))
    gpu, calls, ops, marks = (_with_ns(tables[t], origin_us) for t in ("gpu", "calls", "ops", "marks"))
    gpu = _classified(gpu)
    steps = steps_table(ops)
    whole_trace = steps.height == 0
    if whole_trace:
        ends = _with_ns(complete, origin_us)
        steps = whole_trace_step(ends["start"].min(), ends["end"].max())
    gpu, calls, ops = assign_steps(steps, gpu, calls, ops, whole_trace)
    world_size = info.world_size if info else None
    meta = {
        "rank": rank,
        "world_size": world_size,
        "backend": info.backend if info else None,
        "pg_config": [msgspec.structs.asdict(pg) for pg in (info.pg_config or [])] if info else [],
        "nccl_version": info.nccl_version if info else None,
        "device_properties": doc.deviceProperties or [],
        "base_time_ns": doc.baseTimeNanoseconds,
        "schema_version": doc.schemaVersion,
        "trace_name": doc.traceName,
    }
    notes = [rank_note] if rank_note else []
    return Trace(path=str(path), rank=rank, world_size=world_size, gpu=gpu, calls=calls, ops=ops,
                 marks=marks, steps=steps, meta=meta, origin_us=origin_us, notes=notes)


TABLES = ("gpu", "calls", "ops", "marks", "other")
_AT_EVENT = re.compile(r"`\$\[(\d+)\]")


def _chunk_tables(path: Path, raws: list, first: int) -> dict[str, pl.DataFrame]:
    """Decode events [first, first + CHUNK) and return their rows of each table (ts/dur
    still in µs): the structs are freed when this returns."""
    try:
        chunk = EVENTS.decode(b"[" + b",".join(raws[first:first + CHUNK]) + b"]")
    except msgspec.ValidationError as e:  # name the event by its index in the file
        message = _AT_EVENT.sub(lambda m: f"`$.traceEvents[{first + int(m.group(1))}]", str(e))
        raise TraceError(path, f"not a Kineto trace: {message}") from None
    events = [e for e in chunk if e.ph == "X"]
    table = _event_table(path, events)

    def pick(cats):
        return table.filter(pl.col("cat").is_in(cats))

    known = GPU_CATS + CALL_CATS + OP_CATS + MARK_CATS
    return {
        "gpu": _gpu_table(events, pick(GPU_CATS)),
        "calls": _with_args(events, pick(CALL_CATS), {"correlation": ints, "ext_id": ints}),
        "ops": _ops_table(events, pick(OP_CATS)),
        "marks": _with_args(events, pick(MARK_CATS), {
            "ext_id": ints, "correlation": ints, "device": ints, "sync_kind": strings, "stream": ints}),
        "other": table.filter(~pl.col("cat").is_in(known)).select("ts", "dur"),
    }


def _is_not_a_trace(message: str) -> bool:
    """msgspec's message for a JSON document with no `traceEvents` list at the top."""
    return " - at `" not in message or message.endswith(" - at `$.traceEvents`")


def _rank(path: Path, doc) -> tuple[int, str | None]:
    """Rank from distributedInfo, else from the file name, else 0 (with a note)."""
    if doc.distributedInfo and doc.distributedInfo.rank is not None:
        return doc.distributedInfo.rank, None
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), None
    return 0, f"{path}: no rank in distributedInfo or file name, taken as rank 0"


def _event_table(path: Path, events: list) -> pl.DataFrame:
    """Columns common to every complete event (idx: position in `events`); validates ts/dur."""
    table = pl.DataFrame({
        "idx": np.arange(len(events), dtype=np.int64),
        "cat": pl.Series(list(map(attrgetter("cat"), events)), dtype=pl.String),
        "name": pl.Series(list(map(attrgetter("name"), events)), dtype=pl.String),
        "ts": pl.Series(list(map(attrgetter("ts"), events)), dtype=pl.Float64),
        "dur": pl.Series(list(map(attrgetter("dur"), events)), dtype=pl.Float64),
    })
    missing = table.filter(pl.col("ts").is_null() | pl.col("dur").is_null() | pl.col("ts").is_nan())
    if missing.height:
        row = missing.row(0, named=True)
        field = "ts" if row["ts"] is None else "dur"
        raise TraceError(path, f"event '{row['name']}' ({row['cat']}) has no {field}")
    return table


def ns_from_origin(ts_us: pl.Expr, origin_us: int) -> pl.Expr:
    """Kineto µs → integer ns from the origin. `ts - origin` is exact in float64, so rounding
    recovers Kineto's 3-decimal microseconds exactly."""
    return ((ts_us - origin_us) * 1000).round().cast(pl.Int64)


def _with_ns(table: pl.DataFrame, origin_us: int) -> pl.DataFrame:
    """start/end in integer ns from the origin; end = start + round(dur)."""
    start = ns_from_origin(pl.col("ts"), origin_us)
    return table.with_columns(start=start, end=start + ns_from_origin(pl.col("dur").clip(lower_bound=0), 0)
                              ).drop("ts", "dur")


ARG_FIELDS = {"ext_id": "external_id"}  # table column → kineto.Args field, where they differ


def ints(values: list) -> pl.Series:
    """Int64 column from ints, numeric strings or anything else (→ null); converted in polars."""
    return pl.Series(values, dtype=pl.Int64, strict=False)


def strings(values: list) -> pl.Series:
    return pl.Series(values, dtype=pl.String)


def dims(values: list) -> pl.Series:
    """Grid/block sizes as `x`-joined text ([24017, 1, 1] → "24017x1x1")."""
    return strings(["x".join(map(str, v)) if isinstance(v, list) else v for v in values])


# The collective args Kineto writes on record_param_comms ops and NCCL kernels.
COMM_ARGS = {"collective": strings, "in_nelems": ints, "out_nelems": ints, "group_size": ints,
             "dtype": strings, "pg_name": strings, "pg_desc": strings}


def _with_args(events: list, table: pl.DataFrame, columns: dict) -> pl.DataFrame:
    """`table` (rows of `events`, by idx) with pid, tid and the named args, each column made
    by its converter (`ints`: a value of another type becomes null)."""
    chosen = gather(events, table["idx"])
    args = list(map(attrgetter("args"), chosen))
    made = {"pid": ints(list(map(attrgetter("pid"), chosen))), "tid": ints(list(map(attrgetter("tid"), chosen)))}
    for name, convert in columns.items():
        made[name] = convert(list(map(attrgetter(ARG_FIELDS.get(name, name)), args)))
    return table.with_columns(**made)


def _ops_table(events: list, table: pl.DataFrame) -> pl.DataFrame:
    """CPU ops; the collective args are read only for `record_param_comms` ops."""
    ops = _with_args(events, table, {"ext_id": ints})
    records = ops.filter(pl.col("name") == "record_param_comms").select("idx")
    comm = _with_args(events, records, COMM_ARGS).drop("pid", "tid")
    return ops.join(comm, on="idx", how="left", maintain_order="left")


def _gpu_table(events: list, table: pl.DataFrame) -> pl.DataFrame:
    gpu = _with_args(events, table, {
        "device": ints, "stream": ints, "correlation": ints, "ext_id": ints, "bytes": ints,
        "grid": dims, "block": dims, **COMM_ARGS,
    })
    return gpu.rename({"cat": "kind"})


def _classified(gpu: pl.DataFrame) -> pl.DataFrame:
    """GPU activities with `category` and, for collectives, `coll_kind`."""
    gpu = gpu.with_columns(category=gpu_category(pl.col("kind"), pl.col("name")))
    return gpu.with_columns(
        coll_kind=pl.when(pl.col("category") == "comm").then(collective_kind(pl.coalesce("collective", "name"))))


def gather(events: list, idx: pl.Series) -> list:
    """events[i] for i in idx, in one C-level call."""
    if idx.len() < 2:
        return [events[i] for i in idx.to_list()]
    return list(itemgetter(*idx.to_list())(events))


def load_flows(path: Path, origin_us: int) -> pl.DataFrame:
    """The flow start/finish events of a trace file: ph, cat, id, pid, tid, ts (ns from origin)."""
    flows = [e for e in FLOWS.decode(read_bytes(path)).traceEvents if (e.ph == "s" or e.ph == "f") and e.ts is not None]
    column = lambda name: list(map(attrgetter(name), flows))  # noqa: E731
    return pl.DataFrame({
        "ph": strings(column("ph")), "cat": strings(column("cat")),
        "id": ints(column("id")), "pid": ints(column("pid")), "tid": ints(column("tid")),
        "ts": pl.Series(column("ts"), dtype=pl.Float64),
    }).with_columns(ts=ns_from_origin(pl.col("ts"), origin_us))


def read_manifest(path: Path) -> dict:
    """A `tracekit profile` manifest.json; bad input raises TraceError."""
    if not path.is_file():
        raise TraceError(path.parent, "no manifest.json: not a tracekit profile output")
    try:
        manifest = msgspec.json.decode(read_bytes(path))
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("variants"), dict):
        raise TraceError(path, "not a tracekit manifest (no variants)")
    return manifest


def manifest_near(path) -> dict | None:
    """The manifest of the `tracekit profile` output a trace or variant directory belongs to
    (OUT/manifest.json for OUT/<variant>[/rank<r>…]), if there is a valid one."""
    path = Path(path).resolve()
    for folder in (path.parent, path.parent.parent) if path.is_file() else (path, path.parent):
        if (folder / "manifest.json").is_file():
            try:
                return read_manifest(folder / "manifest.json")
            except TraceError:
                return None
    return None


def load_profile(out) -> tuple[dict, dict[str, Run]]:
    """A `tracekit profile` output: (manifest, {variant: Run}) for the variants that ran."""
    out = Path(out)
    manifest = read_manifest(out / "manifest.json")
    runs = {}
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok":
            continue
        if not (out / variant).is_dir():
            raise TraceError(out / variant, "missing: the manifest lists it as ok")
        runs[variant] = load_run(out / variant)
        missing = {r["rank"] for r in entry["ranks"]} - {t.rank for t in runs[variant].traces}
        if missing:
            raise TraceError(out / variant, f"missing rank(s) {sorted(missing)}")
    return manifest, runs
