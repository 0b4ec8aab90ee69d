"""The `tracekit` command: parse arguments, load, call an analysis, render. Computes nothing."""

from __future__ import annotations

import sys
from importlib.resources import files

import click
import polars as pl

from . import render as rendering
from .errors import TraceError
from .load import load
from .model import Run, Trace

SAMPLE = "sample: the embedded FSDP1 rank-0 trace (2x H200)"


class Group(click.Group):
    """Bad input → one line on stderr, exit 2, no traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TraceError as e:
            click.echo(f"tracekit: {e}", err=True)
            ctx.exit(2)


@click.group(cls=Group)
@click.version_option(package_name="torch-tracekit")
def main():
    """Profiler-centric trace analysis for distributed PyTorch training."""


def sample_trace_path() -> str:
    """The real H200 trace shipped with the package (the default input)."""
    return str(files("tracekit") / "data" / "fsdp1_rank0.trace.json.gz")


def load_traces(paths, rank: int | None) -> list[Trace]:
    """Every rank's trace under `paths` (files or run directories), optionally one rank."""
    traces = []
    for path in paths or [sample_trace_path()]:
        loaded = load(path)
        found = loaded.traces if isinstance(loaded, Run) else [loaded]
        for note in getattr(loaded, "notes", []):
            click.echo(f"tracekit: note: {note}", err=True)
        for t in found:
            for note in t.notes:
                click.echo(f"tracekit: note: {note}", err=True)
        traces.extend(t for t in found if rank is None or t.rank == rank)
    if not traces:
        raise TraceError(", ".join(map(str, paths)), f"no trace of rank {rank}")
    return traces


def per_step(traces, analysis, step: int | None):
    """[(trace, frame)] of `analysis(trace)`, one row per step, filtered to `step`."""
    return only_step([(t, analysis(t)) for t in traces], step)


def only_step(report, step: int | None):
    if step is None:
        return report
    return [(t, frame.filter(pl.col("step") == step)) for t, frame in report]


def emit(text: str) -> None:
    click.echo(text.rstrip("\n"))


paths_argument = click.argument("paths", nargs=-1, type=click.Path(exists=True, dir_okay=True))
step_option = click.option("--step", type=int, default=None, help="Only this step (default: all).")
rank_option = click.option("--rank", type=int, default=None, help="Only this rank (default: all).")
format_option = click.option("--format", "fmt", type=click.Choice(rendering.FORMATS), default="table",
                             show_default=True)


def verb(function):
    """A per-rank, per-step report command: PATHS, --step, --rank, --format."""
    for decorate in (format_option, rank_option, step_option, paths_argument):
        function = decorate(function)
    return main.command()(function)


@verb
def summary(paths, step, rank, fmt):
    """Per rank and step: CPU time, GPU span and busy time, kernels, host syncs, collectives.

    PATHS are trace files or run directories (default: the embedded sample trace).
    """
    from tracekit.analyses.summary import summary as analysis

    emit(rendering.render(per_step(load_traces(paths, rank), analysis, step), fmt))


@verb
def syncs(paths, step, rank, fmt):
    """Host-blocking calls (cudaEventSynchronize & co.) with blocked time, GPU idle time and
    blame: the enclosing CPU ops, innermost first. CUPTI cuda_sync records are counted apart."""
    from tracekit.analyses.syncs import sync_ledger

    emit(rendering.render(per_step(load_traces(paths, rank), sync_ledger, step), fmt))


@verb
def comms(paths, step, rank, fmt):
    """Collectives per process group: count, dtype, bytes, kernel time, algbw/busbw, and across
    the ranks of a run, transfer time vs waiting for peers."""
    from tracekit.analyses.comms import comms as analysis

    traces = load_traces(paths, None)
    report = [(t, f) for t, f in zip(traces, analysis(traces)) if rank is None or t.rank == rank]
    emit(rendering.render(only_step(report, step), fmt))


@verb
@click.option("--scope", type=click.Choice(["step", "trace"]), default="step", show_default=True,
              help="per step, or HTA's get_comm_comp_overlap over the whole trace (step null).")
def overlap(paths, step, rank, fmt, scope):
    """Compute/communication overlap: comm, compute, overlapped and exposed comm time."""
    from tracekit.analyses.overlap import overlap as per_step_overlap
    from tracekit.analyses.overlap import overlap_trace_scope

    analysis = per_step_overlap if scope == "step" else overlap_trace_scope
    emit(rendering.render(per_step(load_traces(paths, rank), analysis, step if scope == "step" else None), fmt))


@verb
def breakdown(paths, step, rank, fmt):
    """The step's GPU span split exactly into compute, exposed comm, exposed memcpy/memset and
    idle by host cause (parts add up to span_ns)."""
    from tracekit.analyses.breakdown import breakdown as analysis

    emit(rendering.render(per_step(load_traces(paths, rank), analysis, step), fmt))


if __name__ == "__main__":
    sys.exit(main())
