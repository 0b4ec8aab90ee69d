"""Decoding Chrome/Kineto trace JSON: only the fields tracekit uses, and which table each
event category belongs to.

msgspec decodes straight into these structs (no dict per event); unknown fields are skipped.
The top level is decoded first with each event left as raw JSON (`msgspec.Raw`, a view into
the file's bytes), then the events are decoded in chunks (`EVENTS`), so that only one chunk
of event structs exists at a time.

A chunk whose events do not fit the typed structs (a field of another type than Kineto
writes, such as roctracer's `"bytes": "1"`) is decoded again by `LOOSE_EVENTS`, where every
field is untyped and floats keep their text; the loader then converts each column, and a
value that cannot be converted becomes null. One odd field never rejects a file.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` of an event, as far as tracekit reads them."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_2021: int | None = msgspec.field(default=None, name="external id")  # PyTorch 1.8–1.10
    correlation: int | None = None
    device: int | None = None
    stream: int | str | None = None
    bytes: int | None = None
    grid: list[int] | str | None = None
    block: list[int] | str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    wait_on_stream: int | None = None  # cuda_sync: the stream whose event is waited on
    wait_on_record: int | None = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    rank: int | None = None  # TraceLens' TraceFuse writes each event's rank here
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")  # cpu_op shapes, JSON kept
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One element of `traceEvents`. `ts`/`dur` are microseconds (Kineto: 3 decimals)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    args: Args = NO_ARGS


class LooseArgs(msgspec.Struct, frozen=True, gc=False):
    """`Args` with every field untyped (same names)."""

    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_2021: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    bytes: Any = None
    grid: Any = None
    block: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    sync_kind: Any = msgspec.field(default=None, name="cuda_sync_kind")
    wait_on_stream: Any = None
    wait_on_record: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    rank: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


NO_LOOSE_ARGS = LooseArgs()


class LooseEvent(msgspec.Struct, gc=False):
    """`Event` with every field untyped; `args` that is not an object is ignored."""

    ph: Any = ""
    name: Any = ""
    cat: Any = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None
    dur: Any = None
    args: LooseArgs | list | str | int | float | bool | None = NO_LOOSE_ARGS


class PGConfig(msgspec.Struct):
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | str | None = None
    backend_config: str | None = None


class DistributedInfo(msgspec.Struct):
    backend: str | None = None
    rank: int | None = None
    world_size: int | None = None
    pg_count: int | None = None
    pg_config: list[PGConfig] | None = None
    nccl_version: str | None = None


class TraceFile(msgspec.Struct):
    """The top level of a Kineto trace file; events still raw JSON."""

    traceEvents: list[msgspec.Raw]
    schemaVersion: int | None = None
    distributedInfo: DistributedInfo | None = None
    deviceProperties: list[dict] | None = None
    baseTimeNanoseconds: int | None = None
    traceName: str | None = None


class LooseTraceFile(msgspec.Struct):
    """The top level when its metadata has unexpected types: only the events are kept."""

    traceEvents: list[msgspec.Raw]


class Phase(msgspec.Struct):
    """Only an event's `ph` (`loading._unread`: whether an event the lenient decode refuses was complete)."""

    ph: Any = ""


DECODER = msgspec.json.Decoder(TraceFile)
LOOSE_DECODER = msgspec.json.Decoder(LooseTraceFile)
EVENTS = msgspec.json.Decoder(list[Event])
# Floats are kept as their JSON text, so that timestamps decode exactly (`loading.exact_ns`).
LOOSE_EVENTS = msgspec.json.Decoder(list[LooseEvent], float_hook=str)
PHASE = msgspec.json.Decoder(Phase)

# Which table each complete ('X') event category goes to, and its normalised name. Kineto's
# category names, PyTorch 1.8–1.10's older ones (`Kernel`, `Runtime`, `Operator`, …) and
# other devices' (MTIA) are all here; `None` marks a category that is known and not analysed.
# Any other category is counted and named (`tracekit lint`), never dropped silently.
CATEGORIES: dict[str, tuple[str, str] | None] = {
    # device activities → `gpu` (kind)
    "kernel": ("gpu", "kernel"), "gpu_memcpy": ("gpu", "gpu_memcpy"), "gpu_memset": ("gpu", "gpu_memset"),
    "Kernel": ("gpu", "kernel"), "Memcpy": ("gpu", "gpu_memcpy"), "Memset": ("gpu", "gpu_memset"),
    "mtia_ccp_events": ("gpu", "kernel"),  # MTIA device work; its `dma*` transfers are memcpy (classify.py)
    # host calls into the device runtime or driver → `calls`
    "cuda_runtime": ("calls", "cuda_runtime"), "cuda_driver": ("calls", "cuda_driver"),
    "Runtime": ("calls", "cuda_runtime"), "mtia_runtime": ("calls", "mtia_runtime"),
    "xpu_runtime": ("calls", "xpu_runtime"), "xpu_driver": ("calls", "xpu_driver"),
    "privateuse1_runtime": ("calls", "privateuse1_runtime"), "privateuse1_driver": ("calls", "privateuse1_driver"),
    # CPU ops, annotations and Python frames → `ops`
    "cpu_op": ("ops", "cpu_op"), "Operator": ("ops", "cpu_op"), "user_annotation": ("ops", "user_annotation"),
    "python_function": ("ops", "python_function"),
    # device-side records → `marks`
    "cuda_sync": ("marks", "cuda_sync"), "gpu_user_annotation": ("marks", "gpu_user_annotation"),
    # known, not analysed
    "Trace": None, "overhead": None, "cpu_instant_event": None, "cuda_profiler_range": None,
    "external_correlation": None, "mtia_insight": None,
}
