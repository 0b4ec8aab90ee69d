"""Files that fuse several ranks: one process per rank in one JSON, as TraceLens' TraceFuse
writes them (each rank's pids and correlation ids shifted apart, its rank in every event's
`args.rank`). Each process is read as its rank, with the device work it launched.

A process is a pid that records `ProfilerStep#N` (one profiler records each step once per
process). The split is made only where it is unambiguous: every call and CPU op belongs to
such a process, no correlation id is launched by two of them, and each device row (the pid
of a device activity) runs only work that one process launched. Otherwise the file stays one
trace and `tracekit lint` warns (`fused_ranks`).
"""

from __future__ import annotations

import polars as pl

PROCESS_COLUMNS = ("pid", "rank_arg")  # read by the loader for the split, dropped after it


def processes(ops: pl.DataFrame) -> list[int]:
    """The pids that record `ProfilerStep#N`, in order."""
    return sorted(ops.filter(pl.col("name").str.starts_with("ProfilerStep#"))["pid"].drop_nulls().unique().to_list())


def per_process(tables: dict[str, pl.DataFrame]) -> list[tuple[int, str, dict[str, pl.DataFrame]]] | None:
    """[(rank, where the rank came from, the process's tables)] in rank order, or None when the
    file is one process or cannot be split safely. The rank is the processes' `args.rank`
    where each names one and they differ, else the process's order by pid."""
    gpu, calls, ops, marks = (tables[name] for name in ("gpu", "calls", "ops", "marks"))
    stepping = ops.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    cpu = processes(ops)
    if len(cpu) < 2 or not all(t["pid"].is_in(cpu).fill_null(False).all() for t in (calls, ops)):
        return None
    launches = calls.select("correlation", process="pid").drop_nulls().unique()
    if launches["correlation"].is_duplicated().any():
        return None
    rows = gpu.select("pid", "correlation").join(launches, on="correlation").select("pid", "process").unique()
    if rows["pid"].is_duplicated().any():
        return None
    owner = dict(rows.iter_rows()) | {p: p for p in cpu}
    process = pl.col("pid").replace_strict(owner, default=None, return_dtype=pl.Int64)
    gpu, marks = gpu.with_columns(process=process), marks.with_columns(process=process)
    if gpu["process"].null_count():
        return None
    named = stepping.group_by("pid").agg(pl.col("rank_arg").drop_nulls().unique())
    ranks = {p: r[0] for p, r in named.iter_rows() if len(r) == 1}
    from_args = len(ranks) == len(cpu) and len(set(ranks.values())) == len(cpu)
    order = sorted(cpu, key=lambda p: ranks[p]) if from_args else cpu
    parts = []
    for i, pid in enumerate(order):
        own = {"gpu": gpu.filter(pl.col("process") == pid).drop("process"),
               "calls": calls.filter(pl.col("pid") == pid), "ops": ops.filter(pl.col("pid") == pid),
               "marks": marks.filter(pl.col("process") == pid).drop("process")}
        parts.append((ranks[pid] if from_args else i, "fused file: args.rank" if from_args else "fused file: process order",
                      {name: t.drop(PROCESS_COLUMNS) for name, t in own.items()}))
    return parts
