"""Which trace files a command reads (one job per file, `planned`) and how many processes read
them (`processes`), decided without polars: a verb that needs worker processes begins them
(`executor.begin`) before it imports its own modules, and `runs.analyse` decides the same way
when it gives them their work."""

from __future__ import annotations

import os
from typing import NamedTuple

from . import cache as trace_cache
from . import files
from .errors import TraceError, UsageError
from .executor import cores

# Bytes of traces not yet in the cache that pay for starting one more worker process: on 2 cores,
# 2 ranks of 7.7 MB take 0.46 s in one process and 0.70 s in two, 4 of 39 MB 1.46 s and 1.18 s;
# cached traces, 0.38 s and 0.66 s (benchmarks/README.md, "Start-up").
PARALLEL_BYTES = 64 * 2**20


class Plan(NamedTuple):
    """One run to read: its path, the files to load (profiling cycles chosen by name,
    `files.cycles_by_name`), its facts ({} for a file given alone) and the PATH given that it
    was found under (the run itself, or a folder above it)."""

    path: str
    chosen: list[str]
    facts: dict
    found_in: str


def planned(paths, cycle: str) -> list[Plan]:
    """One plan per run under each of `paths` (files, directories or URLs; a directory that
    holds traces, `files.runs_in`): a run under two of them (a folder and one inside it) is
    planned under each."""
    plans = []
    for location in paths:
        for path in files.runs_in(location):
            if files.is_dir(path):
                chosen, others = files.cycles_by_name(files.trace_files(path), cycle)
                plans.append(Plan(str(path), chosen, {"directory": True, "cycles": others}, str(location)))
            else:
                if cycle.isdigit() and cycle != "1":
                    raise TraceError(path, f"--cycle {cycle}: a trace file holds one profiling cycle "
                                           "(a directory of a rank's cycles offers several)")
                plans.append(Plan(str(path), [str(path)], {}, str(location)))
    return plans


def files_of(plans: list[Plan]) -> list[str]:
    """The files the plans load, each once (a run planned under two PATHs is read once)."""
    return list(dict.fromkeys(f for plan in plans for f in plan.chosen))


def default_workers(jobs: list[str], comm_kernels: tuple[str, ...], cache: bool | None) -> int:
    """Processes for `jobs` when the user chose none: one per PARALLEL_BYTES of trace files
    not in the cache, at most one per such file and per core (a cached trace loads in less
    time than a worker takes to start)."""
    use = trace_cache.enabled() if cache is None else cache
    sizes = []
    for job in jobs:
        identity = files.identity(job)
        if not (use and (trace_cache.folder() / trace_cache.key(identity, comm_kernels) / "trace.json").exists()):
            sizes.append(identity.get("size") or 0)
    return max(1, min(cores(), len(sizes), sum(sizes) // PARALLEL_BYTES))


def processes(jobs: list[str], workers: int | None, comm_kernels: tuple[str, ...], cache: bool | None) -> int:
    """The worker processes that read `jobs`: `workers` (--workers), else TRACEKIT_WORKERS, else
    `default_workers`; at most one per job; 1: this process."""
    given = os.environ.get("TRACEKIT_WORKERS", "")
    if not workers and given:
        try:
            workers = int(given)
        except ValueError:
            workers = 0
        if workers < 1:
            raise UsageError(f"TRACEKIT_WORKERS={given}: a number of processes, 1 or more")
    chosen = workers or default_workers(jobs, comm_kernels, cache)
    return min(chosen, len(jobs)) if len(jobs) > 1 else 1
