"""Loading Kineto trace files into `Trace` tables, and directories into a `Run`.

Events are decoded by msgspec into typed structs (`kineto.py`), a chunk at a time, and moved
column by column into polars; no dict is built per event (`docs/trace-model.md`). What the
loader cannot use is counted in `Trace.facts` (unknown categories, dropped events, fields
read leniently), never dropped silently: `tracekit lint` reports it.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections import Counter
from functools import cache
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import msgspec
import polars as pl
from isal.igzip_lib import IsalError

from . import cache as trace_cache
from . import files, native
from .classify import classified
from .errors import TraceError
from .executor import cores, in_threads
from .fused import PROCESS_COLUMNS, per_process, processes
from .kineto import CATEGORIES, DECODER, EVENTS, LOOSE_DECODER, LOOSE_EVENTS, NO_LOOSE_ARGS, PHASE, LooseArgs
from .stream import RAWS, EventStream, Unsplittable
from .model import ENGINE, Run, Trace
from .steps import assign_steps, steps_table, whole_trace_step
from .words import listed

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
EXACT_LIMIT_US = 2.0 ** 43  # below this a float64 µs timestamp still rounds to the exact ns
# A ts or dur of at least this many ns (146 years; epoch ns reach it in 2116) is beyond any
# plausible clock: the event is dropped and counted (`FAR`), never wrapped around int64.
CLOCK_LIMIT_NS = 2 ** 62


def load(path, *, comm_kernels: tuple[str, ...] = (), cycle: str = "last", cache: bool | None = None) -> Trace | Run:
    """A trace file → `Trace`; a directory of per-rank traces → `Run` (paths or fsspec URLs).
    `comm_kernels`: extra regexes of communication kernels (`classify.py`); `cycle`: which
    profiling cycle of each rank a directory gives (`load_run`); `cache`: use the trace cache
    (`cache.py`; default: unless TRACEKIT_NO_CACHE is set)."""
    if files.is_dir(path):
        return load_run(path, comm_kernels=comm_kernels, cycle=cycle, cache=cache)
    traces = load_traces(path, comm_kernels=comm_kernels, cache=cache)
    return traces[0] if len(traces) == 1 else Run(path=str(path), traces=traces, facts={"fused": True})


def load_runs(paths, *, comm_kernels: tuple[str, ...] = (), cycle: str = "last", cache: bool | None = None) -> list[Run]:
    """Each path as a `Run`: a directory's traces, or one trace file as a run of one."""
    runs = []
    for path in paths:
        loaded = load(path, comm_kernels=comm_kernels, cycle=cycle, cache=cache)
        runs.append(loaded if isinstance(loaded, Run) else Run(path=str(path), traces=[loaded]))
    return runs


def load_run(path, *, comm_kernels: tuple[str, ...] = (), cycle: str = "last", cache: bool | None = None) -> Run:
    """Every trace file directly in `path`, one per rank. Non-trace JSON is skipped. A rank
    with several profiling cycles (files `<worker>.<ms>.pt.trace.json` of one worker, or
    several files of one rank) gives the one `cycle` names — `last`, `first`, or the N-th in
    time order (1-based, as TensorBoard numbers them); `facts["cycles"]`: each such used file →
    every cycle of its rank, in time order."""
    chosen, others = files.cycles_by_name(files.trace_files(path), cycle)
    traces, skipped = [], []
    for file in chosen:
        try:
            traces.extend(load_traces(file, comm_kernels=comm_kernels, cache=cache))
        except NotATrace:
            skipped.append(str(file))
    if not traces:
        raise TraceError(path, "no trace files in this directory")
    traces, more_others = cycles_by_rank(traces, cycle)
    others.update(more_others)
    return Run(path=str(path), traces=sorted(traces, key=lambda t: t.rank),
               facts={"directory": True, "skipped": skipped, "cycles": others})


def cycles_by_rank(traces: list, cycle: str) -> tuple[list, dict[str, list[str]]]:
    """One trace per rank (anything with path, rank, meta, origin_us, step_numbers): several of
    one rank are profiling cycles of one process, in order of their first event, when each
    one's steps come after the previous one's (a process numbers its steps on); otherwise they
    are different traces claiming one rank (two single-GPU runs), and every one is kept (lint's
    `same_rank`). Also each chosen cycle's path → every cycle of its rank, in time order."""
    by_rank: dict[int, list] = {}
    for t in traces:
        by_rank.setdefault(t.rank, []).append(t)
    kept, others = [], {}
    for rank, group in by_rank.items():
        group.sort(key=lambda t: (t.meta["base_time_ns"] or 0, t.origin_us, t.path))
        if len(group) == 1 and files.CYCLE_NAME.match(files.name(group[0].path)):
            kept.append(group[0])  # its cycle was chosen by its name already (`files.cycles_by_name`)
            continue
        if not successive(group):
            kept.extend(group)
            continue
        i = files.cycle_index([t.path for t in group], cycle, group[0].path.rsplit("/", 1)[0])
        kept.append(group[i])
        if len(group) > 1:
            others[group[i].path] = [t.path for t in group]
    return kept, others


def successive(group: list) -> bool:
    """Whether each trace's step numbers all come after the previous trace's."""
    return all(min(b.step_numbers, default=0) > max(a.step_numbers, default=0) for a, b in zip(group, group[1:]))


class NotATrace(TraceError):
    """Valid JSON that is not a Kineto trace (a manifest, a summary)."""


CHUNK = 50_000  # events decoded at a time
TABLES = ("gpu", "calls", "ops", "marks")


def load_trace(path, *, comm_kernels: tuple[str, ...] = (), cache: bool | None = None) -> Trace:
    """One Kineto trace file → `Trace` with steps assigned (of a file fusing several ranks, the
    first rank's: `load_traces` gives each)."""
    return load_traces(path, comm_kernels=comm_kernels, cache=cache)[0]


def load_traces(path, *, comm_kernels: tuple[str, ...] = (), cache: bool | None = None) -> list[Trace]:
    """The traces of one Kineto trace file, steps assigned: one, or one per rank of a file
    fusing several (`fused.py`); from the trace cache when it holds this version of the file
    (`cache.py`: a fused file's ranks after the first under `<key>-<i>`), else decoded and put
    there."""
    use = trace_cache.enabled() if cache is None else cache
    if use:
        entry = trace_cache.key(files.identity(path), comm_kernels)
        first = trace_cache.read(entry)
        cached = [first] + [trace_cache.read(f"{entry}-{i}") for i in range(1, first.facts.get("fused_ranks", 1))] \
            if first is not None else [None]
        if all(t is not None for t in cached):
            for t in cached:
                t.path = str(path)
            return cached
    traces = decode(path, comm_kernels)
    if use:
        for i, trace in enumerate(traces):
            trace_cache.write(f"{entry}-{i}" if i else entry, trace)
    return traces


def decode(path, comm_kernels: tuple[str, ...]) -> list[Trace]:
    """Decode one Kineto trace file into its traces (one per rank of a fused file) with steps
    assigned: in pieces by several processes (`split.py`) or a block at a time (`stream.py`)
    where the text allows, else whole. JSON nested deeper than msgspec reads (about a
    thousand levels) is refused, one line."""
    try:
        return decoded(path, comm_kernels)
    except RecursionError:
        raise TraceError(path, "JSON nested too deeply to read (about 1,000 levels or more)") from None


def decoded(path, comm_kernels: tuple[str, ...]) -> list[Trace]:
    """`decode`'s traces."""
    try:
        parts, doc, facts = in_pieces(path)
    except (Unsplittable, TraceError, msgspec.DecodeError, OSError, EOFError, ValueError, IsalError, RecursionError):
        parts, doc, facts = whole(path)  # which names what is wrong with a bad file
    tables = {name: pl.concat([p[name] for p in parts], how="diagonal_relaxed", rechunk=True).drop("idx", strict=False)
              for name in (*TABLES, "extent")}
    del parts
    native.give_back_memory()  # the native columns that the tables were until made contiguous
    extent = tables.pop("extent").select(pl.col("first").min(), pl.col("last").max(), pl.col("n").sum()).row(0)
    if not extent[2]:
        if facts.pop("array_form") and not facts["events"]:
            raise NotATrace(path, "not a Kineto trace: a JSON array without trace events")
        dropped = "; ".join(f"{n} {why}" for why, n in facts["dropped"].items())
        raise TraceError(path, "no complete ('X') events with a usable ts and dur" + (f" ({dropped})" if dropped else ""))
    origin_us = extent[0] // 1000
    tables = {t: _with_ns(tables[t], origin_us) for t in TABLES}
    info = getattr(doc, "distributedInfo", None)
    world_size = info.world_size if info else None
    facts["schema"] = "kineto 2021 (PyTorch 1.8-1.10)" if facts.pop("old_names") else "kineto"
    facts.pop("array_form")
    parts = per_process(tables)
    if parts is None:
        facts["processes"] = len(processes(tables["ops"]))  # several: ranks fused, not split (lint)
        whole_file = {name: t.drop(PROCESS_COLUMNS) for name, t in tables.items()}
        return [assembled(path, doc, whole_file, extent, origin_us, comm_kernels, _rank(path, doc), world_size, facts)]
    size = max(world_size or 0, len(parts))
    return [assembled(path, doc, own, extent, origin_us, comm_kernels, (rank, where), size,
                      {**facts, "fused_ranks": len(parts)}) for rank, where, own in parts]


def assembled(path, doc, tables: dict, extent: tuple, origin_us: int, comm_kernels: tuple[str, ...],
              rank: tuple[int, str], world_size: int | None, facts: dict) -> Trace:
    """One rank's `Trace` from its tables: device work classified, steps assigned."""
    gpu, calls, ops, marks = (tables[t] for t in TABLES)
    gpu = classified(gpu, comm_kernels)
    steps = steps_table(ops)
    whole_trace = steps.height == 0
    if whole_trace:
        steps = whole_trace_step(extent[0] - origin_us * 1000, extent[1] - origin_us * 1000)
    gpu, calls, ops = assign_steps(steps, gpu, calls, ops, whole_trace)
    facts = {**facts, "rank_from": rank[1]}
    info = getattr(doc, "distributedInfo", None)
    meta = {
        "rank": rank[0],
        "world_size": world_size,
        "backend": info.backend if info else None,
        "pg_config": [msgspec.structs.asdict(pg) for pg in (info.pg_config or [])] if info else [],
        "nccl_version": info.nccl_version if info else None,
        "device_properties": getattr(doc, "deviceProperties", None) or [],
        "base_time_ns": getattr(doc, "baseTimeNanoseconds", None),
        "schema_version": getattr(doc, "schemaVersion", None),
        "trace_name": getattr(doc, "traceName", None),
    }
    return Trace(path=str(path), rank=rank[0], world_size=world_size, gpu=gpu, calls=calls, ops=ops,
                 marks=marks, steps=steps, meta=meta, origin_us=origin_us, facts=facts)


def fresh_facts(array_form: bool = False) -> dict:
    return {"events": 0, "unknown_categories": Counter(), "dropped": Counter(), "lenient_events": 0,
            "exact_timestamps": 0, "replaced_text": 0, "metadata": None, "old_names": False, "array_form": array_form}


# Bytes of text from which a local file is decoded by several processes. A guess, not measured
# apart: the workers' fork server is an interpreter importing the loader (~0.3 s, as a rank
# worker: benchmarks/README.md, "Start-up"), so only a file that takes about a second or more to
# decode in one process can win much (195 MB: 36 % less on 16 cores, 3-14 % on 2).
PARALLEL_BYTES = 48 << 20
# ... and by threads (the native decoder), which cost no start: on 2 cores a cold summary of
# 31 MB took 0.25-0.40 s against 0.37-0.65 s a block at a time, of 15.5 MB about as long.
THREADED_BYTES = 16 << 20
# ... by at most this many threads: the decode is bound by memory, not the cores (on the 16-core
# host each thread decoded at half its speed alone with 16 of them, and 16 took 0.26 s against
# 8's 0.20 s for 195 MB: benchmarks/README.md, 2026-12-07 (night)).
DECODE_THREADS = 8


def in_pieces(path) -> tuple[list, object, dict]:
    """(per-piece tables, the top level, facts): a local file of one event per line decoded in
    pieces (`split.py`), from THREADED_BYTES of text by one thread per core (at most
    DECODE_THREADS) where the native decoder reads them (it releases the interpreter), else
    from PARALLEL_BYTES by one process per core; other files a block at a time."""
    threads = native.available()
    least = THREADED_BYTES if threads else PARALLEL_BYTES
    if cores() > 1 and not files.is_url(path) and files.text_size(path) >= least:
        from . import split  # only for a file decoded in pieces (processes: multiprocessing and its kin)

        try:
            return in_threads_here(path, min(cores(), DECODE_THREADS)) if threads else in_processes(path, cores() - 1)
        except (Unsplittable, split.Failed, OSError):  # OSError: no room for the gunzipped text
            pass
    return streamed(path)


def in_threads_here(path, threads: int) -> tuple[list, object, dict]:
    """(per-piece tables, the top level, facts), the pieces decoded by `threads` threads; numpy
    (which the analyses' timelines need next) imported while polars makes the tables, not
    while the threads decode: an import holds the interpreter, which each thread takes to hand
    its piece's columns over (on the 16-core host the decode took 0.3 s longer)."""
    from . import split

    results, metadata = split.threaded(str(path), piece_columns, threads, then=imported)
    threading.Thread(target=importlib.import_module, args=("numpy",)).start()
    return _pieces_facts(path, list(_joined(results)), metadata)


def piece_columns(text, target: None = None) -> tuple:
    """The piece's `native.raw_columns` (made polars columns by `imported`, in the thread that
    waits for the pieces) where the native decoder reads it, else its `piece_tables` (tables,
    facts)."""
    raw = native.raw_columns(text, GROUPS)
    return raw if raw is not None and not raw.inexact and not raw.text_ids else piece_tables(text)


def imported(result: tuple) -> tuple:
    """`piece_columns`' result, raw columns made `native_columns`' `Grouped`."""
    return checked_columns(result) if isinstance(result, native.Raw) else result


def _joined(results: list):
    """`piece_columns`' results as `piece_tables`' (tables, facts), taken from the front of the
    list: each run of successive pieces read natively made tables at once, each group's
    columns concatenated, so that the threads only decode (holding the interpreter little)
    and polars' own threads then build the tables of all; the columns freed, and their
    memory given back, once the tables are made, but for the text buffers that the tables'
    string views still point into."""
    while results:
        if not isinstance(results[0], Grouped):
            yield results.pop(0)
            continue
        run, facts = [], fresh_facts()
        while results and isinstance(results[0], Grouped):
            got = results.pop(0)
            run.append(got.groups)
            for name, n in got.counts.items():
                facts[name] += n
        tables = columns_tables({g: pl.concat([groups[g] for groups in run], how="vertical") for g in GROUP_COLUMNS},
                                facts)
        del run, got
        native.give_back_memory()
        yield tables, facts


def in_processes(path, workers: int) -> tuple[list, object, dict]:
    """(per-piece tables, the top level, facts), the pieces decoded by this process and
    `workers` others; the facts are the pieces' facts added up in file order. Meanwhile a
    thread imports numpy, which the analyses' timelines need next (0.27 s on the 16-core host,
    where the whole decode takes 0.6 s)."""
    from . import split

    threading.Thread(target=importlib.import_module, args=("numpy",)).start()
    results, metadata = split.decoded(str(path), piece_tables, workers, unpack=piece_frames)
    return _pieces_facts(path, results, metadata)


def _pieces_facts(path, results: list, metadata: bytes) -> tuple[list, object, dict]:
    """(per-piece tables, the top level, facts) from each piece's (tables, facts): the facts
    added up in file order."""
    facts = fresh_facts()
    for _, own in results:
        for name in ("events", "lenient_events", "exact_timestamps", "replaced_text"):
            facts[name] += own[name]
        facts["unknown_categories"].update(own["unknown_categories"])
        facts["dropped"].update(own["dropped"])
        facts["old_names"] |= own["old_names"]
    return [tables for tables, _ in results], _document(path, metadata, facts), facts


def piece_tables(text, target: str | None = None) -> tuple[dict, dict]:
    """(the piece's rows of each table, its facts): `_chunk_tables` of one piece alone. In this
    process (`target` None) the frames themselves; in a worker, each table written as Arrow IPC
    to `<target>.<table>.arrow` and its path given, read back here by several threads at once
    (`piece_frames`). Files, not bytes sent back: piped bytes were held three times on their
    way (the worker's pickled copy, the bytes received, the frame read from them); unpickled
    frames were read back one at a time, a quarter of a second for a 195 MB trace's on the
    16-core host."""
    facts = fresh_facts()
    tables = _chunk_tables(text, facts)
    if target is None:
        return tables, facts
    paths = {}
    for name, table in tables.items():
        paths[name] = f"{target}.{name}.arrow"
        table.write_ipc(paths[name], compression="uncompressed")
    return paths, facts


def piece_frames(piece: tuple[dict, dict]) -> tuple[dict[str, pl.DataFrame], dict]:
    """`piece_tables`' result with a worker's tables read back (and their files removed)."""
    tables, facts = piece
    return {name: table if isinstance(table, pl.DataFrame) else _read_once(table)
            for name, table in tables.items()}, facts


def _read_once(path: str) -> pl.DataFrame:
    """The table in this IPC file, the file removed (polars 2 reads it into memory; polars 1
    memory-maps it, which holds after the removal on POSIX; where a mapped file cannot be
    removed, the folder's removal at the end of the decode tries again)."""
    table = pl.read_ipc(path)
    try:
        os.remove(path)
    except OSError:
        pass
    return table


def streamed(path) -> tuple[list, object, dict]:
    """(per-piece tables, the top level, facts), the file read a block at a time."""
    facts = fresh_facts()
    events = EventStream(path)
    parts = [_chunk_tables(piece, facts) for piece in events.pieces()]
    return parts, _document(path, events.metadata, facts), facts


def _document(path, metadata: bytes, facts: dict):
    """The top level (without the events) decoded; metadata of unexpected types is noted."""
    try:
        doc = DECODER.decode(metadata)
    except msgspec.ValidationError as e:
        facts["metadata"] = str(e)
        doc = LOOSE_DECODER.decode(metadata)
    if not facts["events"]:
        raise TraceError(path, "no complete ('X') events in the trace")
    return doc


def whole(path) -> tuple[list, object, dict]:
    """(per-chunk tables, the top level, facts), the file read whole: each event kept as raw
    JSON (a view into the text), decoded `CHUNK` at a time."""
    raw = files.read_bytes(path)
    doc, facts = _top_level(path, raw)
    raws = doc.traceEvents
    if not raws:
        raise TraceError(path, "no complete ('X') events in the trace")
    parts = [_chunk_tables(b"[" + b",".join(raws[i:i + CHUNK]) + b"]", facts) for i in range(0, len(raws), CHUNK)]
    doc.traceEvents = []  # the raw views; with them goes the file's text
    return parts, doc, facts


def _top_level(path, raw: bytes):
    """(the decoded top level with raw events, fresh facts). A JSON array at the top is the
    Chrome trace format's array form; metadata of unexpected types is skipped (noted)."""
    array_form = raw.lstrip()[:1] == b"["
    facts = fresh_facts(array_form)
    try:
        if array_form:
            return LOOSE_DECODER.decode(b'{"traceEvents":' + raw + b"}"), facts
        return DECODER.decode(raw), facts
    except msgspec.ValidationError as e:
        if _is_not_a_trace(str(e)):
            raise NotATrace(path, "not a Kineto trace (no traceEvents list)") from None
        facts["metadata"] = str(e)
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    try:  # the metadata's odd types skipped: the rest may still not parse (a truncated file)
        return LOOSE_DECODER.decode(raw), facts
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None


def _is_not_a_trace(message: str) -> bool:
    """msgspec's message for a JSON document with no `traceEvents` list at the top."""
    return " - at `" not in message or message.endswith(" - at `$.traceEvents`")


def _decode(text: bytes, facts: dict, exact: bool = False) -> tuple[list, bool]:
    """(events, loose): the chunk (a JSON array's text) as typed `Event`s, or as `LooseEvent`s
    when a field has an unexpected type or `exact` asks for timestamps as text. An element
    that is not an event object is dropped (counted); `args` that is not an object is ignored.
    Text that is not a JSON array raises msgspec.DecodeError."""
    if not exact:
        try:
            return EVENTS.decode(text), False
        except msgspec.ValidationError:
            pass
    try:
        events, objects = LOOSE_EVENTS.decode(text), None
    except msgspec.ValidationError:  # some element is no object: decode one by one
        events, objects = [], []
        for one in RAWS.decode(text):
            try:
                events.append(LOOSE_EVENTS.decode(b"[" + one + b"]")[0])
                objects.append(one)
            except msgspec.ValidationError as e:
                why = _unread(one, str(e))
                if why:
                    facts["dropped"][why] += 1
    for e in events:
        if not isinstance(e.args, LooseArgs):
            e.args = NO_LOOSE_ARGS
    if not exact:
        facts["lenient_events"] += _lenient(RAWS.decode(text) if objects is None else objects)
    return events, True


def _unread(element: bytes, message: str) -> str | None:
    """Why an element that even the lenient decode refuses is dropped (msgspec's `message`):
    not an object; or a complete event with an integer too long for Python to read (thousands
    of digits): in its ts or dur, it has no numeric one. None: an event that is not complete,
    not kept anyway."""
    try:
        phase = PHASE.decode(element).ph
    except msgspec.DecodeError:
        return NOT_OBJECTS
    if phase != "X":
        return None
    return NO_TS if message.endswith(".ts`") else NO_DUR if message.endswith(".dur`") else LONG_INTEGER


def _lenient(objects: list) -> int:
    """How many of these events (raw JSON objects) have a field of another type than `Event`
    holds: counted one by one, so that the count does not depend on how the file was cut."""
    n = 0
    for one in objects:
        try:
            EVENTS.decode(b"[" + one + b"]")
        except msgspec.ValidationError:
            n += 1
    return n


def _chunk_tables(chunk: bytes, facts: dict) -> dict[str, pl.DataFrame]:
    """Decode a chunk of events (a JSON array's text) and return their rows of each table
    (absolute `ts_ns`, `dur_ns`), and the `extent` of its complete events (first start, last
    end, count): by the native decoder where it reads the text (`native.py`), else by msgspec
    (the structs are freed when this returns)."""
    tables = _native_tables(chunk, facts)
    if tables is not None:
        return tables
    if not chunk.isascii():
        chunk = readable(chunk, facts)
    events, loose = _decode(chunk, facts)
    complete = [e for e in events if e.ph == "X"]
    table = _event_table(complete, loose, facts)
    if table is None:  # float timestamps too large to hold their nanoseconds: decode them as text
        events, loose = _decode(chunk, facts, exact=True)
        complete = [e for e in events if e.ph == "X"]
        table = _event_table(complete, loose, facts)
    facts["events"] += len(events)
    del events
    return _routed(table, facts, {
        "gpu": lambda part: _gpu_table(complete, part),
        "calls": lambda part: _with_args(complete, part, {"correlation": ints}),
        "ops": lambda part: _ops_table(complete, part),
        "marks": lambda part: _with_args(complete, part, MARK_ARGS),
    })


def _routed(table: pl.DataFrame, facts: dict, builders: dict) -> dict[str, pl.DataFrame]:
    """The complete events' `table` (idx, cat, name, ts_ns, dur_ns, and whatever else the
    builders read) split by where each category goes, each part made a table by its builder
    (`builder(part)`), and the `extent`."""
    _note_categories(table, facts)
    parts = table.with_columns(route=pl.col("cat").replace_strict(ROUTE, default="none"),
                               cat=pl.col("cat").replace_strict(NORMAL, default=None)
                               ).partition_by("route", as_dict=True, include_key=False)
    empty = table.clear().drop("route", strict=False)
    tables = {name: build(parts.get((name,), empty)) for name, build in builders.items()}
    tables["extent"] = table.select(first=pl.col("ts_ns").min(), last=(pl.col("ts_ns") + pl.col("dur_ns")).max(),
                                    n=pl.len())
    return tables


def _note_categories(table: pl.DataFrame, facts: dict) -> None:
    """Note the complete events' timestamps that needed the exact decode, their unknown
    categories and whether they use the old names."""
    facts["exact_timestamps"] += int((table["ts_ns"].abs() >= int(EXACT_LIMIT_US) * 1000).sum())
    _note_counted(table["cat"].value_counts().rows(), facts)


def _note_counted(counts, facts: dict) -> None:
    """Note the unknown categories among (category, events) counts, and whether any uses the
    old names."""
    for cat, n in counts:
        if cat not in CATEGORIES:
            facts["unknown_categories"][cat or "(no cat)"] += n
        elif cat in OLD_NAMES:
            facts["old_names"] = True


def _native_tables(chunk: bytes, facts: dict) -> dict[str, pl.DataFrame] | None:
    """`_chunk_tables` from the native decoder's columns (`native_columns`), or None
    where `native_columns` gives none: msgspec's path then decodes the chunk."""
    got = native_columns(chunk)
    if got is None:
        return None
    for name, n in got.counts.items():
        facts[name] += n
    return columns_tables(got.groups, facts)


class Grouped(NamedTuple):
    """The native decoder's rows of a chunk per group of `GROUPS` (name → frame) and its
    counts of events and lenient events under their names in the facts."""

    groups: dict[str, pl.DataFrame]
    counts: dict[str, int]


def native_columns(chunk: bytes) -> Grouped | None:
    """The native decoder's rows of the chunk per group (`native.frames` of `GROUPS`),
    `ts_exact` kept (by the C) only where a timestamp is too large for a float to hold its
    ns (`text_ns`); or None where it does not read the text, where such a timestamp has a
    form it could not read exactly (an exponent), or where a routed event's pid or tid is
    text (PyTorch 1.8–1.10's `"stream 7"`)."""
    return checked_columns(native.raw_columns(chunk, GROUPS))


def checked_columns(raw: native.Raw | None) -> Grouped | None:
    """`native_columns` from `native.raw_columns`' result."""
    if raw is None or raw.inexact or raw.text_ids:
        return None
    return Grouped(dict(zip(GROUP_COLUMNS, native.frames(raw))), {"events": raw.events, "lenient_events": raw.lenient})


IN_MEMORY_ROWS = 250_000  # events: `columns_tables` of fewer runs in memory


def columns_tables(groups: dict[str, pl.DataFrame], facts: dict) -> dict[str, pl.DataFrame]:
    """`_chunk_tables` from `native_columns`' groups (of one chunk, or of several in file
    order): in each group the events without a usable ts or dur dropped and negative
    durations taken as 0, counted as `_usable` counts them, the facts `_note_categories` notes,
    the `extent` over every group; the four tables made at once (`pl.collect_all`): in memory
    below `IN_MEMORY_ROWS` events, else on polars' default engine (polars 2's streaming one
    holds ~30 MB less at the peak of a 195 MB trace's critical path)."""
    engine = ENGINE if sum(frame.height for frame in groups.values()) < IN_MEMORY_ROWS else "auto"
    ts_ns = pl.col("ts_exact").fill_null(float_ns(pl.col("ts")))
    dur_ns = clock_ns(pl.col("dur") * 1000)
    numbers = ts_ns.is_not_null() & dur_ns.is_not_null()
    usable = numbers & ~far(ts_ns, dur_ns)
    found = pl.collect_all([frame.lazy().select(
        no_ts=ts_ns.is_null().sum(), no_dur=(ts_ns.is_not_null() & dur_ns.is_null()).sum(),
        far=(numbers & ~usable).sum(),
        negative=(usable & (dur_ns < 0)).sum(), exact=(usable & (ts_ns.abs() >= int(EXACT_LIMIT_US) * 1000)).sum(),
        first=ts_ns.filter(usable).min(), last=(ts_ns.filter(usable) + dur_ns.filter(usable).clip(lower_bound=0)).max(),
        n=usable.sum()) for frame in groups.values()] + [frame.lazy().filter(usable).group_by("cat").len()
                                                          for frame in groups.values()], engine=engine)
    checks = dict(zip(groups, (c.row(0, named=True) for c in found[:len(groups)])))
    for c in checks.values():
        for why, n in ((NO_TS, c["no_ts"]), (NO_DUR, c["no_dur"]), (FAR, c["far"]), (NEGATIVE_DUR, c["negative"])):
            if n:
                facts["dropped"][why] += n
        facts["exact_timestamps"] += c["exact"]
    _note_counted([row for cats in found[len(groups):] for row in cats.rows()], facts)
    ext_id = pl.col("external_id").fill_null(pl.col("external_id_2021"))

    def shaped(name: str, *names: str) -> pl.LazyFrame:
        """The group's table: cat, name, ts_ns, dur_ns, tid, ext_id, pid, rank_arg and
        `names`, in that order (as `_with_args` makes it)."""
        c, frame = checks[name], groups[name].lazy()
        if c["no_ts"] or c["no_dur"] or c["far"]:
            frame = frame.filter(usable)
        return frame.select(pl.col("cat").replace_strict(NORMAL, default=None), "name", ts_ns.alias("ts_ns"),
                            (dur_ns.clip(lower_bound=0) if c["negative"] else dur_ns).alias("dur_ns"), "tid",
                            ext_id.alias("ext_id"), "pid", pl.col("rank").alias("rank_arg"), *names)

    record = pl.col("name") == "record_param_comms"
    gpu = shaped("gpu", "device", "stream", "correlation", "bytes", "grid", "block", *COMM_ARGS).with_columns(
        stream=pl.col("stream").fill_null(pl.col("tid").cast(pl.String).str.extract(r"(\d+)", 1).cast(pl.Int64, strict=False)),
        device=pl.col("device").fill_null(pl.col("pid"))).rename({"cat": "kind"})
    ops = shaped("ops", "input_dims", "input_types", "concrete_inputs", *COMM_ARGS).with_columns(
        pl.when(record).then(pl.col(name)).alias(name) for name in COMM_ARGS)
    made = pl.collect_all([gpu, shaped("calls", "correlation"), ops, shaped("marks", *MARK_ARGS)], engine=engine)
    firsts, lasts = [c["first"] for c in checks.values() if c["n"]], [c["last"] for c in checks.values() if c["n"]]
    extent = pl.DataFrame({"first": [min(firsts, default=None)], "last": [max(lasts, default=None)],
                           "n": [sum(c["n"] for c in checks.values())]},
                          schema={"first": pl.Int64, "last": pl.Int64, "n": pl.UInt32})
    return dict(zip(TABLES, made)) | {"extent": extent}


ROUTE = {cat: where[0] for cat, where in CATEGORIES.items() if where}
NORMAL = {cat: where[1] for cat, where in CATEGORIES.items() if where}
OLD_NAMES = {"Kernel", "Memcpy", "Memset", "Runtime", "Operator"}


def readable(chunk: bytes, facts: dict) -> bytes:
    """The chunk with each byte sequence that is not UTF-8 replaced by U+FFFD (as Python's
    `errors="replace"` does), counted in `facts["replaced_text"]`: anywhere in the chunk's
    text, in any field of any event, kept or not, as the native decoder checks it (which leaves
    such a chunk to this path), so that both give the same tables and the same count."""
    text = chunk.decode("utf-8", "replace")
    facts["replaced_text"] += text.count("\ufffd") - chunk.count("\ufffd".encode())
    return text.encode()


def _event_table(events: list, loose: bool, facts: dict) -> pl.DataFrame | None:
    """Columns common to every complete event (idx: position in `events`), with absolute
    integer `ts_ns`/`dur_ns`; events without a usable ts or dur are dropped (counted). None
    when typed float timestamps are too large for a float to hold their nanoseconds (epoch
    microseconds): the chunk is then decoded with timestamps as text.""" 
    ts, dur = values("ts", events), values("dur", events)
    if loose:
        ts_ns = text_ns(strings(ts))
        dur_us = strings(dur).cast(pl.Float64, strict=False)
    else:
        ts_us = pl.Series(ts, dtype=pl.Float64)
        if (ts_us.abs() >= EXACT_LIMIT_US).any():
            return None
        ts_ns = float_ns(ts_us)
        dur_us = pl.Series(dur, dtype=pl.Float64)
    dur_ns = pl.select(clock_ns(pl.lit(dur_us) * 1000)).to_series()
    return _usable(pl.DataFrame({
        "idx": pl.int_range(len(events), dtype=pl.Int64, eager=True),
        "cat": strings(values("cat", events)),
        "name": strings(values("name", events)),
        "ts_ns": ts_ns, "dur_ns": dur_ns,
    }), facts)


# Why an event was dropped (or changed), as `facts["dropped"]` counts it.
NO_TS, NO_DUR = "events without a numeric ts", "events without a numeric dur"
FAR = ("events with a ts or dur beyond any plausible clock (a ts from −2^61 to 2^62 ns, a dur under 2^61 ns: "
       "73 years)")
NEGATIVE_DUR = "events with a negative dur (kept, dur taken as 0)"
NOT_OBJECTS = "elements that are not event objects"
LONG_INTEGER = "events with an integer too long to read (thousands of digits)"


def far(ts_ns, dur_ns):
    """Whether a ts or dur (int ns, `clock_ns`) is beyond any plausible clock (expressions): a ts
    at `CLOCK_LIMIT_NS` (2^62) or beyond, or below −2^61; a dur at 2^61 or beyond, either
    sign. Within them every end (ts + dur) and every difference of two starts or ends lies
    under 2^63: no span a trace's events make wraps int64."""
    half = CLOCK_LIMIT_NS // 2
    return (ts_ns >= CLOCK_LIMIT_NS) | (ts_ns < -half) | (dur_ns.abs() >= half)


def _usable(table: pl.DataFrame, facts: dict) -> pl.DataFrame:
    """`table` without the events that have no usable ts or dur, or one beyond any plausible
    clock (counted), negative durations taken as 0 (counted)."""
    ts_ns, dur_ns = pl.col("ts_ns"), pl.col("dur_ns")
    unusable = ts_ns.is_null() | dur_ns.is_null() | far(ts_ns, dur_ns)
    bad = table.filter(unusable)
    if bad.height:
        for why, n in bad.select(pl.when(ts_ns.is_null()).then(pl.lit(NO_TS)).when(dur_ns.is_null()).then(pl.lit(NO_DUR))
                                 .otherwise(pl.lit(FAR))).to_series().value_counts().rows():
            facts["dropped"][why] += n
        table = table.filter(~unusable)
    negative = int((table["dur_ns"] < 0).sum())
    if negative:
        facts["dropped"][NEGATIVE_DUR] += negative
        table = table.with_columns(pl.col("dur_ns").clip(lower_bound=0))
    return table


def float_ns(ts_us: pl.Series) -> pl.Series:
    """Absolute integer ns from float µs, exact below `EXACT_LIMIT_US`: each value's whole µs
    apart from its fraction (both exact in a double), the fraction's product with 1000 rounded.
    Row by row, so that a row's ns do not depend on the rows decoded with it (how the file was
    cut)."""
    whole = ts_us.floor()
    return ((ts_us - whole) * 1000).round().cast(pl.Int64, strict=False) + whole.cast(pl.Int64, strict=False) * 1000


def clock_ns(ns):
    """Integer ns (rounded) from float ns (an expression): a finite value at `CLOCK_LIMIT_NS`
    or beyond taken as ±CLOCK_LIMIT_NS (so that `far` finds it: not wrapped, nor null as if
    it were no number), an infinite one null (`1e999`: no number a double holds)."""
    return pl.when(ns.is_infinite()).then(None).otherwise(
        ns.clip(-CLOCK_LIMIT_NS, CLOCK_LIMIT_NS).round().cast(pl.Int64, strict=False))


def text_ns(text: pl.Series) -> pl.Series:
    """Absolute integer ns from the text of µs timestamps, row by row as the typed decode's
    floats give them: `float_ns` below `EXACT_LIMIT_US`, `exact_ns` (from the text) at or past
    it, where a double cannot hold the ns."""
    us = text.cast(pl.Float64, strict=False)
    return pl.select(pl.when(us.abs() >= EXACT_LIMIT_US).then(exact_ns(text)).otherwise(float_ns(us))).to_series()


def exact_ns(text: pl.Series) -> pl.Series:
    """Absolute integer ns from the decimal text of a µs timestamp, exactly (rounded to the
    nearest ns); other number forms (exponents) through a float (`clock_ns`). A value at
    `CLOCK_LIMIT_NS` or beyond is taken as ±CLOCK_LIMIT_NS, never wrapped around int64."""
    parts = text.str.extract_groups(r"^(-?)(\d+)(?:\.(\d*))?$").struct.unnest()
    parts.columns = ["sign", "whole", "frac"]
    whole = pl.col("whole")
    tenths = pl.col("frac").fill_null("").str.pad_end(4, "0").str.slice(0, 4).cast(pl.Int64)
    ns = pl.when(whole.cast(pl.Float64) >= CLOCK_LIMIT_NS / 1000).then(CLOCK_LIMIT_NS) \
        .otherwise(whole.cast(pl.Int64, strict=False) * 1000 + (tenths + 5) // 10)
    signed = pl.when(pl.col("sign") == "-").then(-ns).otherwise(ns)
    fallback = clock_ns(pl.col("text").cast(pl.Float64, strict=False) * 1000)
    return parts.with_columns(text=text).select(signed.fill_null(fallback).alias("ts_ns")).to_series()


def _with_ns(table: pl.DataFrame, origin_us: int) -> pl.DataFrame:
    """start/end in integer ns from the origin (`origin_us`, a whole µs)."""
    start = pl.col("ts_ns") - origin_us * 1000
    return table.with_columns(start=start, end=start + pl.col("dur_ns")).drop("ts_ns", "dur_ns")


def ints(values: list) -> pl.Series:
    """Int64 column from ints, numeric strings or anything else (→ null)."""
    return pl.Series(values, dtype=pl.Int64, strict=False)


def strings(values: list) -> pl.Series:
    """String column; numbers become their text, other values null."""
    return pl.Series(values, dtype=pl.String, strict=False)


def dims(values: list) -> pl.Series:
    """Grid/block sizes as `x`-joined text ([24017, 1, 1] → "24017x1x1")."""
    return strings(list(map(str, values))).str.strip_chars("[]'").str.replace_all(", ", "x").replace("None", None)


def digits(values: list) -> pl.Series:
    """The first number in each value (`"stream 7"` → 7; 7 → 7); null where it has none or
    none an int64 holds."""
    return strings(values).str.extract(r"(\d+)", 1).cast(pl.Int64, strict=False)


# The collective args Kineto writes on record_param_comms ops and NCCL kernels.
COMM_ARGS = {"collective": strings, "in_nelems": ints, "out_nelems": ints, "group_size": ints,
             "dtype": strings, "pg_name": strings, "pg_desc": strings, "pg_ranks": strings}
# The args of device-side records (`cuda_sync`, `gpu_user_annotation`).
MARK_ARGS = {"correlation": ints, "device": ints, "sync_kind": strings, "stream": ints,
             "wait_on_stream": ints, "wait_on_record": ints}
# The native decoder's groups of rows (`native.raw_columns`): each table's events (by their
# cat, `ROUTE`) with the columns it is made of (`columns_tables`), and the rest (every other
# complete event) with what the facts and the extent read of them.
_EVERY_TABLE = ("cat", "name", "ts", "dur", "ts_exact", "tid", "external_id", "external_id_2021", "pid", "rank")
GROUP_COLUMNS = {
    "gpu": (*_EVERY_TABLE, "device", "stream", "correlation", "bytes", "grid", "block", *COMM_ARGS),
    "calls": (*_EVERY_TABLE, "correlation"),
    "ops": (*_EVERY_TABLE, "input_dims", "input_types", "concrete_inputs", *COMM_ARGS),
    "marks": (*_EVERY_TABLE, *MARK_ARGS),
    "rest": ("cat", "ts", "dur", "ts_exact"),
}
GROUPS = tuple((tuple(cat for cat, to in ROUTE.items() if to == name) if name in TABLES else None, columns)
               for name, columns in GROUP_COLUMNS.items())


def _with_args(events: list, table: pl.DataFrame, columns: dict) -> pl.DataFrame:
    """`table` (rows of `events`, by idx) with tid, ext_id and the named args, each
    column made by its converter (`ints`: a value of another type becomes null). ext_id: the
    `External id`, else `external id` (PyTorch 1.8–1.10's spelling)."""
    chosen = gather(events, table["idx"])
    args = values("args", chosen)
    made = {"tid": ints(values("tid", chosen)),
            "ext_id": ints(values("external_id", args)).fill_null(ints(values("external_id_2021", args))),
            "pid": ints(values("pid", chosen)), "rank_arg": ints(values("rank", args))}
    for name, convert in columns.items():
        made[name] = convert(values(name, args))
    return table.with_columns(**made)


def raw_text(raws: list) -> pl.Series:
    """String column of raw JSON values (`msgspec.Raw`) as their text; empty → null. Joined
    into one text and split by polars, not decoded one by one: JSON text holds no NUL."""
    if not raws:
        return pl.Series([], dtype=pl.String)
    joined = pl.Series([b"\0".join(raws).decode()], dtype=pl.String)
    return joined.str.split("\0").explode().replace("", None)


def _ops_table(events: list, table: pl.DataFrame) -> pl.DataFrame:
    """CPU ops with their input shapes, dtypes and scalars as JSON text (`input_dims`,
    `input_types`, `concrete_inputs`: Kineto's `Input Dims`, `Input type`, `Concrete Inputs`,
    where shapes are recorded); the collective args are read only for `record_param_comms`
    ops."""
    ops = _with_args(events, table, {"input_dims": raw_text, "input_types": raw_text,
                                     "concrete_inputs": raw_text})
    records = ops.filter(pl.col("name") == "record_param_comms").select("idx")
    comm = _with_args(events, records, COMM_ARGS).drop("tid", "ext_id", "pid", "rank_arg")
    return ops.join(comm, on="idx", how="left", maintain_order="left")


def _gpu_table(events: list, table: pl.DataFrame) -> pl.DataFrame:
    """Device activities. `device` from args, else the event's pid (Kineto's device row);
    `stream` from args, else the number in the tid (`"stream 7"`, PyTorch 1.8–1.10)."""
    gpu = _with_args(events, table, {
        "device": ints, "stream": ints, "correlation": ints, "bytes": ints,
        "grid": dims, "block": dims, **COMM_ARGS,
    })
    if gpu["stream"].null_count() or gpu["device"].null_count():
        chosen = gather(events, gpu["idx"])
        gpu = gpu.with_columns(stream=pl.col("stream").fill_null(digits(values("tid", chosen))),
                               device=pl.col("device").fill_null(ints(values("pid", chosen))))
    return gpu.rename({"cat": "kind"})


def values(name: str, objects: list) -> list:
    """[o.<name> for o in objects]."""
    return reader(name)(objects)


@cache
def reader(name: str):
    """A comprehension reading one field, compiled per name: the interpreter then reads the
    struct's slot directly, 1.5-4× faster than `map(attrgetter(name))` (a generic lookup per
    object)."""
    return eval(f"lambda objects: [o.{name} for o in objects]")


def gather(events: list, idx: pl.Series) -> list:
    """events[i] for i in idx, in one C-level call."""
    if idx.len() < 2:
        return [events[i] for i in idx.to_list()]
    return list(itemgetter(*idx.to_list())(events))


def _rank(path, doc) -> tuple[int, str]:
    """(rank, where it came from): distributedInfo, else the file name, else 0."""
    info = getattr(doc, "distributedInfo", None)
    if info and info.rank is not None:
        return info.rank, "distributedInfo"
    m = _RANK_IN_NAME.search(files.name(path))
    if m:
        return int(m.group(1)), "file name"
    return 0, "default"


def read_manifest(path: Path) -> dict:
    """A `tracekit profile` manifest.json; bad input raises TraceError."""
    if not path.is_file():
        raise TraceError(path.parent, "no manifest.json: not a tracekit profile output")
    try:
        manifest = msgspec.json.decode(files.read_bytes(path))
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


def profile_variant(path) -> tuple[dict | None, str | None]:
    """(the manifest, the variant) of the `tracekit profile` output a trace file
    (OUT/<variant>/rank<r>…) or variant directory (OUT/<variant>) belongs to; (None, None)
    otherwise."""
    manifest = manifest_near(path)
    if manifest is None:
        return None, None
    path = Path(path).resolve()
    return manifest, (path.parent if path.is_file() else path).name


def traceless_variants(manifest: dict, runs: dict) -> list[str]:
    """The variants that ran (ok) whose traces are not in `runs`: recorded with
    `--profile-steps 0`, or their folders not kept."""
    return [v for v, e in manifest["variants"].items() if e.get("status") == "ok" and v not in runs]


def load_profile(out, names: bool = False, then=None) -> tuple[dict, dict[str, Run]]:
    """A `tracekit profile` output: (manifest, {variant: Run}) for the variants that ran and
    whose traces are here — the attributed recording (OUT/<variant>), or with `names` the `full`
    step that names a `lean` recording (OUT/<variant>/names; variants without one left out). A
    variant whose folder is absent (a copy that kept the manifest only) is left out: its timed
    figures are in the manifest (`traceless_variants` names them). The variants are loaded in a
    pool of threads (`executor.in_threads`), each with `then(run, variants)` where it was loaded
    (`variants`: every one loaded), so that one variant's analyses run while another's traces
    are decoded."""
    out = Path(out)
    manifest = read_manifest(out / "manifest.json")
    folders = {}
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok" or not all(r.get("trace") for r in entry["ranks"]):
            continue  # failed, or run with --profile-steps 0: no traces
        folder = out / variant / "names" if names else out / variant
        if names and not all(len(r.get("recorded", [])) > 1 for r in entry["ranks"]):
            continue
        if folder.is_dir():
            folders[variant] = folder

    def loaded(variant: str) -> Run:
        run = load_run(folders[variant])
        missing = {r["rank"] for r in manifest["variants"][variant]["ranks"]} - {t.rank for t in run.traces}
        if missing:
            raise TraceError(folders[variant], f"missing {listed('rank', sorted(missing))}")
        if then is not None:
            then(run, list(folders))
        return run

    return manifest, dict(zip(folders, in_threads(loaded, list(folders))))  # the first error in the manifest's order
