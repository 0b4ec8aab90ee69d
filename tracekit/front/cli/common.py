"""What every verb shares: the command group, its error handling, the load and table options,
and the helpers that load, analyse and print."""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

import click

from tracekit.core.errors import TraceError, TracekitError, UsageError, WorkerDied
from tracekit.core.words import counted  # noqa: F401 (the verbs' modules take it from here)

# Analysis modules (polars) are imported inside the commands: the runners need only torch.
FORMATS = ("table", "json", "csv", "md")


class Group(click.Group):
    """Bad input or options → one line on stderr, exit 2, no traceback (and no usage text)."""

    def invoke(self, ctx):
        try:
            result = super().invoke(ctx)
        except TracekitError as e:
            shout(str(e), wrap=sys.stderr.isatty())
            ctx.exit(2)
        except click.UsageError as e:
            shout(e.format_message(), wrap=sys.stderr.isatty())
            ctx.exit(2)
        except WorkerDied as e:  # not the input's fault: exit 1, one line all the same
            shout(str(e), wrap=sys.stderr.isatty())
            ctx.exit(1)
        except (SystemExit, click.exceptions.Exit):  # a verb's own exit status: its notes stand
            said()
            raise
        said()
        return result


@click.group(cls=Group)
@click.version_option(package_name="torch-tracekit")
def main():
    """Profiler-centric trace analysis for distributed PyTorch training."""


def sample_trace_path() -> str:
    """The real H200 trace shipped with the package (the default input)."""
    from importlib.resources import files

    return str(files("tracekit") / "data" / "fsdp1_rank0.trace.json.gz")


def inputs(paths) -> list:
    """`paths`, or the bundled sample trace with a note on stderr saying so (and how to read
    the traces in the current folder, where there are any)."""
    if paths:
        return once(paths)
    here = sorted(p.name for p in Path.cwd().glob("*.json*") if p.name.endswith((".json", ".json.gz")))
    reads = f"`tracekit <verb> .` reads {'it' if len(here) == 1 else 'them'}"
    hint = f"; this folder holds {counted(len(here), 'JSON file')}: {reads}" if here else ""
    say(f"no PATHS given: reading the bundled sample trace {Path(sample_trace_path()).name} "
        f"(FSDP1, rank 0 of 2 × H200){hint}")
    return [sample_trace_path()]


def once(paths) -> list:
    """`paths` with each location once (a file given twice is read once), with a note where one
    was given again."""
    given: dict[str, list] = {}
    for p in paths:
        given.setdefault(location(p), []).append(p)
    for same in given.values():
        if len(same) > 1:
            say(f"warning: {same[0]} is given {len(same)} times: read once")
    return [same[0] for same in given.values()]


def location(path) -> str:
    """Where `path` is: its resolved path, or the URL itself (two spellings of one file agree)."""
    from tracekit.core.files import is_url

    return str(path) if is_url(path) else str(Path(path).resolve())


def analysed_runs(paths, options: dict, analysis=None, here: bool = False, rank: int | None = None,
                  named: bool = True, apart: bool = True) -> list:
    """`analysis(trace)` for every trace under `paths` (default: the embedded sample trace),
    per run (`runs.analyse`: in worker processes or on a Dask cluster unless `here`), each
    trace first named from the full step beside it unless not `named`, with the lint findings
    (of `rank`'s trace and of the runs) printed as notes on stderr, one line per kind. Trace
    files given one by one that claim one rank are warned of (`same_rank`) only where `apart`:
    not the two sides of a diff, each its own run."""
    from functools import partial

    from tracekit.analyses.lint import GivenApart, checked, lint, notes
    from tracekit.core.runs import analyse

    load = {k: options[k] for k in ("comm_kernels", "cycle", "cache")}
    where = {"workers": 1} if here else {"workers": options["workers"], "scheduler": options["scheduler"]}
    first_named = partial(named_then, analysis=analysis, comm_kernels=options["comm_kernels"], cache=options["cache"])
    runs = analyse(inputs(paths), partial(checked, analysis=first_named if named else analysis), **load, **where)
    per_trace, per_run = lint(runs)
    per_run = [(run, f) for run, f in per_run if apart or not isinstance(run, GivenApart)]
    for note in notes([(t, f) for t, f in per_trace if rank is None or t.rank == rank], per_run):
        say(note)
    return runs


def named_beside(trace, comm_kernels: tuple = (), cache=None) -> tuple[int, int] | None:
    """Names a `cupti`, `device` or `lean` recording from the `full` step beside it
    (`<its folder>/names/<its file name>`, as `tracekit profile` writes it; `naming.named`):
    (matched, activities with a step), or None where there is none (or no device work)."""
    from tracekit.analyses.naming import named
    from tracekit.core.loading import load_trace

    beside = Path(str(trace.path)).parent / "names" / Path(str(trace.path)).name
    if not beside.is_file() or not trace.has_gpu:
        return None
    return named(trace, load_trace(beside, comm_kernels=comm_kernels, cache=cache))


def named_then(trace, analysis=None, comm_kernels: tuple = (), cache=None):
    """`analysis(trace)` after the trace was named from the full step beside it (`named_beside`),
    so that every verb shows the launching ops of a recording that has none of its own."""
    named_beside(trace, comm_kernels, cache)
    return analysis(trace) if analysis is not None else None


def say(note: str) -> None:
    """`tracekit: NOTE` on stderr, wrapped at the terminal's width; inside a command, held until
    it prints its answer (`said`), so that a mistake found after loading is one line alone."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return shout(note)
    held = ctx.find_root().meta.setdefault("held notes", [])
    if note not in held:  # a self-diff's two sides find the same
        held.append(note)


def said() -> None:
    """The notes `say` held, on stderr now."""
    ctx = click.get_current_context(silent=True)
    for note in ctx.find_root().meta.pop("held notes", []) if ctx is not None else []:
        shout(note)


def shout(note: str, prefix: str = "tracekit: ", wrap: bool = True) -> None:
    """`PREFIX NOTE` on stderr, wrapped at the terminal's width (a number kept with its unit,
    a long path or name whole on its line: `views.filled`). An error is wrapped only for a
    person at a terminal (`wrap`): to a script or a log it is one line."""
    from tracekit.front.views import filled, terminal_width

    if not wrap:
        return click.echo(f"{prefix}{note}", err=True)
    click.echo(filled(f"{prefix}{note}", terminal_width(), "  "), err=True)


def of_ranks(runs, rank: int | None, paths) -> list:
    """[(TraceInfo, analysis result)] of the runs' traces, or of `rank`'s only."""
    found = [(r.info, r.value.value) for run in runs for r in run.results if rank is None or r.info.rank == rank]
    if not found:
        raise no_rank(rank, {r.info.rank for run in runs for r in run.results}, paths)
    return found


def no_rank(rank: int, there, paths) -> TraceError:
    """The error of `--rank RANK` where the traces under `paths` are of the ranks `there`."""
    return TraceError(", ".join(map(str, paths)) or "the sample trace",
                      f"no trace of rank {rank} (ranks here: {', '.join(map(str, sorted(there)))})")


def load_traces(paths, rank: int | None, options: dict) -> list:
    """Every rank's trace under `paths` (files or run directories), optionally one rank, loaded
    in this process (for the verbs that draw or write whole traces)."""
    from tracekit.analyses.lint import itself

    return [trace for _, trace in of_ranks(analysed_runs(paths, options, itself, True, rank), rank, paths)]


def emit(text: str) -> None:
    said()
    click.echo(text.rstrip("\n"))


def render(report, fmt: str, view: str | None = None, layout=None) -> str:
    from tracekit.front.render import render as render_report
    from tracekit.front.views import Layout

    return render_report(report, fmt, view, layout or Layout())


def render_frame(frame, fmt: str, view: str | None = None, layout=None) -> str:
    from tracekit.front.render import render_frame as render_table
    from tracekit.front.views import Layout

    return render_table(frame, fmt, view, layout or Layout())


def existing(ctx, param, value):
    """Paths or fsspec URLs that exist (click.Path would mangle a URL)."""
    from tracekit.core.files import exists

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


def new_picture(ctx, param, value):
    """A picture's output path (`new_file`): FILE.png, FILE.html, or FILE (.png added)."""
    if value is not None and Path(value).suffix.lower() not in ("", ".png", ".html"):
        raise UsageError(f"{param.opts[-1]} {value}: a picture is written as FILE.png or FILE.html")
    return new_file(ctx, param, value)


def wrote(path, more: str = "") -> None:
    """`tracekit: wrote PATH` on stderr, saying so when it replaced a file that was there."""
    replaced = str(path) in click.get_current_context().meta.get("existing", ())
    said()
    shout(f"wrote {path}{' (replacing the file that was there)' if replaced else ''}{more}")


paths_argument = click.argument("paths", nargs=-1, callback=existing)
rank_option = click.option("--rank", type=int, default=None, help="Only this rank (default: all).")
format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
                             show_default=True)


def table_layout(function):
    """--columns and --wide, passed on as `layout` (what the table format shows)."""
    @functools.wraps(function)
    def with_layout(*args, columns, wide, **kwargs):
        from tracekit.front.views import Layout

        chosen = tuple(c.strip() for c in columns.split(",") if c.strip()) if columns else None
        return function(*args, layout=Layout(chosen, wide), **kwargs)

    with_layout = click.option("--wide", is_flag=True, help="The table shows every column.")(with_layout)
    return click.option("--columns", metavar="A,B,...",
                        help="The table's columns, by name (as shown, or as in csv/json); "
                             "json/csv/md always have every column (md: times in ms, long text elided).")(with_layout)


def steps_choice(ctx, param, value: str) -> str | list[int]:
    """`all`, or step numbers: `3`, `3,5`, `3-7` (inclusive) and mixes of them."""
    if value == "all":
        return "all"
    steps = []
    try:
        for part in value.split(","):
            lo, _, hi = part.strip().partition("-")
            if int(hi or lo) < int(lo):
                raise UsageError(f"--steps {value!r}: a range N-M needs N ≤ M")
            steps += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise UsageError(f"--steps {value!r}: use all, N, N,M or N-M") from None
    return steps


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
    """User comm-kernel patterns, each a valid regex (else one line naming it)."""
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as e:
            raise UsageError(f"--comm-kernel {pattern!r} is not a regular expression: {e}") from None
    return tuple(value)


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
                                     "at most the cores: cached traces load faster than a process starts); "
                                     "1: this process, a thread per core.")(with_options)
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
    for decorate in (load_options, table_layout, format_option, rank_option, agg_option, steps_option, paths_argument,
                     workers_begun):
        function = decorate(function)
    return main.command()(function)


# What a worker imports before its first trace: the loader, lint and the verbs' tasks (`analysed_runs`).
WORKER_MODULES = ("tracekit.core.runs", "tracekit.analyses.lint", "tracekit.front.cli.common")


def workers_begun(function):
    """The verb, run with the worker processes its traces need (`jobs.processes`, as
    `runs.analyse` decides) begun first: on click's parsed options, before the verb imports
    polars and its analyses, so that the workers' imports overlap the command's own."""
    @functools.wraps(function)
    def begun(*args, **kwargs):
        from tracekit.core import executor, jobs
        from tracekit.core.files import is_url

        paths = once(kwargs["paths"])  # none: the bundled sample, one small trace; a URL: listed once, later
        if paths and kwargs["workers"] != 1 and not any(is_url(p) for p in paths) \
                and not (kwargs["scheduler"] or os.environ.get("TRACEKIT_SCHEDULER")):
            n = jobs.processes(jobs.files_of(jobs.planned(paths, kwargs["cycle"])), kwargs["workers"],
                               kwargs["comm_kernels"], False if kwargs["no_cache"] else None)
            if n > 1:
                executor.begin(n, WORKER_MODULES)
        try:
            return function(*args, **kwargs)
        finally:
            executor.end_unused()

    return begun


def per_step(paths, rank, options, analysis, steps, agg):
    """[(trace, frame)] of `analysis(trace)` for every trace: the chosen steps, and the
    statistic row."""
    from tracekit.analyses.aggregate import selected, with_aggregate

    return [(info, with_aggregate(selected(frame, steps, info.path), agg))
            for info, frame in of_ranks(analysed_runs(paths, options, analysis, rank=rank), rank, paths)]


def read_peaks(ctx, param, value) -> dict | None:
    """`--peaks FILE`: a JSON object {device: {dtype: dense TFLOP/s, …, "mem_tbps": TB/s}} laid
    over tracekit's table (`analyses/peaks.py`); None without the option."""
    if value is None:
        return None
    import json

    from tracekit.analyses.peaks import merged

    try:
        table = json.loads(Path(value).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--peaks {value}: {e}") from None
    if not isinstance(table, dict) or not all(
            isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()) for v in table.values()):
        raise UsageError(f"--peaks {value}: expected {{device: {{dtype: TFLOP/s, ..., \"mem_tbps\": TB/s}}}}")
    return merged(table)


def peaks_option(function):
    return click.option("--peaks", type=click.Path(dir_okay=False), callback=read_peaks, default=None,
                        help="JSON of device peaks {device: {dtype: dense TFLOP/s, mem_tbps: TB/s}} laid over "
                             "tracekit's table, one row per SKU (H100 SXM/PCIe/NVL, H200 SXM/NVL, GH200, A100, "
                             "B200, GB200, MI300X); a device it names matches a row by a word of its name.")(function)
