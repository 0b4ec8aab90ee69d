"""Reading what the allocator did over a step into one table of allocations (`MemoryRecord`),
from any of three files (docs/metrics.md, "Memory over the step"):

- a CUDA caching-allocator snapshot (`torch.cuda.memory._snapshot()` after
  `_record_memory_history`, pickled as `memory_viz` takes it): every alloc and free with its
  Python stack, the segments cudaMalloc'd (reserved memory), and the blocks alive when it was
  taken — those allocated before the history began included, without a stack;
- a Kineto trace recorded with `profile_memory=True`: its `[memory]` events (address, bytes,
  the allocator's totals), each given the chain of ops, modules and annotations around it on
  its thread (with `with_stack`, the Python frames too), and the runner's `tracekit#<phase>`
  annotations as phases;
- the compact record `tracekit profile` writes per rank (`<variant>/memory/rank<r>.json.gz`),
  made from one of the two with the model's state tagged (`with_state`).

Every time is ns on the wall clock (ns since the epoch); an allocation is live from its
`alloc_ns` (null: before the record began) to its `free_ns` (null: still live at its end).
"""

from __future__ import annotations

import gzip
import json
import pickle
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from .errors import TraceError

FORMAT = "tracekit-memory"
RECORD = re.compile(r"rank\d+\.json\.gz")  # a compact record's name (not the CPU step's trace beside it)
MARK_FUNCTION = "phase_mark"  # the runner's marker allocation (runners/memory_record.py): a phase boundary
MAX_FRAMES = 24  # innermost frames kept per allocation
BEFORE = "(allocated before the record)"
BLOCK_SCHEMA = {"addr": pl.Int64, "bytes": pl.Int64, "alloc_ns": pl.Int64, "free_ns": pl.Int64, "stack": pl.String,
                "tag": pl.String}


@dataclass
class MemoryRecord:
    """One rank's allocations over one step.

    - `blocks`: one row per allocation: `addr`, `bytes` (the allocator's block size), `alloc_ns`,
      `free_ns`, `stack` (frames, ops and annotations, innermost first, joined by " < "), `tag`
      (`param`, `grad`, `optimizer`: the model's state, tagged by the runner; else null);
    - `phases`: `phase`, `start_ns`, `end_ns` (empty when the file has none);
    - `reserved`: `t_ns`, `reserved_bytes` from that time on (empty without a caching allocator);
    - `allocator_peak_bytes`: the allocator's own peak over the step (the runner's
      `max_memory_allocated`), where known."""

    path: str
    source: str  # "snapshot", "kineto" or "tracekit" (the runner's compact record)
    blocks: pl.DataFrame
    phases: pl.DataFrame
    reserved: pl.DataFrame
    start_ns: int
    end_ns: int
    rank: int | None = None
    variant: str | None = None
    device: str | None = None
    allocator_peak_bytes: int | None = None
    notes: list[str] = field(default_factory=list)


def blocks_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=BLOCK_SCHEMA, orient="row")


def phases_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"phase": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")


def reserved_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"t_ns": pl.Int64, "reserved_bytes": pl.Int64}, orient="row")


def short_path(name: str) -> str:
    """An absolute source file from its package on (`torch/nn/modules/linear.py`), else its last
    two parts (`runners/model.py`); a relative one as it is (Kineto's own are relative to the
    import path)."""
    for cut in ("site-packages/", "dist-packages/"):
        if cut in name:
            return name.split(cut, 1)[1]
    return "/".join(name.split("/")[-2:]) if name.startswith("/") else name


def frame_text(frame: dict) -> str:
    """`file(line): name` (`short_path`), as Kineto names a Python frame."""
    return f"{short_path(str(frame.get('filename', '?')))}({frame.get('line', 0)}): {frame.get('name', '?')}"


def event_name(event: dict) -> str:
    """An op's or annotation's name; a Kineto Python frame's (`/path/file.py(12): f`) with its file
    shortened as `frame_text` does."""
    name = str(event.get("name", ""))
    if event.get("cat") == "python_function" and "(" in name and name.split("(", 1)[0].endswith(".py"):
        path, rest = name.split("(", 1)
        return f"{short_path(path)}({rest}"
    return name


def stack_text(frames: list[dict]) -> str:
    return " < ".join(frame_text(f) for f in frames[:MAX_FRAMES])


def is_mark(frames: list[dict]) -> bool:
    return bool(frames) and frames[0].get("name") == MARK_FUNCTION


def from_snapshot(snapshot: dict, path, device: int | None = None) -> tuple[MemoryRecord, list[int]]:
    """The record of one device's history in an allocator snapshot (the device with the most
    entries unless `device`), and the times of the runner's marker allocations (`phase_mark`,
    left out of the blocks). An allocation ends at `free_requested` (when the allocator stops
    counting it as allocated), else `free_completed`. Times: the entries' `time_us`, made
    strictly increasing (an entry in the same µs as the one before it comes 1 ns after it)."""
    if not isinstance(snapshot, dict) or "segments" not in snapshot or "device_traces" not in snapshot:
        raise TraceError(path, "not an allocator snapshot (expected a dict with segments and device_traces)")
    traces = snapshot["device_traces"]
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d])) if traces else 0
    entries = traces[device] if device < len(traces) else []
    if not entries:
        raise TraceError(path, "no allocation history in this snapshot: record it with "
                               "torch.cuda.memory._record_memory_history(max_entries=...) before the step")
    rows, marks, changes, open_, requested, marked = [], [], [], {}, set(), set()
    t = 0
    for entry in entries:
        t = max(int(entry.get("time_us", 0)) * 1000, t + 1)
        action, addr, size = entry["action"], entry.get("addr"), int(entry.get("size", 0))
        if action == "alloc":
            if is_mark(entry.get("frames", [])):
                marks.append(t)
                marked.add(addr)
            else:
                open_[addr] = (t, size, stack_text(entry.get("frames", [])))
        elif action in ("free_requested", "free_completed"):
            if action == "free_completed" and addr in requested:
                requested.discard(addr)
                continue
            if action == "free_requested":
                requested.add(addr)
            if addr in marked:
                marked.discard(addr)
            elif addr in open_:
                start, size, stack = open_.pop(addr)
                rows.append((addr, size, start, t, stack, None))
            else:
                rows.append((addr, size, None, t, BEFORE, None))
        elif action in ("segment_alloc", "segment_map"):
            changes.append((t, size))
        elif action in ("segment_free", "segment_unmap"):
            changes.append((t, -size))
    first, last = max(int(entries[0].get("time_us", 0)) * 1000, 1), t
    rows += [(addr, size, start, None, stack, None) for addr, (start, size, stack) in open_.items()]
    alive = set(open_) | marked
    segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
    for segment in segments:
        address = segment["address"]
        for block in segment.get("blocks", []):
            at = block.get("address", address)
            address = at + block["size"]
            if block["state"] in ("active_allocated", "active_awaiting_free") and at not in alive:
                rows.append((at, block["size"], None, None, stack_text(block.get("frames", [])) or BEFORE, None))
    total = sum(s["total_size"] for s in segments)
    before = total - sum(c for _, c in changes)
    reserved = [(first - 1, before)]
    for when, change in changes:
        reserved.append((when, reserved[-1][1] + change))
    notes = []
    if snapshot.get("max_entries") and len(entries) >= snapshot["max_entries"]:
        notes.append("the history filled its max_entries: its first entries may be lost")
    record = MemoryRecord(str(path), "snapshot", blocks_frame(rows), phases_frame([]), reserved_frame(reserved),
                          first, last, device=f"cuda:{device}", notes=notes)
    return record, marks


class SnapshotUnpickler(pickle.Unpickler):
    """An allocator snapshot holds dicts, lists, strings and numbers only: nothing else is built
    (a pickle that names a class or function is refused, not run)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a snapshot names no classes ({module}.{name})")


def read_snapshot(path) -> MemoryRecord:
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            snapshot = SnapshotUnpickler(f).load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
        raise TraceError(path, f"not a readable snapshot pickle ({str(e).splitlines()[0]})") from None
    return from_snapshot(snapshot, path)[0]


def chains(events: list[dict], times: list[tuple[int, float]]) -> dict[int, str]:
    """For each (index, ts) of `times` on one thread, the names of the `events` (X events of that
    thread) around it, innermost first, joined by " < "."""
    spans = sorted(((e["ts"], e["ts"] + e.get("dur", 0), event_name(e)) for e in events), key=lambda s: (s[0], -s[1]))
    out, stack, i = {}, [], 0
    for index, ts in sorted(times, key=lambda x: x[1]):
        while i < len(spans) and spans[i][0] <= ts:
            while stack and stack[-1][1] < spans[i][0]:
                stack.pop()
            stack.append(spans[i])
            i += 1
        while stack and stack[-1][1] < ts:
            stack.pop()
        out[index] = " < ".join(s[2] for s in reversed([s for s in stack if s[1] >= ts][-MAX_FRAMES:]))
    return out


STACK_CATEGORIES = ("cpu_op", "python_function", "user_annotation")


def from_kineto(trace: dict, path) -> MemoryRecord:
    """The record of a Kineto trace's `[memory]` events (of its CUDA device with the most, else
    the CPU), each with the chain of ops, Python frames and annotations around it on its thread,
    and its `tracekit#<phase>` annotations as phases (without any, its `ProfilerStep#<n>` as
    `step <n>`). On CUDA, memory allocated before the
    recording began (the allocator's `Total Allocated` at the first event less its bytes) is one
    block alive throughout (the CPU's total is left out: it counts only what a profiler with
    `profile_memory` saw allocated, and keeps what was freed while none ran); an allocation
    freed without its alloc in the trace is one alive until then."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    memory = [e for e in events if e.get("name") == "[memory]" and isinstance(e.get("args"), dict)]
    if not memory:
        raise TraceError(path, "no [memory] events: record with torch.profiler.profile(profile_memory=True)")
    devices = {}
    for e in memory:
        key = (e["args"].get("Device Type", 0), e["args"].get("Device Id", -1))
        devices[key] = devices.get(key, 0) + 1
    device = max(devices, key=lambda k: (k[0] == 1, devices[k]))
    memory = [e for e in memory if (e["args"].get("Device Type", 0), e["args"].get("Device Id", -1)) == device]
    base = int(trace.get("baseTimeNanoseconds", 0))

    def ns(ts: float) -> int:
        return base + round(ts * 1000)
    around = {}
    for tid in {e.get("tid") for e in memory}:
        spans = [e for e in events if e.get("ph") == "X" and e.get("tid") == tid and e.get("cat") in STACK_CATEGORIES]
        around.update(chains(spans, [(i, e["ts"]) for i, e in enumerate(memory) if e.get("tid") == tid]))
    order = sorted(range(len(memory)), key=lambda i: (memory[i]["ts"], memory[i]["args"].get("Ev Idx", 0)))
    rows, open_, t = [], {}, None
    for i in order:
        args = memory[i]["args"]
        t = max(ns(memory[i]["ts"]), t + 1) if t is not None else ns(memory[i]["ts"])
        addr, size = args.get("Addr"), int(args.get("Bytes", 0))
        if size > 0:
            open_[addr] = (t, size, around.get(i, ""))
        elif size < 0 and addr in open_:
            start, size, stack = open_.pop(addr)
            rows.append((addr, size, start, t, stack, None))
        elif size < 0:
            rows.append((addr, -size, None, t, BEFORE, None))
    rows += [(addr, size, start, None, stack, None) for addr, (start, size, stack) in open_.items()]
    first = memory[order[0]]["args"]
    earlier = int(first.get("Total Allocated", 0)) - int(first.get("Bytes", 0)) \
        - sum(r[1] for r in rows if r[2] is None)
    if earlier > 0 and device[0] != 0:  # the CPU's total counts only what profiling saw, and keeps what it freed unseen
        rows.append((None, earlier, None, None, BEFORE, None))
    phases = marked_spans(events, "tracekit#", ns) or marked_spans(events, "ProfilerStep#", ns, "step ")
    reserved = [(ns(memory[i]["ts"]), int(memory[i]["args"].get("Total Reserved", 0))) for i in order]
    reserved = reserved if any(r for _, r in reserved) else []
    start = min([ns(memory[order[0]]["ts"])] + [p[1] for p in phases])
    end = max([t] + [p[2] for p in phases])
    rank = (trace.get("distributedInfo") or {}).get("rank")
    return MemoryRecord(str(path), "kineto", blocks_frame(rows), phases_frame(phases), reserved_frame(reserved),
                        start, end, rank=rank, device="cpu" if device[0] == 0 else f"cuda:{device[1]}")


def marked_spans(events: list[dict], prefix: str, ns, name: str = "") -> list[tuple[str, int, int]]:
    """(`name` + what follows `prefix`, start, end) of the X events whose name starts with
    `prefix` on the host (not their copies on the device's timeline, `gpu_user_annotation`), in
    time order: the runner's `tracekit#<phase>`, or `ProfilerStep#<n>` as `step <n>`."""
    return sorted(((name + e["name"][len(prefix):], ns(e["ts"]), ns(e["ts"] + e.get("dur", 0))) for e in events
                   if e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation"
                   and str(e.get("name", "")).startswith(prefix)), key=lambda p: p[1])


def with_phases(record: MemoryRecord, marks: list[int], names: tuple[str, ...]) -> MemoryRecord:
    """The record with phases from marks: `marks[0]` the step's start, `marks[i]` the end of
    `names[i - 1]`."""
    rows = [(name, a, b) for name, a, b in zip(names, marks, marks[1:])]
    return replace(record, phases=phases_frame(rows), start_ns=marks[0] if marks else record.start_ns,
                   end_ns=marks[-1] if marks else record.end_ns)


def with_state(record: MemoryRecord, state: list[tuple[int, int, str]], at_ns: int) -> MemoryRecord:
    """The record with the model's state tagged: each (address, bytes, tag) of `state` — the
    storages of parameters, gradients and optimizer state, taken at `at_ns` — tags the
    allocation at that address live then; one not in the record (allocated before a recording
    that sees only its own allocations, as the profiler's) is added, live throughout."""
    tags = {addr: (size, tag) for addr, size, tag in state}
    blocks = record.blocks.with_row_index("row")
    live = blocks.filter(pl.col("addr").is_in(list(tags)) & (pl.col("alloc_ns").fill_null(at_ns) <= at_ns)
                         & (pl.col("free_ns").fill_null(at_ns + 1) > at_ns))
    found = dict(zip(live["row"].to_list(), live["addr"].to_list()))
    tagged = blocks.with_columns(tag=pl.col("row").replace_strict(
        {row: tags[addr][1] for row, addr in found.items()}, default=pl.col("tag"), return_dtype=pl.String))
    added = [(addr, size, None, None, BEFORE, tag) for addr, (size, tag) in tags.items()
             if addr not in set(found.values())]
    return replace(record, blocks=pl.concat([tagged.drop("row"), blocks_frame(added)]))


def write_record(record: MemoryRecord, path: Path) -> None:
    """The compact record (gzipped JSON, columns; each distinct stack once)."""
    stacks = record.blocks["stack"].unique(maintain_order=True).to_list()
    index = {s: i for i, s in enumerate(stacks)}
    doc = {"format": FORMAT, "version": 1, "source": record.source, "rank": record.rank, "variant": record.variant,
           "device": record.device, "start_ns": record.start_ns, "end_ns": record.end_ns,
           "allocator_peak_bytes": record.allocator_peak_bytes, "notes": record.notes,
           "phases": record.phases.rows(), "reserved": record.reserved.rows(), "stacks": stacks,
           "blocks": {**{c: record.blocks[c].to_list() for c in ("addr", "bytes", "alloc_ns", "free_ns", "tag")},
                      "stack": [index[s] for s in record.blocks["stack"].to_list()]}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6))
    tmp.replace(path)


def from_compact(doc: dict, path) -> MemoryRecord:
    try:
        blocks = doc["blocks"]
        stacks = doc["stacks"]
        frame = pl.DataFrame({**{c: blocks[c] for c in ("addr", "bytes", "alloc_ns", "free_ns")},
                              "stack": [stacks[i] for i in blocks["stack"]], "tag": blocks["tag"]},
                             schema=BLOCK_SCHEMA)
        return MemoryRecord(str(path), doc["source"], frame, phases_frame([tuple(p) for p in doc["phases"]]),
                            reserved_frame([tuple(r) for r in doc["reserved"]]), doc["start_ns"], doc["end_ns"],
                            doc.get("rank"), doc.get("variant"), doc.get("device"), doc.get("allocator_peak_bytes"),
                            doc.get("notes", []))
    except (KeyError, TypeError, IndexError, ValueError, pl.exceptions.PolarsError) as e:
        raise TraceError(path, f"a damaged memory record ({type(e).__name__}: {e})".splitlines()[0]) from None


def read_json(path) -> MemoryRecord:
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, EOFError, ValueError) as e:
        raise TraceError(path, f"not readable JSON ({str(e).splitlines()[0]})") from None
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        return from_compact(doc, path)
    return from_kineto(doc, path)


def record_files(path: Path) -> list[Path]:
    """The runner's compact records under a profile output (every variant), a variant's folder
    or its `memory/` folder."""
    pattern = "*/memory/rank*.json.gz" if (path / "manifest.json").is_file() \
        else "memory/rank*.json.gz" if (path / "memory").is_dir() else "rank*.json.gz"
    return sorted(p for p in path.glob(pattern) if RECORD.fullmatch(p.name))


def load_memory(path) -> list[MemoryRecord]:
    """Every memory record at `path`: a profile output, variant or memory folder (the runner's
    records, each named by its variant and rank), a snapshot pickle (`.pickle`, `.pkl`, gzipped
    or not), a Kineto trace with `[memory]` events, or a compact record."""
    path = Path(path)
    if path.is_dir():
        files = record_files(path)
        if not files:
            raise TraceError(path, "no memory records here (<variant>/memory/rank<r>.json.gz: "
                                   "recorded by tracekit profile unless --memory off)")
        return [read_json(f) for f in files]
    if not path.is_file():
        raise TraceError(path, "no such file or directory")
    if path.name.endswith((".pickle", ".pkl", ".pickle.gz", ".pkl.gz")):
        return [read_snapshot(path)]
    if path.name.endswith((".json", ".json.gz")):
        return [read_json(path)]
    raise TraceError(path, "expected a snapshot pickle (.pickle, .pkl), a Kineto trace with [memory] events "
                           "or a memory record (.json, .json.gz)")


def memory_beside(trace_path) -> Path | None:
    """The runner's memory record of the rank whose trace is at `trace_path`
    (`<variant>/rank<r>.pt.trace.json.gz` → `<variant>/memory/rank<r>.json.gz`), if there is one."""
    name = Path(str(trace_path)).name
    rank = name.split(".", 1)[0]
    found = Path(str(trace_path)).parent / "memory" / f"{rank}.json.gz"
    return found if rank.startswith("rank") and found.is_file() else None


def records_near(path) -> list[MemoryRecord]:
    """The runner's memory records of what `path` names — a variant's folder, or one rank's trace
    file in it (that rank's record) — none where there are none."""
    path = Path(str(path))
    if path.is_file():
        beside = memory_beside(path)
        return [read_json(beside)] if beside else []
    return [read_json(f) for f in record_files(path)] if path.is_dir() and (path / "memory").is_dir() else []
