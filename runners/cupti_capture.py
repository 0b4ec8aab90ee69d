"""The `cupti` capture mode: device activity straight from CUPTI's Activity API, written as a
Kineto trace (docs/profile.md, "Capture modes").

What is recorded: kernels (CONCURRENT_KERNEL: NCCL's and CUDA-graph-launched ones too),
copies (MEMCPY) and memsets (MEMSET), nothing else — no runtime or driver API records, no
Kineto. CUPTI writes the records into one buffer (`BUFFER_BYTES`) that it asks for when the
capture is enabled; it hands the buffer back only when it is full or flushed, so no Python
runs inside the recorded steps unless a step fills it. After the last step of a round the
activity kinds are disabled and the buffer flushed (`DeviceCapture.stop`); the next round
enables them again into the same capture, so one trace holds every round's steps.

Steps and phases. Without runtime records a kernel's launching call is not in the trace, so
the runner marks the stream itself: at each phase-clock mark (`runners/clock.py`) it issues
one 1-byte memset of `MARK_VALUE` on the current stream (`DeviceCapture.mark`). CUPTI gives
every CUDA call a correlation id from one counter, in the order the calls are made, so an
activity whose correlation id lies between a phase's two markers was launched in that
phase. The writer drops the markers, writes each step's `ProfilerStep#N` and each
`tracekit#<phase>` as user annotations (wall-clock times of the phase clocks, as `device`
mode does) with an `External id`, and gives each activity the `External id` of the phase it
was launched in: Kineto's meaning of that field (the innermost recorded CPU range around the
launch). CUPTI's timestamps are on the wall clock, as Kineto's and the phase clocks' are.

Other threads. CUPTI's correlation ids are one counter for every thread, so the correlation
range of a phase also holds what other threads launched meanwhile (an async checkpoint's
copies, a data loader's pinned copies). The capture pushes an external correlation id on the
runner's thread for the whole round (EXTERNAL_CORRELATION records: correlation id → that id,
for the calls of that thread only); the writer gives the phase only to activities whose call
has that record. One launched by another thread gets its step's External id, no phase, and
`launching thread: other` in its args (the trace names it `unknown` phase), and is counted.
Where the capture holds no such record at all, which thread launched what cannot be told:
every activity is placed by its correlation range, and the trace says so (`threads`). (CUPTI
may write these records only beside runtime/driver API records, which this capture does not
enable; the kind CUSTOM2 is one Kineto does not push.)

Losses. A record CUPTI could not time (start = end = 0, "timestamp not collected") is left
out and counted; so is CUPTI's own count of records it dropped for want of buffer space
(`cuptiActivityGetNumDroppedRecords`, read after every flush). Both are warned on stderr,
written into the trace (`tracekitCapture`, and its `traceName`, which `lint` reads) and
returned to the runner for the manifest.

Names are written as Kineto writes them: C++ names demangled with libstdc++'s
`__cxa_demangle`, others (`nvjet_…`, NCCL's `ncclDevKernel_…` are C) as they come.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gzip
import json
import os
import sys
import threading

from tracekit.core.demangle import demangled

BUFFER_BYTES = 256 * 1024 * 1024  # ~250 bytes a record: ~1 M records, ~200 large/16 steps
MARK_VALUE = 0xA5  # the byte the runner's marker memsets write (1 byte each)
KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "EXTERNAL_CORRELATION")
ACTIVITIES = ("kernel", "memcpy", "memset")  # the record kinds written as activities
# CUPTI's enums (cupti_activity.h) → Kineto's words
COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
              9: "HtoH", 10: "PtoP"}
MEMORY_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}
# What each activity kind keeps of its record (cupti-python's attribute names)
FIELDS = {
    "kernel": ("name", "start", "end", "device_id", "context_id", "stream_id", "correlation_id", "grid_x", "grid_y",
               "grid_z", "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_memory",
               "dynamic_shared_memory", "queued", "graph_id"),
    "memcpy": ("start", "end", "device_id", "context_id", "stream_id", "correlation_id", "bytes", "copy_kind",
               "src_kind", "dst_kind"),
    "memset": ("start", "end", "device_id", "context_id", "stream_id", "correlation_id", "bytes", "value",
               "memory_kind"),
    "external": ("correlation_id", "external_id"),  # a call of the runner's thread (`DeviceCapture.start`)
}


def why_unavailable() -> str | None:
    """Why a direct CUPTI capture cannot run in this process (None when it can): the package
    missing, or built for another CUDA major version than torch's."""
    import torch

    try:
        from cuda.bindings import runtime  # noqa: F401  (the runner's stream markers)
        from cupti import cupti
    except Exception as e:  # ImportError, or the library it loads is missing
        return f"cupti-python is not importable ({type(e).__name__}: {e})".splitlines()[0]
    from importlib.metadata import PackageNotFoundError, version

    try:
        theirs = version("cupti-python").split(".")[0]
    except PackageNotFoundError:
        theirs = None
    ours = (torch.version.cuda or "").split(".")[0]
    if theirs and ours and theirs != ours:
        return f"cupti-python {version('cupti-python')} is for CUDA {theirs}, torch uses CUDA {torch.version.cuda}"
    del cupti, runtime
    return None


def as_record(kind: str, activity) -> dict:
    """The fields of one CUPTI activity that the writer needs, copied out of CUPTI's buffer."""
    return {"kind": kind, **{f: getattr(activity, f, None) for f in FIELDS[kind]}}


class DeviceCapture:
    """One direct CUPTI capture: `start()` before the first recorded step, `mark()` at each
    phase-clock mark, `stop()` after the device is drained; then `records` holds the
    activities (dicts, `as_record`), `marks` the number of markers issued and `dropped` the
    records CUPTI dropped (its count, read after every flush)."""

    def __init__(self, device):
        import torch

        self.device = device
        self.records: list[dict] = []
        self.marks = 0
        self.dropped = 0
        self._byte = torch.empty(1, dtype=torch.uint8, device=device)
        from cuda.bindings import runtime

        self._memset = runtime.cudaMemsetAsync

    def start(self) -> None:
        from cupti import cupti

        names = {cupti.ActivityKind.CONCURRENT_KERNEL: "kernel", cupti.ActivityKind.MEMCPY: "memcpy",
                 cupti.ActivityKind.MEMSET: "memset", cupti.ActivityKind.EXTERNAL_CORRELATION: "external"}

        def requested():
            return BUFFER_BYTES, 0

        def completed(activities):
            self.records += [as_record(names[a.kind], a) for a in activities if a.kind in names]
        # Kineto's teardown unregisters whatever callbacks CUPTI had: register ours every time.
        cupti.activity_register_callbacks(requested, completed)
        for kind in KINDS:
            cupti.activity_enable(getattr(cupti.ActivityKind, kind))
        # this thread's calls, and no other's, get an EXTERNAL_CORRELATION record
        cupti.activity_push_external_correlation_id(cupti.ExternalCorrelationKind.CUSTOM2, threading.get_native_id())

    def mark(self) -> None:
        """A 1-byte memset of `MARK_VALUE` on the current stream: its correlation id separates
        the calls made before this mark from those after."""
        import torch

        err, = self._memset(self._byte.data_ptr(), MARK_VALUE, 1, torch.cuda.current_stream(self.device).cuda_stream)
        if int(err) != 0:
            raise RuntimeError(f"cudaMemsetAsync (a stream marker) failed: {err}")
        self.marks += 1

    def stop(self) -> None:
        from cupti import cupti

        cupti.activity_pop_external_correlation_id(cupti.ExternalCorrelationKind.CUSTOM2)
        for kind in KINDS:
            cupti.activity_disable(getattr(cupti.ActivityKind, kind))
        cupti.activity_flush_all(1)
        self.dropped += int(cupti.activity_get_num_dropped_records(0, 0))  # the global buffer: no context, stream 0


def is_marker(record: dict) -> bool:
    return record["kind"] == "memset" and record["bytes"] == 1 and record["value"] == MARK_VALUE


def untimed(record: dict) -> bool:
    """A record CUPTI could not time: start = end = 0 ("timestamp not collected")."""
    return not record["start"] and not record["end"]


def kineto_trace(records: list[dict], blocks: list[list[tuple[int, list[tuple[str | None, int]]]]], *, pid: int,
                 tid: int, base_ns: int, meta: dict | None = None, dropped: int = 0) -> dict:
    """A Kineto trace (as JSON) of the activity `records` (`as_record`) of the recorded steps in
    `blocks` (the capture's rounds, in order; `record_steps` runs one a round): per step
    (number, its phase-clock marks [(phase or None for the start, wall ns)]), whose marks were
    the capture's markers in that order. Only what was launched inside a block, between its
    first marker and its last, is kept (not the warm-up step before each). Timestamps are µs
    since `base_ns` (three decimals, as Kineto writes them); `meta` adds top-level keys
    (`deviceProperties`, `distributedInfo`, …). Records CUPTI could not time are left out;
    where `external` records exist, only activities whose call has one (the runner's thread)
    take their phase, the others their step (module docstring). `tracekitCapture` holds the
    counts (`untimed_records`, `dropped_records` as given, `other_thread_activities`) and
    `threads` (`told` | `not told`); `traceName` names the losses. Raises ValueError when the
    markers found are not the marks given."""
    markers = sorted(r["correlation_id"] for r in records if is_marker(r))
    steps = [s for block in blocks for s in block]
    wanted = sum(len(marks) for _, marks in steps)
    if len(markers) != wanted or not wanted:
        raise ValueError(f"the capture holds {len(markers)} marker memsets where the runner made {wanted}")

    def us(ns):
        return round((ns - base_ns) / 1000, 3)

    events, ranges, ext, at = [], [], 0, 0  # ranges: (first correlation, last correlation, External id)
    whole = []  # per step: (its first marker's correlation, its last one's, its External id)
    for number, marks in steps:
        ext += 1
        whole.append((markers[at], markers[at + len(marks) - 1], ext))
        source = {"source": "tracekit runner (phase clocks, wall clock)"}
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": pid, "tid": tid,
                       "ts": us(marks[0][1]), "dur": round((marks[-1][1] - marks[0][1]) / 1000, 3),
                       "args": {"External id": ext, **source}})
        for (_, t0), (phase, t1) in zip(marks, marks[1:]):
            ext += 1
            events.append({"ph": "X", "cat": "user_annotation", "name": f"tracekit#{phase}", "pid": pid, "tid": tid,
                           "ts": us(t0), "dur": round((t1 - t0) / 1000, 3), "args": {"External id": ext, **source}})
            ranges.append((markers[at], markers[at + 1], ext))
            at += 1
        at += 1
    spans, at = [], 0  # each block's first and last marker
    for block in blocks:
        n = sum(len(marks) for _, marks in block)
        if n:
            spans.append((markers[at], markers[at + n - 1]))
        at += n
    own = {r["correlation_id"] for r in records if r["kind"] == "external"}
    kept = [r for r in records if r["kind"] in ACTIVITIES and not is_marker(r) and not untimed(r)
            and any(a < r["correlation_id"] < b for a, b in spans)]
    other = [r for r in kept if own and r["correlation_id"] not in own]
    events += [activity_event(r, us, launched_in(r["correlation_id"], whole), other=True) for r in other]
    events += [activity_event(r, us, launched_in(r["correlation_id"], ranges)) for r in kept
               if not own or r["correlation_id"] in own]
    devices = sorted({r["device_id"] for r in kept})
    streams = sorted({(r["device_id"], r["stream_id"]) for r in kept})
    events += [{"name": "process_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": f"GPU {d}"}} for d in devices]
    events += [{"name": "thread_name", "ph": "M", "pid": d, "tid": s, "args": {"name": f"stream {s} "}}
               for d, s in streams]
    events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"thread {tid}"}})
    lost = {"untimed_records": sum(1 for r in records if r["kind"] in ACTIVITIES and untimed(r)),
            "dropped_records": dropped, "other_thread_activities": len(other),
            "threads": "told" if own else "not told"}
    return {"schemaVersion": 1, **(meta or {}), "baseTimeNanoseconds": base_ns, "displayTimeUnit": "ms",
            "traceName": trace_name(lost), "tracekitCapture": lost, "traceEvents": events}


def trace_name(lost: dict) -> str:
    """`tracekit cupti capture`, and what it lost: `; CUPTI dropped N records`, `; N records
    without timestamps left out`, `; launching threads not told` (`lint` reads them)."""
    return "tracekit cupti capture" + (f"; CUPTI dropped {lost['dropped_records']} records" if lost["dropped_records"]
                                       else "") + (f"; {lost['untimed_records']} records without timestamps left out"
                                                   if lost["untimed_records"] else "") + \
        ("; launching threads not told" if lost["threads"] == "not told" else "")


def launched_in(correlation: int, ranges: list[tuple[int, int, int]]) -> int | None:
    """The External id of the phase (or step) whose markers' correlation ids enclose
    `correlation`."""
    for first, last, ext in ranges:
        if first < correlation < last:
            return ext
    return None


def activity_event(r: dict, us, ext: int | None, other: bool = False) -> dict:
    """One activity record as Kineto writes it (`kernel`, `gpu_memcpy`, `gpu_memset`); `other`:
    launched by another thread than the runner's (`launching thread: other`)."""
    args = {"External id": ext} if ext is not None else {}
    if other:
        args["launching thread"] = "other"
    args.update({"device": r["device_id"], "context": r["context_id"], "stream": r["stream_id"],
                 "correlation": r["correlation_id"]})
    dur_ns = r["end"] - r["start"]
    if r["kind"] == "kernel":
        cat, name = "kernel", demangled(r["name"])
        args.update({"queued": r.get("queued") or 0, "registers per thread": r["registers_per_thread"],
                     "shared memory": (r["static_shared_memory"] or 0) + (r["dynamic_shared_memory"] or 0),
                     "grid": [r["grid_x"], r["grid_y"], r["grid_z"]], "block": [r["block_x"], r["block_y"], r["block_z"]]})
        if r.get("graph_id"):
            args["graph id"] = r["graph_id"]
    elif r["kind"] == "memcpy":
        cat = "gpu_memcpy"
        name = (f"Memcpy {COPY_KINDS.get(r['copy_kind'], 'Unknown')} ({MEMORY_KINDS.get(r['src_kind'], 'Unknown')} -> "
                f"{MEMORY_KINDS.get(r['dst_kind'], 'Unknown')})")
        args.update({"bytes": r["bytes"], "memory bandwidth (GB/s)": r["bytes"] / dur_ns if dur_ns > 0 else 0})
    else:
        cat, name = "gpu_memset", f"Memset ({MEMORY_KINDS.get(r['memory_kind'], 'Unknown')})"
        args.update({"bytes": r["bytes"], "memory bandwidth (GB/s)": r["bytes"] / dur_ns if dur_ns > 0 else 0})
    return {"ph": "X", "cat": cat, "name": name, "pid": r["device_id"], "tid": r["stream_id"], "ts": us(r["start"]),
            "dur": round(dur_ns / 1000, 3), "args": args}


def trace_meta(device) -> dict:
    """What Kineto writes at the top of a trace that the core reads: `deviceProperties` and
    `distributedInfo`."""
    import torch
    import torch.distributed as dist

    p = torch.cuda.get_device_properties(device)
    props = [{"id": device.index or 0, "name": p.name, "totalGlobalMem": p.total_memory, "computeMajor": p.major,
              "computeMinor": p.minor, "numSms": p.multi_processor_count}]
    info = None
    if dist.is_available() and dist.is_initialized():
        info = {"backend": dist.get_backend(), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
        if info["backend"] == "nccl":
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    return {"deviceProperties": props, **({"distributedInfo": info} if info else {})}


def write_trace(path, capture: DeviceCapture, blocks, device) -> dict:
    """Writes the capture's records with the steps' marks, block by block (`kineto_trace`), to
    the gzipped `path`, its base time the whole second before the first timed record; warns on
    stderr of what was lost. Returns the trace's `tracekitCapture` counts."""
    base = min((r["start"] for r in capture.records if r["kind"] in ACTIVITIES and not untimed(r)),
               default=0) // 10**9 * 10**9
    trace = kineto_trace(capture.records, blocks, pid=os.getpid(), tid=threading.get_native_id(), base_ns=base,
                         meta=trace_meta(device), dropped=capture.dropped)
    with gzip.open(path, "wt", compresslevel=6) as f:
        json.dump(trace, f, separators=(",", ":"))
    lost = trace["tracekitCapture"]
    for line in warnings(lost):
        print(f"tracekit profile: warning: {path}: {line}", file=sys.stderr, flush=True)
    return lost


def warnings(lost: dict) -> list[str]:
    """One line per loss of a capture (`kineto_trace`'s `tracekitCapture`)."""
    return ([f"CUPTI dropped {lost['dropped_records']} records (its buffer was full): the steps lack that work"]
            if lost["dropped_records"] else []) + \
        ([f"{lost['untimed_records']} records CUPTI could not time (start = end = 0) left out"]
         if lost["untimed_records"] else []) + \
        ([f"{lost['other_thread_activities']} activities launched by other threads than the runner's: their "
          "step kept, their phase unknown"] if lost["other_thread_activities"] else [])
