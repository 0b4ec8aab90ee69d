"""Verbs that write or show for other tools: Perfetto export and serving, pictures, the cache."""

from __future__ import annotations

from pathlib import Path

import click

from .common import (counted, emit, existing, format_option, load_options, load_traces, main, new_file, new_picture,
                     rank_option, say, steps_choice, wrote)
from .comparing import diff_sides, diffed, side_names


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), callback=new_file,
              help="The .pftrace to write.")
@click.option("--diff", "as_diff", is_flag=True, help="PATHS are A B, or OUT A B as `diff` takes them: both "
              "variants side by side, aligned at their step start, with the top diff items marked.")
@click.option("--steps", default="all", show_default=True, callback=steps_choice,
              help="With --diff: the step compared (all: each side's median step).")
@rank_option
@load_options
@click.option("--top", type=int, default=10, show_default=True, help="With --diff: diff items marked.")
def export(paths, output, as_diff, steps, rank, options, top):
    """Write a Perfetto trace with the source tracks and what the analyses found."""
    from tracekit.front.export import export_diff, export_traces

    if not as_diff:
        existing(None, None, paths)
        from tracekit.analyses.lint import cycle_finding
        from tracekit.core.files import name

        n, others = export_traces(list(paths), output, options, rank)
        for path, cycles in others.items():
            say(f"warning: other_cycles in {name(path)}: {cycle_finding(path, cycles)['detail']}")
        wrote(output, f" ({counted(n, 'rank trace')}); view it with `tracekit open {output}`")
        return
    a, b = diff_sides(paths, f"export --diff -o {output}")
    a_traces, b_traces, result = diffed(a, b, steps, rank, top, "kernel", options, whole=True)
    export_diff(a_traces, b_traces, result, side_names(a, b), output, top)
    wrote(output, f"; view it with `tracekit open {output}`")


@main.command("open")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--port", type=int, default=9001, show_default=True)
@click.option("--browser/--no-browser", default=True, help="Open the link in a browser when one exists.")
def open_command(file, port, browser):
    """Serve FILE to the Perfetto UI (ui.perfetto.dev) once, the way Perfetto's own
    open_trace_in_ui does, and print the link. Exits after the UI fetched it, or on Ctrl-C."""
    from tracekit.front.serve import serve_once

    try:
        serve_once(Path(file), port, browser, lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        click.echo("tracekit: stopped", err=True)


@main.group()
def cache():
    """The trace cache: decoded traces (and the timeline) kept for later commands, and the
    answers of read-only commands (printed again when nothing they read has changed)."""


@cache.command("info")
@format_option
def cache_info(fmt):
    """Where the cache is, how many traces, answers and bytes it holds, and its bound."""
    from tracekit.core.cache import info
    from tracekit.front.render import json_text
    from tracekit.front.views import size_text

    found = info()
    if fmt == "json":
        emit(json_text(found))
        return
    emit(f"folder: {found['folder']}\nentries: {found['entries']}\nanswers: {found['answers']}\n"
         f"size: {size_text(found['bytes'])}\n"
         f"bound: {size_text(found['max_bytes'])} = {found['max_bytes'] / 1e9:g} GB (TRACEKIT_CACHE_MAX_GB, "
         "in GB of 10⁹ bytes)")


@cache.command("clear")
def cache_clear():
    """Remove every cached trace and kept answer."""
    from tracekit.core.cache import clear

    traces, answers = clear()
    click.echo(f"tracekit: removed {counted(traces, 'cached trace')} and {counted(answers, 'kept answer')}", err=True)


@main.group()
def plot():
    """Pictures of a trace (matplotlib)."""


@plot.command()
@click.argument("paths", nargs=-1, callback=existing)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), callback=new_picture,
              help="FILE.png or FILE.html")
@click.option("--step", "--steps", "step", type=int, default=None,
              help="The step to draw (default: each rank's last).")
@rank_option
@load_options
def timeline(paths, output, step, rank, options):
    """One step per rank: GPU streams as lanes, comm vs compute, exposed comm and idle. A trace
    without device activity (CPU only, gloo) is drawn as its threads: the runner's phases and
    the outermost CPU ops, collectives apart."""
    from tracekit.front.plot import timeline as draw

    wrote(draw(load_traces(paths, rank, options), step, output))
