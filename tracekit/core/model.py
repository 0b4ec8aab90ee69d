"""The loaded trace model: one `Trace` per rank, a `Run` of ranks.

All times are Int64 nanoseconds from the trace's origin (`Trace.origin_us`: the earliest
`ts` of any complete event, floored to a whole microsecond, in the trace's own clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from .ipc import table_from

# the engine of the analyses' lazy queries: polars 2's default ("auto") runs a small query on its
# streaming engine, ~0.2 ms more a query than in memory (polars 1.31's default is in memory)
ENGINE = "in-memory"


@dataclass
class Trace:
    """One rank's trace as polars tables.

    - `gpu`: kernel, gpu_memcpy, gpu_memset activities (name, kind, category, device, stream,
      start, end, correlation, ext_id, bytes, grid, block, collective args, step).
    - `calls`: cuda_runtime / cuda_driver calls (name, cat, tid, start, end, correlation,
      ext_id, step).
    - `ops`: cpu_op, user_annotation, python_function (name, cat, tid, start, end, ext_id,
      collective args, step).
    - `marks`: cuda_sync and gpu_user_annotation events (name, cat, device, stream, start,
      end, ext_id, correlation, sync_kind).
    - `steps`: one row per step (step, cpu_start, cpu_end).
    - `facts`: what the loader could not use or had to guess (unknown categories, dropped
      events, fields read leniently, where the rank came from, the schema): `tracekit lint`.
    """

    path: str
    rank: int
    world_size: int | None
    gpu: pl.DataFrame
    calls: pl.DataFrame
    ops: pl.DataFrame
    marks: pl.DataFrame
    steps: pl.DataFrame
    meta: dict
    origin_us: int
    facts: dict = field(default_factory=dict)
    derived: dict = field(default_factory=dict, repr=False, compare=False)  # analyses' cache (timeline)

    @property
    def has_gpu(self) -> bool:
        return self.gpu.height > 0

    @property
    def step_numbers(self) -> list[int]:
        return self.steps["step"].to_list()


class StoredTrace(Trace):
    """A `Trace` read from the trace cache (`cache.read`): each table is held as its Arrow IPC
    bytes and decoded when first used, so that a verb pays only for the tables it reads."""

    def __init__(self, stored: dict[str, bytes] | None = None, **fields):
        """`stored`: table name → bytes, for the tables not given in `fields` (none where
        `dataclasses.replace` makes a copy: it gives every field)."""
        self.stored = stored or {}
        super().__init__(**dict.fromkeys(self.stored), **fields)
        for name in self.stored:
            delattr(self, name)  # not decoded yet: `__getattr__` decodes it

    def __getattr__(self, name: str):  # only for attributes not set: a table not decoded yet
        stored = self.__dict__.get("stored", {})
        if name not in stored:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        setattr(self, name, table_from(stored.pop(name)))
        return getattr(self, name)


@dataclass
class Run:
    """The traces of one run, ordered by rank. `facts`: files skipped (not traces) and the
    profiling cycles of a rank that has several (`cycles`: used file → every cycle of its rank, in time
    order)."""

    path: str
    traces: list[Trace]
    facts: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        sizes = {t.world_size for t in self.traces if t.world_size}
        return max(sizes) if sizes else len(self.traces)
