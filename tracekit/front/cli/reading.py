"""Verbs that read traces: per-step figures (summary, syncs, comms, overlap, breakdown, kernels,
critical-path) and lint."""

from __future__ import annotations

import sys

import click

from .common import (agg_option, analysed_runs, emit, format_option, inputs, load_options, main, no_rank, of_ranks,
                     paths_argument, peaks_option, per_step, rank_option, render, scope_option,
                     steps_option, table_layout, verb)


@verb
@scope_option
def summary(paths, steps, agg, rank, fmt, layout, options, scope):
    """Per rank, step and device: CPU time, GPU span, busy and idle time, kernels, host syncs,
    collectives, overlap and exposed communication.

    PATHS are trace files or run directories (default: the embedded sample trace).
    """
    from functools import partial

    from tracekit.analyses.summary import summary as analysis

    emit(render(per_step(paths, rank, options, partial(analysis, scope=scope), steps, agg), fmt, "summary", layout))


@verb
@click.option("--scope", type=click.Choice(["step", "trace"]), default="step", show_default=True,
              help="Per step (the calls each step made); or the whole trace as one row, step null: every "
                   "host-blocking call and cuda_sync record, in a step or not.")
def syncs(paths, steps, agg, rank, fmt, layout, options, scope):
    """Host-blocking calls (cudaEventSynchronize & co.) with blocked time, GPU idle time and
    blame: the enclosing CPU ops, innermost first. CUPTI cuda_sync records are counted apart."""
    from functools import partial

    from tracekit.analyses.syncs import sync_ledger

    report = per_step(paths, rank, options, partial(sync_ledger, scope=scope), steps, agg)
    emit(render(report, fmt, "syncs" if scope == "step" else "syncs.trace", layout))


@verb
def comms(paths, steps, agg, rank, fmt, layout, options):
    """Collectives per process group: count, dtype, bytes, kernel and exposed time, algbw/busbw,
    and across the ranks of each run, transfer time vs waiting for peers."""
    from tracekit.analyses.aggregate import selected, with_aggregate
    from tracekit.analyses.comms import census_of_run, material

    runs = analysed_runs(paths, options, material, rank=rank)
    of_ranks(runs, rank, paths)
    report = [(r.info, with_aggregate(selected(f, steps, r.info.path), agg)) for run in runs
              for r, f in zip(run.results, census_of_run([r.value.value for r in run.results],
                                                          [r.info.rank for r in run.results]))
              if rank is None or r.info.rank == rank]
    emit(render(report, fmt, "comms", layout))


@verb
@click.option("--scope", type=click.Choice(["step", "trace", "launched", "hta"]), default="step",
              show_default=True,
              help="per step; the whole trace per device at ns, every device activity (trace: HTA's "
                   "get_comm_comp_overlap definition) or only those launched in the trace (launched: TraceLens' "
                   "default); or exactly as HTA 0.5 computes it, whole-µs rounding included (hta). Whole-trace "
                   "scopes report step null.")
def overlap(paths, steps, agg, rank, fmt, layout, options, scope):
    """Compute/communication overlap: comm, compute, overlapped, exposed and lone comm time."""
    from functools import partial

    from tracekit.analyses.overlap import overlap as analysis

    emit(render(per_step(paths, rank, options, partial(analysis, scope=scope), steps, agg), fmt, "overlap", layout))


@verb
@scope_option
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="The largest parts shown per step and device, the rest as one `other` part "
                   "(default: 10 in the table, every part in json/csv/md).")
def breakdown(paths, steps, agg, rank, fmt, layout, options, scope, top):
    """Each step's GPU span on each device split exactly into compute, exposed comm, exposed
    memcpy/memset and idle by host cause (parts add up to span_ns)."""
    from functools import partial

    from tracekit.analyses.breakdown import breakdown as analysis
    from tracekit.analyses.breakdown import largest

    top = top or (10 if fmt == "table" else None)
    report = [(info, largest(frame, top)) for info, frame in
              per_step(paths, rank, options, partial(analysis, scope=scope), steps, agg)]
    emit(render(report, fmt, "breakdown", layout))


@verb
@scope_option
@click.option("--by", type=click.Choice(["name", "op", "op,name", "category"]), default="name", show_default=True,
              help="Group the device work by kernel name, launching CPU op, both (which kernels each op "
                   "launched), or category and collective kind.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="The groups with the largest total time shown per step and device.")
@peaks_option
def kernels(paths, steps, agg, rank, fmt, layout, options, scope, by, top, peaks):
    """Per rank, step and device: the top kernels (or ops, or categories) by total device time,
    with count, total, mean, % of GPU busy time, category, collective kind, and TFLOP/s and % of
    the device's peak where the recorded shapes give the FLOPs."""
    from functools import partial

    from tracekit.analyses.kernels import kernels as analysis
    from tracekit.analyses.kernels import top as largest

    report = [(info, largest(frame, top)) for info, frame in
              per_step(paths, rank, options, partial(analysis, by=by, scope=scope, peaks=peaks), steps, agg)]
    emit(render(report, fmt, "kernels", layout))


@verb
def launches(paths, steps, agg, rank, fmt, layout, options):
    """Per rank, step and device: the launches of device work (runtime calls and their
    kernels, copies, memsets) per API — count, the calls' host time, the device time, the
    launch delay (device start − call end, 0 at least: p50, p90, max) and the launches whose
    work is shorter than their call (docs/metrics.md)."""
    from tracekit.analyses.launches import launches as analysis

    emit(render(per_step(paths, rank, options, analysis, steps, agg), fmt, "launches", layout))


@main.command("critical-path")
@paths_argument
@steps_option
@agg_option
@rank_option
@format_option
@table_layout
@load_options
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="The items (ops, calls, kernels, waits) with the most time on the path shown per step.")
def critical_path(paths, steps, agg, rank, fmt, layout, options, top):
    """What sets each step's length: the longest chain of dependencies (host ops and calls,
    launches, kernels, stream order, event waits, syncs and, across a run's ranks, the last rank
    to reach each collective), its time split into host, runtime, compute, comm, copy and
    waiting (they add up to the step's span), and the items that spent it."""
    from functools import partial

    from tracekit.analyses.critical_path import (arrivals_of_run, collective_starts, critical_path_in_run, largest_items,
                                                 shifted_windows)
    from tracekit.front.cli.common import say
    from tracekit.core.files import is_dir
    from tracekit.core.runs import analyse

    arrivals = {}
    if any(is_dir(p) for p in paths):  # runs of several ranks: when each collective's last rank arrived
        where = {k: options[k] for k in ("comm_kernels", "cycle", "cache", "workers", "scheduler")}
        for run in analyse(paths, collective_starts, **where):
            found = arrivals_of_run([r.value for r in run.results], [r.info.origin_us * 1000 for r in run.results])
            [say(note) for note in shifted_windows([r.value for r in run.results])]
            arrivals.update({(r.info.path, r.info.rank): a for r, a in zip(run.results, found)})
    analysis = partial(critical_path_in_run, arrivals=arrivals, top=None)  # every item: the statistic needs them
    report = [(info, largest_items(frame, top)) for info, frame in per_step(paths, rank, options, analysis, steps, agg)]
    emit(render(report, fmt, "critical-path", layout))


@main.command()
@paths_argument
@rank_option
@format_option
@table_layout
@load_options
@click.option("--strict", is_flag=True, help="Exit 1 when any finding is an error.")
def lint(paths, rank, fmt, layout, options, strict):
    """What is odd or lost in each trace and across the ranks of a run: unknown categories,
    dropped events, device work outside every step, lag across step boundaries, same-stream
    overlap, lost launch links, a truncated last step, missing ranks, mixed versions, clock
    skew. Exits 0 with findings (1 with --strict and an error)."""
    from functools import partial

    from tracekit.analyses.lint import checked
    from tracekit.analyses.lint import lint as analysis
    from tracekit.front.render import render_lint
    from tracekit.core.runs import analyse

    per_trace, per_run = analysis(analyse(inputs(paths), partial(checked), **options))
    there = {t.rank for t, _ in per_trace}
    per_trace = [(t, f) for t, f in per_trace if rank is None or t.rank == rank]
    if not per_trace:
        raise no_rank(rank, there, paths)
    emit(render_lint(per_trace, per_run, fmt, layout))
    errors = sum(int((f["severity"] == "error").sum()) for _, f in per_trace + per_run)
    if strict and errors:
        sys.exit(1)
