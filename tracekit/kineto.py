"""Typed decoding of Chrome/Kineto trace JSON: only the fields tracekit uses.

msgspec decodes straight into these structs (no dict per event); unknown fields are skipped
by the decoder. A field of the wrong type makes the whole file bad input. The top level is
decoded first with each event left as raw JSON (`msgspec.Raw`, a view into the file's
bytes), then the events are decoded in chunks (`EVENTS`), so that only one chunk of event
structs exists at a time.
"""

from __future__ import annotations

import msgspec


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` of an event, as far as tracekit reads them."""

    external_id: int | None = msgspec.field(default=None, name="External id")
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
    python_id: int | None = msgspec.field(default=None, name="Python id")
    python_parent_id: int | None = msgspec.field(default=None, name="Python parent id")


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
    id: int | str | None = None
    args: Args = NO_ARGS


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


class FlowEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    id: int | str | None = None


class FlowFile(msgspec.Struct):
    traceEvents: list[FlowEvent]


DECODER = msgspec.json.Decoder(TraceFile)
FLOWS = msgspec.json.Decoder(FlowFile)
EVENTS = msgspec.json.Decoder(list[Event])
