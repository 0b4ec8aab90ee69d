"""Analysing runs rank by rank where the work can run in parallel: each trace file is loaded
*and analysed* by one task (here, in a worker process or on a Dask worker: `executor.py`);
only the task's result and the trace's identity (`TraceInfo`) travel back, and what needs
several ranks (collective matching, diffs, lint across ranks) is done here on those results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial

from .errors import TraceError
from .executor import executor
from .jobs import files_of, planned, processes
from .loading import NotATrace, cycles_by_rank, load_traces
from .model import Trace


@dataclass
class TraceInfo:
    """What the reports need of a trace besides an analysis' result."""

    path: str
    rank: int
    world_size: int | None
    meta: dict
    facts: dict
    origin_us: int
    step_numbers: list[int]

    @classmethod
    def of(cls, trace: Trace) -> TraceInfo:
        return cls(trace.path, trace.rank, trace.world_size, trace.meta, trace.facts, trace.origin_us,
                   trace.step_numbers)


@dataclass
class Analysed:
    info: TraceInfo
    value: object


@dataclass
class RunResult:
    """A run (a directory, or one file): its traces' results in rank order, its facts
    (directory, skipped files, other profiling cycles: as `model.Run`) and the PATH given that
    it was found under (`found_in`: the run itself, or a folder above it)."""

    path: str
    results: list[Analysed]
    facts: dict = field(default_factory=dict)
    found_in: str = ""


def analysed(file: str, task, comm_kernels: tuple[str, ...], cache: bool | None) -> list[Analysed] | NotATrace:
    """One task: load the file's traces (cache first; several of a file fusing several ranks)
    and analyse each; what it is when not a trace."""
    try:
        traces = load_traces(file, comm_kernels=comm_kernels, cache=cache)
    except NotATrace as e:
        return e
    return [Analysed(TraceInfo.of(trace), task(trace)) for trace in traces]


def analyse(paths, task, *, comm_kernels: tuple[str, ...] = (), cycle: str = "last", cache: bool | None = None,
            workers: int | None = None, scheduler: str | None = None) -> list[RunResult]:
    """`task(trace)` for every trace under `paths` (files, directories or URLs), one run per
    directory that holds traces (`files.runs_in`: a profile output's variants, folders of traces
    at mixed depths; a folder of JSON that is not a trace, beside them, is passed over),
    profiling cycles chosen as `loading.load_run` does."""
    plans = planned(paths, cycle)
    jobs = files_of(plans)
    if not (scheduler or os.environ.get("TRACEKIT_SCHEDULER")):
        workers = processes(jobs, workers, comm_kernels, cache)
    work = partial(analysed, task=task, comm_kernels=comm_kernels, cache=cache)
    done = dict(zip(jobs, executor(workers, scheduler, len(jobs)).map(work, jobs)))
    runs = []
    traced = {p.found_in for p in plans if any(not isinstance(done[f], NotATrace) for f in p.chosen)}
    for path, chosen, facts, found_in in plans:
        results = [a for f in chosen if not isinstance(done[f], NotATrace) for a in done[f]]
        if not facts and not results:
            raise done[chosen[0]]
        if not results and found_in in traced:
            continue  # a folder of other JSON (`published.json`) beside or above the traces
        if not results:
            raise TraceError(found_in, "no trace files in this directory" + (
                "" if path == found_in else " or the folders below it"))
        if facts:
            kept, more = cycles_by_rank([r.info for r in results], cycle)
            facts = {**facts, "skipped": [f for f in chosen if isinstance(done[f], NotATrace)],
                     "cycles": {**facts["cycles"], **more}}
            results = [r for r in results if any(r.info is k for k in kept)]
        runs.append(RunResult(path, sorted(results, key=lambda r: r.info.rank), facts, found_in))
    return runs
