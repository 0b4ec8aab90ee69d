"""`tracekit lint`: what is odd or lost in a trace, and across the traces of a run.

A finding is one row: severity (`error` | `warning` | `info`), kind, count, ns (a time, where
one applies), step (where it is about one step) and detail (one line). docs/lint.md defines
each kind; the other verbs print the same findings as one note per kind on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.analyses.comms import collective_kernels, counts_per_group
from tracekit.analyses.timeline import kept, timeline
from tracekit.core.files import name
from tracekit.core.model import Trace
from tracekit.core.words import counted

SCHEMA = {"severity": pl.String, "kind": pl.String, "count": pl.Int64, "ns": pl.Int64, "step": pl.Int64,
          "detail": pl.String}
SEVERITY = {"error": 0, "warning": 1, "info": 2}
KERNEL_LAUNCH = r"LaunchKernel|LaunchCooperativeKernel"  # calls that each put one kernel on the device


def finding(severity: str, kind: str, detail: str, count: int | None = None, ns: int | None = None,
            step: int | None = None) -> dict:
    return {"severity": severity, "kind": kind, "count": count, "ns": ns, "step": step, "detail": detail}


def trace_findings(trace: Trace) -> pl.DataFrame:
    """The findings of one trace, errors first."""
    return by_severity(load_findings(trace.facts) + steps_findings(trace) + device_findings(trace)
                       + capture_findings(trace.meta))


def capture_findings(meta: dict) -> list[dict]:
    """`cupti_dropped_records`: a `cupti` recording whose capture CUPTI dropped records of (its
    buffer full: the steps lack that work); `cupti_threads_not_told` (info): one whose capture
    could not tell the runner's launches from other threads' — as the runner's writer names
    them in `traceName`."""
    import re

    name = meta.get("trace_name") or ""
    dropped = re.search(r"CUPTI dropped (\d+) records", name)
    return ([finding("warning", "cupti_dropped_records", f"CUPTI dropped {dropped[1]} records of this recording (its "
                     "buffer was full): the steps lack that device work", int(dropped[1]))] if dropped else []) + \
        ([finding("info", "cupti_threads_not_told", "which thread launched each activity is not told: work another "
                  "thread launched during a phase (a data loader's or an async checkpoint's copies) is counted in "
                  "that phase")] if "launching threads not told" in name else [])


@dataclass
class Checked:
    """What a per-trace task gives back: the trace's findings, its first collectives (for the
    clock-skew check across ranks) and its collectives per process group (pg, n), whether it
    has device work, and an analysis' result."""

    findings: pl.DataFrame
    firsts: pl.DataFrame
    group_counts: pl.DataFrame
    has_gpu: bool
    value: object


def checked(trace: Trace, analysis=None) -> Checked:
    """`analysis(trace)` (none without one) with the trace's own lint material, kept with the
    trace (`timeline.kept`), so that a cached trace decodes no table for it that the analysis
    does not need (its ops, the largest, among them)."""
    value = analysis(trace) if analysis is not None else None
    if "lint-first-collectives" not in trace.derived or "lint-group-counts" not in trace.derived:
        kernels = collective_kernels(trace)
        trace.derived["lint-first-collectives"] = first_collectives(kernels, trace.origin_us)
        trace.derived["lint-group-counts"] = counts_per_group(kernels)
    return Checked(kept(trace, "lint-findings", lambda: trace_findings(trace)), trace.derived["lint-first-collectives"],
                   trace.derived["lint-group-counts"], trace.has_gpu, value)


def itself(trace: Trace) -> Trace:
    """The analysis that keeps the whole trace (for work done here, not in a worker)."""
    return trace


def first_collectives(kernels: pl.DataFrame, origin_us: int) -> pl.DataFrame:
    """pg, coll_kind, start, end (absolute ns on the rank's clock) of each process group's
    first collective launched in the trace (`collective_kernels`' seq 0)."""
    k = kernels.filter(pl.col("seq") == 0)
    return k.select("pg", "coll_kind", (pl.col("start") + origin_us * 1000).alias("start"),
                    (pl.col("end") + origin_us * 1000).alias("end"))


def by_severity(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SCHEMA).sort(pl.col("severity").replace_strict(SEVERITY), "kind", "step",
                                                  nulls_last=False)


def load_findings(facts: dict) -> list[dict]:
    """What the loader could not use or had to guess."""
    rows = [finding("warning", "unknown_category", f"category {cat!r}: {n:,} events not analysed", n)
            for cat, n in sorted(facts.get("unknown_categories", {}).items())]
    rows += [finding("warning", "dropped_events", f"{n:,} {why}", n) for why, n in sorted(facts.get("dropped", {}).items())]
    if facts.get("lenient_events"):
        rows.append(finding("info", "lenient_fields", f"{facts['lenient_events']:,} events read leniently: a field "
                            "had an unexpected type (e.g. a text `bytes`); values that are not numbers became null",
                            facts["lenient_events"]))
    if facts.get("exact_timestamps"):
        rows.append(finding("info", "exact_timestamps", f"{facts['exact_timestamps']:,} events have timestamps "
                            "too large for a float to keep their nanoseconds (epoch µs): decoded exactly from their text", facts["exact_timestamps"]))
    if facts.get("replaced_text"):
        rows.append(finding("warning", "replaced_text", f"{counted(facts['replaced_text'], 'byte sequence')} in "
                            "event texts not UTF-8: each read as U+FFFD (�)", facts["replaced_text"]))
    if facts.get("metadata"):
        rows.append(finding("warning", "metadata", f"top-level metadata not read ({facts['metadata']})"))
    if facts.get("rank_from") == "file name":
        rows.append(finding("info", "rank_guessed", "no rank in distributedInfo: rank taken from the file name"))
    elif str(facts.get("rank_from")).startswith("fused file"):
        rows.append(finding("info", "fused_file_split", f"one of {facts['fused_ranks']} processes of a file fusing "
                            f"several ranks, read as its rank ({facts['rank_from'][12:]})"))
    elif facts.get("rank_from") == "default":  # context: traces that then claim one rank get `same_rank`
        rows.append(finding("info", "rank_guessed", "no rank in distributedInfo or the file name: taken as rank 0"))
    if facts.get("schema", "kineto") != "kineto":
        rows.append(finding("info", "schema", f"older trace schema: {facts['schema']} (categories renamed on load)"))
    return rows


def steps_findings(trace: Trace) -> list[dict]:
    if trace.steps["step"].to_list() == [0] and not trace.ops["name"].str.starts_with("ProfilerStep#").any():
        return [finding("info", "no_steps", "no ProfilerStep#N: the whole trace is one step, numbered 0")]
    return _fused_ranks(trace, trace.facts.get("processes", 1))


def _fused_ranks(trace: Trace, processes: int) -> list[dict]:
    """A `ProfilerStep#N` recorded by several threads or processes: one profiler records each
    step once per process, so the file holds several processes — ranks fused into one file (as
    TraceLens' TraceFuse writes them) that the loader could not split safely (`fused.py`),
    read here as one rank."""
    marks = trace.ops.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    per_step = marks.group_by("name").agg(n=pl.len(), threads=pl.max_horizontal(pl.col("tid").n_unique(),
                                                                                 pl.lit(processes)))
    fused = per_step.filter((pl.col("n") > 1) & (pl.col("threads") > 1))
    if fused.height == 0:
        return []
    k = int(fused["threads"].max())
    devices = trace.gpu["device"].n_unique()
    return [finding("warning", "fused_ranks", f"{fused.height:,} ProfilerStep#N are each recorded by up to {k} "
                    f"threads or processes ({devices} device(s)): the file looks like {k} processes (ranks) fused into one; it is "
                    "read as one rank, so host figures (syncs, CPU time) are pooled over them and no cross-rank "
                    "figure is made: analyse the per-rank files instead", fused.height)]


def device_findings(trace: Trace) -> list[dict]:
    """Device activities: none, orphans, lost links, lag, same-stream overlap, launches
    without a record."""
    gpu = trace.gpu
    if gpu.height == 0:
        return [finding("info", "no_device_activity", "no kernel, memcpy or memset records: device figures are null")
                ] + _launches_without_any_record(trace)
    rows = []
    orphans = gpu.filter(pl.col("step").is_null())
    if orphans.height:
        unlaunched = orphans.join(trace.calls.select("correlation").unique(), on="correlation", how="anti").height
        rows.append(finding("warning", "orphan_gpu_work", f"{orphans.height:,} device activities ({ms(_ns(orphans))}) "
                            "launched outside every profiled step are in no step's figures; "
                            f"{unlaunched:,} have no launching call in the trace (launched before "
                            "profiling started)", orphans.height, _ns(orphans)))
    unlinked = gpu.filter(pl.col("correlation").is_null())
    if unlinked.height:
        rows.append(finding("info", "missing_correlation", f"{unlinked.height:,} device activities carry no "
                            "correlation id (no launch to link): each belongs to the step whose CPU window holds "
                            "its start", unlinked.height, _ns(unlinked)))
    rows += _lag(trace) + _same_stream_overlap(gpu) + _launches_without_records(trace) + _event_ids_missing(trace)
    marks = trace.marks.filter(pl.col("cat") == "gpu_user_annotation").height
    if marks:
        rows.append(finding("info", "gpu_user_annotation", f"{marks:,} GPU-side annotation ranges: shown by "
                            "`tracekit export`, not part of any figure", marks))
    return rows


def ms(ns: int) -> str:
    """A time as the details print it: ms, 3 decimals (the `ns` column keeps the integer)."""
    return f"{ns / 1e6:,.3f} ms"


def _ns(frame: pl.DataFrame) -> int:
    return int((frame["end"] - frame["start"]).sum())


def _lag(trace: Trace) -> list[dict]:
    """Per step: ns of the step's device work (its busy segments, any device) that ran after
    the step's CPU window ended — in the next steps' windows, between them or after the last."""
    ends = trace.steps.select("step", "cpu_end")
    after = (timeline(trace).coarse.filter(pl.col("category") != "idle").join(ends, on="step")
             .with_columns(start=pl.max_horizontal("start", "cpu_end"))
             .filter(pl.col("end") > pl.col("start")))
    lag = after.group_by("step").agg(ns=(pl.col("end") - pl.col("start")).sum()).sort("step")
    return [finding("info", "gpu_lag", f"step {s}'s device work ran {ms(ns)} after step {s}'s CPU window ended "
                    "(it belongs to step {s}: launch correlation)".replace("{s}", str(s)), None, ns, s)
            for s, ns in lag.iter_rows()]


def _same_stream_overlap(gpu: pl.DataFrame) -> list[dict]:
    """Kernels that start before the previous kernel on their (device, stream) ended (copy
    engines, MTIA's DMA queues among them, may run several transfers at once)."""
    ordered = gpu.filter(pl.col("category").is_in(["compute", "comm"])).sort("device", "stream", "start").with_columns(
        reach=pl.col("end").cum_max().shift(1).over("device", "stream"))
    hit = ordered.filter(pl.col("reach") > pl.col("start")).with_columns(
        over=pl.min_horizontal("reach", "end") - pl.col("start"))
    if hit.height == 0:
        return []
    ns = int(hit["over"].sum())
    return [finding("warning", "same_stream_overlap", f"{hit.height:,} kernels overlap the previous one on "
                    f"their stream ({ms(ns)}): a stream runs one at a time, so timestamps are off", hit.height, ns)]


def _event_ids_missing(trace: Trace) -> list[dict]:
    """`Stream Wait Event` and `Event Sync` records without the id of the `cudaEventRecord`
    they wait on (`wait_on_cuda_event_record_corr_id` -1): the critical path infers what
    they waited for (`event wait (inferred)`, `sync (inferred)`)."""
    waits = trace.marks.filter(pl.col("sync_kind").is_in(["Stream Wait Event", "Event Sync"]))
    n = waits.filter(pl.col("wait_on_record").fill_null(-1) < 0).height
    if n == 0:
        return []
    return [finding("info", "event_ids_missing", f"{n:,} of {waits.height:,} event waits and syncs carry no id of "
                    "the event record they wait on: the critical path infers what each waited for "
                    "(`event wait (inferred)`, `sync (inferred)`)", n)]


def _launches_without_any_record(trace: Trace) -> list[dict]:
    """Kernel launches in a trace without a single device record: recorded without CUDA
    activity, or CUPTI lost them all."""
    n = trace.calls.filter(pl.col("name").str.contains(KERNEL_LAUNCH)).height
    if n == 0:
        return []
    return [finding("warning", "launches_without_records", f"{n:,} kernel launches but no device record at all "
                    "(recorded without CUDA activity, or its records lost): every GPU figure is empty", n)]


def _launches_without_records(trace: Trace) -> list[dict]:
    """Kernel launches whose kernel is not in the trace, per step; in the last step this is a
    trace cut before the device finished."""
    launches = trace.calls.filter(pl.col("name").str.contains(KERNEL_LAUNCH) & pl.col("correlation").is_not_null()
                                  & pl.col("step").is_not_null())
    missing = launches.join(trace.gpu.select("correlation").unique(), on="correlation", how="anti")
    if missing.height == 0:
        return []
    last = trace.steps["step"].max()
    rows = []
    for step, n in missing.group_by("step").len().sort("step").iter_rows():
        kind = "truncated_last_step" if step == last and step != 0 else "launches_without_records"
        what = ("the trace ends before the device finished the last step" if kind == "truncated_last_step"
                else "work captured into a CUDA graph, or records lost")
        rows.append(finding("warning", kind, f"step {step}: {n:,} kernel launches have no kernel record ({what})", n,
                            None, step))
    return rows


def run_findings(run) -> pl.DataFrame:
    """Findings across the ranks of one run (a `runs.RunResult` of `Checked`): missing ranks
    (of a run directory), disagreeing world sizes or schemas, clock skew at the first
    collective."""
    infos = [r.info for r in run.results]
    rows = []
    sizes = {t.world_size for t in infos if t.world_size}
    if len(sizes) > 1:
        rows.append(finding("error", "world_size_mismatch", f"the traces disagree on the world size: {sorted(sizes)}"))
    missing = sorted(set(range(max(sizes))) - {t.rank for t in infos}) if sizes and run.facts.get("directory") else []
    if missing:
        rows.append(finding("error", "missing_ranks",
                            f"{len(missing)} of {max(sizes)} ranks have no trace in the directory: {_ranges(missing)}",
                            len(missing)))
    rows += _same_rank(infos)
    for key, label in (("schema", "schema"), ("schema_version", "schemaVersion"), ("nccl_version", "NCCL version"),
                       ("backend", "backend")):
        values = {t.rank: (t.facts if key == "schema" else t.meta).get(key) for t in infos}
        if len(set(map(str, values.values()))) > 1:
            rows.append(finding("warning", "mixed_versions", f"ranks differ in {label}: " +
                                ", ".join(f"rank {r}: {v}" for r, v in sorted(values.items()))))
    if len(infos) > 1 and all(r.value.has_gpu for r in run.results):  # kernels, not host ops, end together
        rows += _clock_skew({r.info.rank: r.value.firsts for r in run.results})
    if len(infos) > 1:
        rows += _group_count_mismatch({r.info.rank: r.value.group_counts for r in run.results})
    return by_severity(rows)


def _same_rank(infos: list, across: str = "; figures across ranks pair the wrong traces") -> list[dict]:
    """Several traces of a run that claim one rank and are not its profiling cycles
    (`loading.cycles_by_rank`): every one is kept and shown, named by its file (`across`:
    what that does to the figures across ranks)."""
    by_rank: dict[int, list[str]] = {}
    for t in infos:
        by_rank.setdefault(t.rank, []).append(t.path)
    return [finding("warning", "same_rank", f"{len(paths)} traces claim rank {rank} ({', '.join(told_apart(paths))}): "
                    f"each is shown, named by its file{across}", len(paths))
            for rank, paths in sorted(by_rank.items()) if len(paths) > 1]


def told_apart(paths: list[str]) -> list[str]:
    """Each path by its file's name, with as many of its folders before it as tell the paths
    apart (`fsdp1/rank0.json`, `fsdp2/rank0.json`)."""
    parts = [str(p).rstrip("/").split("/") for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        tails = ["/".join(p[-k:]) for p in parts]
        if len(set(tails)) == len(tails):
            return tails
    return [str(p) for p in paths]


@dataclass
class GivenApart:
    """The trace files given one by one (each its own run): `path` None, as no one folder holds them."""

    results: list
    path: None = None


def given_apart(runs) -> list[tuple[GivenApart, pl.DataFrame]]:
    """[(the trace files given one by one, their findings)] where two of them claim one rank
    (`tracekit summary A B` of two rank-0 files): each is its own run, so no figure pairs them."""
    apart = [r for run in runs if not run.facts.get("directory") for r in run.results]
    rows = _same_rank([r.info for r in apart], " or folder, as its own run")
    return [(GivenApart(apart), by_severity(rows))] if rows else []


def _group_count_mismatch(counts: dict[int, pl.DataFrame]) -> list[dict]:
    """Process groups whose ranks in the run hold different numbers of launched collectives:
    matching them by launch order (`comms`' transfer and wait) pairs the wrong ones past the
    first difference."""
    together = pl.concat([f.with_columns(rank=pl.lit(r, pl.Int64)) for r, f in counts.items()])
    rows = []
    for (pg,), group in together.group_by("pg", maintain_order=True):
        if group.height > 1 and group["n"].n_unique() > 1:
            per_rank = ", ".join(f"rank {r}: {n}" for r, n in group.sort("rank").select("rank", "n").iter_rows())
            rows.append(finding("warning", "collective_count_mismatch", f"{group_words(pg)}: the ranks hold "
                                f"different numbers of collectives ({per_rank}); `comms` pairs them by launch "
                                "order, so its transfer and wait figures past the first difference are unreliable",
                                group.height))
    return rows


def group_words(pg: str) -> str:
    """`process group 0`, or where the trace names none (`comms` keys it `?`) `a process group
    the trace does not name`."""
    return "a process group the trace does not name" if pg == "?" else f"process group {pg}"


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] → "0-2, 5"."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _clock_skew(firsts: dict[int, pl.DataFrame]) -> list[dict]:
    """The first collective of the first process group that every rank ran: its start on
    each rank's clock. A collective ends at nearly the same instant everywhere, so ends that
    disagree by more than 100 µs mean the ranks' clocks disagree."""
    together = pl.concat([f.with_columns(rank=pl.lit(r)) for r, f in firsts.items()])
    everywhere = together.filter(pl.len().over("pg") == len(firsts))
    if everywhere.height == 0:
        return []
    pg = everywhere.sort("start")["pg"][0]
    first = everywhere.filter(pl.col("pg") == pg).sort("rank")
    start_spread = int(first["start"].max() - first["start"].min())
    end_spread = int(first["end"].max() - first["end"].min())
    offsets = ", ".join(f"rank {r} {(s - first['start'].min()) / 1e6:+.3f}" for r, s in first.select("rank", "start").iter_rows())
    severity = "warning" if end_spread > 100_000 else "info"
    return [finding(severity, "clock_skew", f"first collective ({first['coll_kind'][0]}, {group_words(pg)}) starts "
                    f"spread {ms(start_spread)} ({offsets} ms); its ends spread {ms(end_spread)}",
                    len(firsts), start_spread)]


def lint(runs) -> tuple[list, list]:
    """(findings per trace, findings per run) of `runs.RunResult`s of `Checked`: each trace's
    own findings with its other profiling cycles, as [(TraceInfo, frame)], and
    [(RunResult, frame)]."""
    per_trace = []
    for run in runs:
        for r in run.results:
            cycles = run.facts.get("cycles", {}).get(r.info.path, [])
            rows = [cycle_finding(r.info.path, cycles)] if len(cycles) > 1 else []
            per_trace.append((r.info, pl.concat([r.value.findings, by_severity(rows)])))
    return per_trace, [(run, run_findings(run)) for run in runs] + given_apart(runs)


def cycle_finding(path: str, cycles: list[str]) -> dict:
    """The warning of a rank with several profiling cycles: which one was read (its number in
    time order, `--cycle`'s), and how to read another."""
    others = [name(p) for p in cycles if p != path]
    return finding("warning", "other_cycles", f"read profiling cycle {cycles.index(path) + 1} of {len(cycles)} of this "
                   f"rank; --cycle first|last|N reads another ({', '.join(others)})", len(others))


def notes(per_trace: list, per_run: list) -> list[str]:
    """One line per kind of warning or error over all traces: what the other verbs print on
    stderr, each a warning (`warning: KIND…`; an error finding `warning: KIND (a lint error)…`:
    the verb still answers, so it is not the `error:` of a failed command); `info` findings —
    context, not trouble — only `tracekit lint` shows."""
    rows = pl.concat([f.with_columns(path=pl.lit(t.path)) for t, f in per_trace] +
                     [f.with_columns(path=pl.lit(None, pl.String)) for _, f in per_run], how="diagonal_relaxed")
    rows = rows.filter(pl.col("severity") != "info")
    if rows.height == 0:
        return []
    lines = []
    for (severity, kind), group in rows.group_by("severity", "kind", maintain_order=True):
        traces = group["path"].drop_nulls().unique(maintain_order=True)
        where = f" in {traces.len()} traces, e.g. {name(traces[0])}" if traces.len() > 1 else \
            (f" in {name(traces[0])}" if traces.len() else "")
        more = f" (+{group.height - 1} more)" if group.height > 1 else ""
        serious = " (a lint error)" if severity == "error" else ""
        lines.append(f"warning: {kind}{serious}{where}: {group['detail'][0]}{more}")
    return lines
