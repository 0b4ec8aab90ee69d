"""The `tracekit` command: parse arguments, load, call an analysis, render. Computes nothing."""

from __future__ import annotations

import functools
import json
import os
import sys
from importlib.resources import files
from pathlib import Path

import click

from .errors import TraceError, TracekitError, UsageError

# Analysis modules (polars) are imported inside the commands: the runners need only torch.
FORMATS = ("table", "json", "csv", "md")


class Group(click.Group):
    """Bad input or options → one line on stderr, exit 2, no traceback (and no usage text)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TracekitError as e:
            click.echo(f"tracekit: {e}", err=True)
            ctx.exit(2)
        except click.UsageError as e:
            click.echo(f"tracekit: {e.format_message()}", err=True)
            ctx.exit(2)


@click.group(cls=Group)
@click.version_option(package_name="torch-tracekit")
def main():
    """Profiler-centric trace analysis for distributed PyTorch training."""


def sample_trace_path() -> str:
    """The real H200 trace shipped with the package (the default input)."""
    return str(files("tracekit") / "data" / "fsdp1_rank0.trace.json.gz")


def analysed_runs(paths, options: dict, analysis=None, here: bool = False, rank: int | None = None) -> list:
    """`analysis(trace)` for every trace under `paths` (default: the embedded sample trace),
    per run (`runs.analyse`: in worker processes or on a Dask cluster unless `here`), with the
    lint findings (of `rank`'s trace and of the runs) printed as notes on stderr, one line per
    kind."""
    from functools import partial

    from tracekit.analyses.lint import checked, lint, notes
    from tracekit.runs import analyse

    load = {k: options[k] for k in ("comm_kernels", "cycle", "cache")}
    where = {"workers": 1} if here else {"workers": options["workers"], "scheduler": options["scheduler"]}
    runs = analyse(paths or [sample_trace_path()], partial(checked, analysis=analysis), **load, **where)
    per_trace, per_run = lint(runs)
    for note in notes([(t, f) for t, f in per_trace if rank is None or t.rank == rank], per_run):
        click.echo(f"tracekit: {note}", err=True)
    return runs


def of_ranks(runs, rank: int | None, paths) -> list:
    """[(TraceInfo, analysis result)] of the runs' traces, or of `rank`'s only."""
    found = [(r.info, r.value.value) for run in runs for r in run.results if rank is None or r.info.rank == rank]
    if not found:
        raise TraceError(", ".join(map(str, paths)), f"no trace of rank {rank}")
    return found


def load_traces(paths, rank: int | None, options: dict) -> list:
    """Every rank's trace under `paths` (files or run directories), optionally one rank, loaded
    in this process (for the verbs that draw or write whole traces)."""
    from tracekit.analyses.lint import itself

    return [trace for _, trace in of_ranks(analysed_runs(paths, options, itself, True, rank), rank, paths)]


def emit(text: str) -> None:
    click.echo(text.rstrip("\n"))


def render(report, fmt: str, view: str | None = None, layout=None) -> str:
    from .render import render as render_report
    from .views import Layout

    return render_report(report, fmt, view, layout or Layout())


def render_frame(frame, fmt: str, view: str | None = None, layout=None) -> str:
    from .render import render_frame as render_table
    from .views import Layout

    return render_table(frame, fmt, view, layout or Layout())


def existing(ctx, param, value):
    """Paths or fsspec URLs that exist (click.Path would mangle a URL)."""
    from tracekit.files import exists

    values = value if isinstance(value, tuple) else (value,)
    for location in values:
        if not exists(location):
            raise TraceError(location, "no such file or directory")
    return value


def new_file(ctx, param, value):
    """An output path whose folder exists (nothing is created on the way)."""
    if value is not None and not Path(value).resolve().parent.is_dir():
        raise UsageError(f"{param.opts[-1]} {value}: the folder {Path(value).parent} does not exist")
    if value is not None:
        ctx.meta.setdefault("existing", set()).update(str(p) for p in (Path(value), Path(value + ".png")) if p.exists())
    return value


def wrote(path, more: str = "") -> None:
    """`tracekit: wrote PATH` on stderr, saying so when it replaced a file that was there."""
    replaced = str(path) in click.get_current_context().meta.get("existing", ())
    click.echo(f"tracekit: wrote {path}{' (replacing the file that was there)' if replaced else ''}{more}", err=True)


paths_argument = click.argument("paths", nargs=-1, callback=existing)
rank_option = click.option("--rank", type=int, default=None, help="Only this rank (default: all).")
format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
                             show_default=True)


def table_layout(function):
    """--columns and --wide, passed on as `layout` (what the table format shows)."""
    @functools.wraps(function)
    def with_layout(*args, columns, wide, **kwargs):
        from .views import Layout

        chosen = tuple(c.strip() for c in columns.split(",") if c.strip()) if columns else None
        return function(*args, layout=Layout(chosen, wide), **kwargs)

    with_layout = click.option("--wide", is_flag=True, help="The table shows every column.")(with_layout)
    return click.option("--columns", metavar="A,B,...",
                        help="The table's columns, by name (as shown, or as in csv/json); "
                             "json/csv/md always have every column.")(with_layout)


def steps_choice(ctx, param, value: str):
    from tracekit.analyses.aggregate import parse_steps

    return parse_steps(value)


steps_option = click.option("--steps", default="all", show_default=True, callback=steps_choice,
                            help="The steps to report: all, N, N,M or N-M.")
agg_option = click.option("--agg", type=click.Choice(["median", "mean", "p90", "min", "max"]), default=None,
                          help="Add a row per rank and device with this statistic over the steps, and n_steps.")
scope_option = click.option("--scope", type=click.Choice(["step", "trace", "launched"]), default="step",
                            show_default=True,
                            help="Per step (device work the step launched); the whole trace per device, step "
                                 "null: every device activity, launch record or not (trace: as HTA, and TraceLens "
                                 "with --include_unlinked_kernels, count it), or only the work whose launch is in "
                                 "the trace (launched: TraceLens' default gpu_timeline).")


def cycle_choice(ctx, param, value: str) -> str:
    if value not in ("last", "first") and not (value.isdigit() and int(value) > 0):
        raise click.BadParameter("last, first or a cycle number (1 = the earliest)")
    return value


def comm_patterns(ctx, param, value) -> tuple[str, ...]:
    from tracekit.classify import check_patterns

    return check_patterns(value)


def load_options(function):
    """--comm-kernel, --cycle, --no-cache, --workers and --scheduler, passed on as `options`."""
    @functools.wraps(function)
    def with_options(*args, comm_kernels, cycle, no_cache, workers, scheduler, **kwargs):
        options = {"comm_kernels": comm_kernels, "cycle": cycle, "cache": False if no_cache else None,
                   "workers": workers, "scheduler": scheduler}
        return function(*args, options=options, **kwargs)

    with_options = click.option("--workers", type=click.IntRange(min=1), default=None,
                                help="Processes that load and analyse the ranks at once (default: "
                                     "TRACEKIT_WORKERS, else one per 64 MiB of traces not in the cache, "
                                     "at most the cores: cached traces load faster than a process starts).")(with_options)
    with_options = click.option("--scheduler", default=None, metavar="tcp://HOST:PORT",
                                help="Run the per-rank work on this Dask cluster instead (default: "
                                     "TRACEKIT_SCHEDULER; the `dask` extra).")(with_options)
    with_options = click.option("--no-cache", is_flag=True,
                                help="Decode the traces again instead of reading the trace cache "
                                     "(TRACEKIT_CACHE_DIR; `tracekit cache info`).")(with_options)
    with_options = click.option("--cycle", default="last", show_default=True, callback=cycle_choice,
                                help="With several profiling cycles of a rank in a directory: last, first or N "
                                     "(1 = the earliest, as TensorBoard numbers them).")(with_options)
    return click.option("--comm-kernel", "comm_kernels", multiple=True, callback=comm_patterns, metavar="REGEX",
                        help="Also count device kernels whose name matches REGEX as communication "
                             "(repeatable; docs/trace-model.md lists the built-in patterns).")(with_options)


def verb(function):
    """A per-rank, per-step report command: PATHS, --steps, --agg, --rank, --format, load options."""
    for decorate in (load_options, table_layout, format_option, rank_option, agg_option, steps_option, paths_argument):
        function = decorate(function)
    return main.command()(function)


def per_step(paths, rank, options, analysis, steps, agg):
    """[(trace, frame)] of `analysis(trace)` for every trace: the chosen steps, and the
    statistic row."""
    from tracekit.analyses.aggregate import selected, with_aggregate

    return [(info, with_aggregate(selected(frame, steps, info.path), agg))
            for info, frame in of_ranks(analysed_runs(paths, options, analysis, rank=rank), rank, paths)]


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
def syncs(paths, steps, agg, rank, fmt, layout, options):
    """Host-blocking calls (cudaEventSynchronize & co.) with blocked time, GPU idle time and
    blame: the enclosing CPU ops, innermost first. CUPTI cuda_sync records are counted apart."""
    from tracekit.analyses.syncs import sync_ledger

    emit(render(per_step(paths, rank, options, sync_ledger, steps, agg), fmt, "syncs", layout))


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
def breakdown(paths, steps, agg, rank, fmt, layout, options, scope):
    """Each step's GPU span on each device split exactly into compute, exposed comm, exposed
    memcpy/memset and idle by host cause (parts add up to span_ns)."""
    from functools import partial

    from tracekit.analyses.breakdown import breakdown as analysis

    emit(render(per_step(paths, rank, options, partial(analysis, scope=scope), steps, agg), fmt, "breakdown", layout))


@verb
@scope_option
@click.option("--by", type=click.Choice(["name", "op", "category"]), default="name", show_default=True,
              help="Group the device work by kernel name, launching CPU op, or category and collective kind.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="The groups with the largest total time shown per step and device.")
def kernels(paths, steps, agg, rank, fmt, layout, options, scope, by, top):
    """Per rank, step and device: the top kernels (or ops, or categories) by total device time,
    with count, total, mean, % of GPU busy time, category and collective kind."""
    from functools import partial

    from tracekit.analyses.kernels import kernels as analysis
    from tracekit.analyses.kernels import top as largest

    report = [(info, largest(frame, top)) for info, frame in
              per_step(paths, rank, options, partial(analysis, by=by, scope=scope), steps, agg)]
    emit(render(report, fmt, "kernels", layout))


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
    from tracekit.render import render_lint
    from tracekit.runs import analyse

    per_trace, per_run = analysis(analyse(paths or [sample_trace_path()], partial(checked), **options))
    per_trace = [(t, f) for t, f in per_trace if rank is None or t.rank == rank]
    if not per_trace:
        raise UsageError(f"--rank {rank}: no trace of rank {rank} in {', '.join(map(str, paths))}")
    emit(render_lint(per_trace, per_run, fmt, layout))
    errors = sum(int((f["severity"] == "error").sum()) for _, f in per_trace + per_run)
    if strict and errors:
        sys.exit(1)


def named_material(trace, by: str, comm_kernels: tuple = (), cache=None):
    """`diff.material` of a trace, a lean one first named from the full step beside it
    (`<its folder>/names/<its file name>`, as `tracekit profile` writes it) when there is one."""
    from tracekit.analyses.diff import material
    from tracekit.analyses.naming import named
    from tracekit.loading import load_trace

    beside = Path(str(trace.path)).parent / "names" / Path(str(trace.path)).name
    counts = named(trace, load_trace(beside, comm_kernels=comm_kernels, cache=cache)) \
        if beside.is_file() and trace.has_gpu else None  # a trace without device work has nothing to name
    found = material(trace, by)
    found.named = counts
    return found


def diffed(a, b, steps, rank, top: int, by: str, options: dict, whole: bool = False, ranks: str = "sum"):
    """(A's traces, B's traces, the RunDiff) with every warning printed: world sizes, steps,
    and the models named by the profile manifests when both have one. The traces are loaded
    here only when `whole` (for export); else each rank's diff material comes from a worker."""
    from functools import partial

    from tracekit.analyses.diff import combine, diff_runs, sign_disagreements
    from tracekit.analyses.variants import with_real
    from tracekit.loading import profile_variant

    if isinstance(steps, list) and len(steps) != 1:
        raise click.BadParameter("diff compares one step, or all (the median step)", param_hint="--steps")
    step = steps if steps == "all" else steps[0]
    if whole:
        a_traces, b_traces = load_traces([a], rank, options), load_traces([b], rank, options)
        result = diff_runs(a_traces, b_traces, step, top, by)
    else:
        a_traces = b_traces = None
        naming = partial(named_material, by=by, comm_kernels=options["comm_kernels"], cache=options["cache"])
        sides = [[m for _, m in of_ranks(analysed_runs([p], options, naming, rank=rank), rank, [p])] for p in (a, b)]
        result = combine(*sides, step, top, by)
    (ma, va), (mb, vb) = profile_variant(a), profile_variant(b)
    warnings = result.warnings + with_real(result, ma, va, mb, vb)
    if ranks != "each":
        warnings += [f"{w}; the {ranks} over ranks hides it (--ranks each)" for w in sign_disagreements(result, by=by)]
    for warning in warnings:
        click.echo(f"tracekit: warning: {warning}", err=True)
    return a_traces, b_traces, result


def diff_sides(paths: tuple) -> tuple[str, str]:
    """A's and B's paths: `A B` (trace files or run directories), or `OUT A B` (variant names
    of one profile output)."""
    if len(paths) not in (2, 3):
        raise UsageError(f"diff takes A B, or OUT A B (variants of a profile output); got {len(paths)} argument(s)")
    if len(paths) == 2:
        existing(None, None, paths)
        return paths
    out, *variants = paths
    existing(None, None, out)
    found = sorted(p.name for p in Path(out).iterdir() if p.is_dir() and p.name != "names") \
        if Path(out).is_dir() else []
    listed = manifest_variants(Path(out))
    for variant in variants:
        if variant in listed and variant not in found:
            raise UsageError(f"{out}: {variant} ran but has no trace (recorded with --profile-steps 0, or it failed)")
        if variant not in found:
            raise UsageError(f"{out}: no variant {variant} (found: {', '.join(found) or 'none'})")
    return str(Path(out) / variants[0]), str(Path(out) / variants[1])


def manifest_variants(out: Path) -> list[str]:
    """The variants a profile output's manifest lists (none without a readable manifest)."""
    try:
        return list(json.loads((out / "manifest.json").read_text())["variants"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def side_names(a: str, b: str) -> tuple[str, str]:
    """Short names of the two sides: their last path parts (`A`/`B` when those agree)."""
    names = Path(a.rstrip("/")).name, Path(b.rstrip("/")).name
    return names if names[0] != names[1] else ("A", "B")


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="[OUT] A B")
@click.option("--steps", default="all", show_default=True, callback=steps_choice,
              help="One step both have, or all: each side's median step is attributed and each item's "
                   "delta over the steps both have gives its spread.")
@rank_option
@load_options
@click.option("--top", type=int, default=20, show_default=True, help="Items shown; the rest is one 'other' row.")
@click.option("--by", type=click.Choice(["kernel", "fsdp"]), default="kernel", show_default=True,
              help="Group by kernel identity (kind, name, op, phase) or by FSDP phase (kind, phase, FSDP label).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=new_file,
              help="Also draw the waterfall to FILE.png or FILE.html.")
@click.option("--ranks", type=click.Choice(["each", "sum", "mean"]), default="each", show_default=True,
              help="With several ranks: a table per rank, or their sum or mean (JSON: the top level is the "
                   "mean with mean, else the sum; `ranks` holds each).")
@format_option
@table_layout
def diff(paths, steps, rank, options, top, by, ranks, plot_path, fmt, layout):
    """Attribute B's step time minus A's to kernels, collectives and idle causes, exactly.

    A and B are trace files or run directories of the same job in two variants, or, after a
    `tracekit profile` output OUT, two of its variants' names."""
    from tracekit.render import render_diff

    a, b = diff_sides(paths)
    from tracekit.analyses.lead import diff_lead

    _, _, result = diffed(a, b, steps, rank, top, by, options, ranks=ranks)
    names = side_names(a, b)
    emit(render_diff(a, b, result, fmt, layout, ranks, diff_lead(result, *names, by)))
    if plot_path:
        from tracekit.plot import waterfall

        written = waterfall(result.shown(ranks), *names, plot_path, "sum over ranks" if ranks == "sum" else "mean rank")
        wrote(written)


@main.command()
@click.argument("paths", nargs=-1, required=True, callback=existing)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), callback=new_file,
              help="The .pftrace to write.")
@click.option("--diff", "as_diff", is_flag=True, help="PATHS are A and B: both variants side by side, aligned at "
              "their step start, with the top diff items marked.")
@click.option("--steps", default="all", show_default=True, callback=steps_choice,
              help="With --diff: the step compared (all: each side's median step).")
@rank_option
@load_options
@click.option("--top", type=int, default=10, show_default=True, help="With --diff: diff items marked.")
def export(paths, output, as_diff, steps, rank, options, top):
    """Write a Perfetto trace with the source tracks and what the analyses found."""
    from tracekit.export import export_diff, export_traces

    if not as_diff:
        n = export_traces(list(paths), output, options, rank)
        wrote(output, f" ({n} rank trace(s)); view it with `tracekit open {output}`")
        return
    if len(paths) != 2:
        raise click.UsageError("--diff takes exactly two PATHS: A and B")
    a_traces, b_traces, result = diffed(paths[0], paths[1], steps, rank, top, "kernel", options, whole=True)
    export_diff(a_traces, b_traces, result, (Path(paths[0]).name, Path(paths[1]).name), output, top)
    wrote(output, f"; view it with `tracekit open {output}`")


@main.command("open")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--port", type=int, default=9001, show_default=True)
@click.option("--browser/--no-browser", default=True, help="Open the link in a browser when one exists.")
def open_command(file, port, browser):
    """Serve FILE to the Perfetto UI (ui.perfetto.dev) once, the way Perfetto's own
    open_trace_in_ui does, and print the link. Exits after the UI fetched it, or on Ctrl-C."""
    from tracekit.serve import serve_once

    try:
        serve_once(Path(file), port, browser, lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        click.echo("tracekit: stopped", err=True)


@main.group()
def cache():
    """The trace cache: decoded traces (and the timeline) kept for later commands."""


@cache.command("info")
@format_option
def cache_info(fmt):
    """Where the cache is, how many traces and bytes it holds, and its bound."""
    from tracekit.cache import info
    from tracekit.render import json_text
    from tracekit.views import size_text

    found = info()
    if fmt == "json":
        emit(json_text(found))
        return
    emit(f"folder: {found['folder']}\nentries: {found['entries']}\nsize: {size_text(found['bytes'])}\n"
         f"bound: {size_text(found['max_bytes'])} (TRACEKIT_CACHE_MAX_GB={found['max_bytes'] / 1e9:g})")


@cache.command("clear")
def cache_clear():
    """Remove every cached trace."""
    from tracekit.cache import clear

    click.echo(f"tracekit: removed {clear()} cached trace(s)", err=True)


@main.group()
def plot():
    """Pictures of a trace (matplotlib)."""


@plot.command()
@click.argument("paths", nargs=-1, callback=existing)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), callback=new_file,
              help="FILE.png or FILE.html")
@click.option("--step", type=int, default=None, help="The step to draw (default: each rank's last).")
@rank_option
@load_options
def timeline(paths, output, step, rank, options):
    """One step per rank: GPU streams as lanes, comm vs compute, exposed comm and idle."""
    from tracekit.plot import timeline as draw

    traces = load_traces(paths, rank, options)
    wrote(draw(traces, step, output))


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="tracekit-out", show_default=True,
              help="Output directory: manifest.json and <variant>/rank<r>.pt.trace.json.gz.")
@click.option("--variants", default="ddp,fsdp1,fsdp2", show_default=True,
              help="Comma-separated: ddp, fsdp1, fsdp1-nolimit, fsdp2, fsdp2-root, fsdp2-noreshard, "
                   "fsdp2-compile, fsdp2-fp8, fsdp2-compile-fp8, lightning-ddp, lightning-fsdp2.")
@click.option("--model", default="builtin", show_default=True,
              help="builtin (the synthetic transformer of --preset), hf:CONFIG (a local transformers config.json "
                   "or a directory with one; random weights, extra hf), or MODULE:FACTORY / path/to/file.py:FACTORY "
                   "returning a tracekit.runners.workload.Workload (docs/profile.md).")
@click.option("--preset", type=click.Choice(["tiny", "small", "medium", "large"]), default="tiny", show_default=True,
              help="The built-in model's shapes; for hf: its batch and seq.")
@click.option("--blocks", type=int)
@click.option("--hidden", type=int)
@click.option("--heads", type=int)
@click.option("--seq", type=int)
@click.option("--batch", type=int, help="Sequences per rank (weak scaling).")
@click.option("--global-batch", type=int, help="Sequences in total, split over the ranks (strong scaling).")
@click.option("--inputs", default="fixed", show_default=True,
              help="fixed, variable-length, variable-mask or buckets:L1,L2,... (docs/profile.md).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="Default: cuda when available (NCCL), else cpu (gloo).")
@click.option("--nproc", type=int, default=None, help="Workers to start (default: GPUs, or 2 on CPU). "
              "Ignored under torchrun/srun.")
@click.option("--precision", type=click.Choice(["bf16", "fp32"]), default=None,
              help="bf16 parameters with fp32 reduction (default on cuda) or fp32 (default on cpu).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--steps", type=int, default=20, show_default=True, help="Timed unprofiled steps.")
@click.option("--profile-steps", type=int, default=1, show_default=True,
              help="Steps recorded with the profiler after the timed ones (0: none).")
@click.option("--profile-mode", type=click.Choice(["device", "lean", "light", "full"]), default="device", show_default=True,
              help="device: device activity only, the runner's step and phase marks written in (the cheapest), "
                   "then one full step for names; lean: device activity and annotations, then one full step; "
                   "light: every CPU op; full: every CPU op with shapes (and stacks with --with-stack). "
                   "docs/profile.md.")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Run the whole variant matrix this many times, the order alternated (A B, B A, ...); the "
                   "report's intervals are then across repeats. Traces are recorded in the last repeat.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (full mode).")
@click.option("--checkpoint", type=click.Choice(["sync", "async"]), default=None,
              help="Save model and optimizer state with torch.distributed.checkpoint during the timed steps.")
@click.option("--checkpoint-every", type=int, default=5, show_default=True, help="Timed steps between saves.")
@click.option("--keep-checkpoints", is_flag=True, help="Keep OUT/<variant>/ckpt after the run.")
@click.option("--memory-fraction", type=float, default=None,
              help="Limit each rank to this fraction of its GPU's memory (a smaller GPU, for capacity).")
@click.option("--collective-timeout", "collective_timeout_s", type=float, default=600, show_default=True,
              help="Seconds a collective may wait for peers before the variant fails on every rank.")
@click.option("--overwrite", is_flag=True, help="Write into an existing --out.")
@click.option("--strict", is_flag=True, help="Exit 1 when any variant failed (error or oom). Without it the exit "
              "status is 1 only when no variant succeeded; failures are in the manifest either way.")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Print the variants side by side at the end (`tracekit report OUT` prints it later).")
@format_option
def profile(out, variants, preset, blocks, hidden, heads, seq, batch, overwrite, strict, report, fmt, **options):
    """Record profiled optimizer steps per variant (one trace per rank) and report them side by side.

    A variant that fails (an exception, out of memory, a worker that dies) is recorded in the
    manifest, one line on stderr, and the next variant runs on fresh workers. Exit status: 0,
    or 1 when no variant succeeded (or, with --strict, when any failed); 2 for bad options."""
    from tracekit.runners.launch import make_config, prepare_out, profile as run_profile

    cfg = make_config({"out": str(out), "variants": [v.strip() for v in variants.split(",") if v.strip()],
                       "preset": preset, "overrides": {"blocks": blocks, "hidden": hidden, "heads": heads,
                                                       "seq": seq, "batch": batch}, **options})
    prepare_out(Path(out), overwrite)  # every rank under torchrun: each refuses an existing OUT
    manifest = run_profile(cfg)
    if os.environ.get("RANK", "0") != "0":
        return
    traces = " and one trace per rank per variant" if cfg["profile_steps"] else " (no traces: --profile-steps 0)"
    click.echo(f"tracekit profile: wrote {out}/manifest.json{traces}", err=True)
    statuses = [e.get("status") for e in manifest["variants"].values()]
    if report and "ok" in statuses:
        show_report(out, fmt)
    if "ok" not in statuses or (strict and any(s in ("error", "oom") for s in statuses)):
        sys.exit(1)


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="tracekit-capacity", show_default=True,
              help="Output directory: capacity.json and one profile output per probe.")
@click.option("--variants", default="ddp,fsdp1,fsdp2", show_default=True, help="Comma-separated, as for profile.")
@click.option("--presets", default="small,medium,large", show_default=True, help="Comma-separated, smallest first.")
@click.option("--batches", default="1,2,4,8", show_default=True, help="Sequences per rank, comma-separated.")
@click.option("--seq", type=int)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None)
@click.option("--nproc", type=int, default=None)
@click.option("--precision", type=click.Choice(["bf16", "fp32"]), default=None)
@click.option("--memory-fraction", type=float, default=None,
              help="Limit each rank to this fraction of its GPU's memory (a smaller GPU).")
@click.option("--collective-timeout", "collective_timeout_s", type=float, default=600, show_default=True)
@click.option("--overwrite", is_flag=True, help="Write into an existing --out.")
@format_option
def capacity(out, variants, presets, batches, seq, overwrite, fmt, **options):
    """The largest preset and batch each variant trains: out-of-memory is evidence, not a crash."""
    from tracekit.analyses.variants import capacity_table
    from tracekit.runners.capacity import capacity as run_capacity
    from tracekit.runners.launch import prepare_out

    try:
        sizes = [int(b) for b in batches.split(",")]
    except ValueError:
        raise click.BadParameter("whole numbers, e.g. 1,2,4,8", param_hint="--batches") from None
    prepare_out(Path(out), overwrite)  # every rank under torchrun: each refuses an existing OUT
    defaults = {"seed": 0, "inputs": "fixed", "with_stack": False, "profile_mode": "device", "repeats": 1,
                "checkpoint_every": 5,
                "keep_checkpoints": False, "global_batch": None,
                "overrides": {"blocks": None, "hidden": None, "heads": None, "seq": seq, "batch": None}}
    result = run_capacity({**defaults, **options, "out": str(out),
                           "variants": [v.strip() for v in variants.split(",") if v.strip()]},
                          [p.strip() for p in presets.split(",") if p.strip()], sizes)
    if os.environ.get("RANK", "0") == "0":
        emit(render_frame(capacity_table(result), fmt))


@main.command("report")
@click.argument("out", type=click.Path(exists=True, file_okay=False))
@click.option("--baseline", default=None, metavar="VARIANT", help="The variant the others are compared with "
              "(default: the first that ran).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=new_file,
              help="Also draw each variant's recorded step split (compute, exposed comm, memcpy, idle by "
                   "cause) beside its timed step to FILE.png or FILE.html.")
@format_option
@table_layout
def report_command(out, baseline, plot_path, fmt, layout):
    """The variants of a `tracekit profile` output side by side, each against the baseline."""
    show_report(out, fmt, layout, baseline, plot_path)


def show_report(out, fmt: str, layout=None, baseline: str | None = None, plot_path=None) -> None:
    """The variants side by side with their noise and fidelity, warnings, then each one's
    exact diff against the baseline (top items, the mean rank); in JSON one object
    `{variants, phases, diffs, warnings}` (docs/json.md)."""
    from tracekit.analyses.lead import diff_lead
    from tracekit.analyses.variants import (base_variant, phase_table, report_warnings, variant_diffs,
                                            variant_table, with_real)
    from tracekit.loading import load_profile
    from tracekit.render import json_text, full_diff_doc, render_diff
    from tracekit.views import Layout

    layout = layout or Layout()
    manifest, runs = load_profile(out)
    try:
        base = base_variant(manifest, baseline)
    except ValueError as e:
        raise UsageError(str(e)) from None
    table, phases = variant_table(manifest, runs, base), phase_table(manifest, base)
    warnings = report_warnings(table, manifest["config"].get("profile_mode", "full"))
    diffs = variant_diffs(runs, top=8, base=base)
    for (a, b), result in diffs.items():
        warnings += [f"{b} − {a}: {w}"
                     for w in result.warnings + with_real(result, manifest, a, manifest, b, sides=False)]
    leads = {pair: diff_lead(result, *pair) for pair, result in diffs.items()}
    if fmt == "json":
        emit(json_text({"variants": table.to_dicts(), "phases": phases.to_dicts(),
                         "diffs": [full_diff_doc(a, b, result, "sum", leads[a, b]) for (a, b), result in diffs.items()],
                         "warnings": warnings}, indent=1))
    else:
        emit(render_frame(table, fmt, "report", layout))
        if fmt in ("table", "md") and phases.height:
            click.echo("\nper phase, timed steps (pct: median phase ÷ median step, so they need not add to 100;\n"
                       "rec_d_ms: the Δ in the recorded steps):")
            emit(render_frame(phases, fmt, "report.phases", layout))
        if fmt in ("table", "md"):
            for (a, b), result in diffs.items():
                click.echo("")
                emit(render_diff(a, b, result, fmt, Layout(wide=layout.wide), "mean", leads[a, b]))
    for warning in warnings:
        click.echo(f"tracekit: warning: {warning}", err=True)
    if plot_path:
        from tracekit.analyses.variants import step_split, timed_steps
        from tracekit.plot import report_picture

        wrote(report_picture(step_split(runs), timed_steps(table), plot_path))


@main.command()
@click.argument("out", type=click.Path(exists=True, file_okay=False))
@format_option
def check(out, fmt):
    """Compare the counts found in each profiled step's traces with what the runtime counted in
    that step, and every variant's first-step loss and grad norm and its parameter checksum
    after the timed steps with the first variant's (tolerances: docs/metrics.md).

    Prints every comparison, then one line (`all N counts match` or `K of N counts differ`);
    exits 1 on any mismatch."""
    from tracekit.analyses.variants import count_check, parity_check
    from tracekit.loading import load_profile
    from tracekit.render import json_text

    manifest, runs = load_profile(out)
    counts, parity = count_check(manifest, runs, load_profile(out, names=True)[1]), parity_check(manifest)
    if fmt == "json":
        emit(json_text({"counts": counts.to_dicts(), "parity": parity.to_dicts()}))
    else:
        emit(render_frame(counts, fmt) + "\n\n" + render_frame(parity, fmt))
    for row in counts.filter(~counts["match"]).iter_rows(named=True):
        click.echo(f"tracekit check: mismatch: {row['variant']} rank {row['rank']} step {row['step']} {row['count']}: "
                   f"trace {row['trace']}, runtime {row['runtime']}", err=True)
    for row in parity.filter(~parity["match"]).iter_rows(named=True):
        click.echo(f"tracekit check: mismatch: {row['variant']} rank {row['rank']} {row['figure']} "
                   f"{row['value']:.6g} vs {row['base']}'s {row['base_value']:.6g} (relative {row['rel_diff']:.2g} > "
                   f"{row['tolerance']:g})", err=True)
    verdict = agreement(counts.height, int((~counts["match"]).sum()), "counts match", "counts differ")
    if parity.height:
        verdict += ", " + agreement(parity.height, int((~parity["match"]).sum()), "parity figures match",
                                    "parity figures differ")
    click.echo(verdict, err=fmt in ("json", "csv"))
    if not (counts["match"].all() and parity["match"].all()):
        sys.exit(1)


def agreement(n: int, differ: int, match: str, differ_text: str) -> str:
    """`all N <match>` or `K of N <differ_text>`."""
    return f"{differ} of {n} {differ_text}" if differ else f"all {n} {match}"
