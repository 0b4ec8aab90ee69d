"""Every verb's default table, `--agg` included, fits 100 columns on every trace in
`tests/data/` and `../shared/` (issue 27; `launches` too, issue 67): each trace loaded once (the
cache), each verb's analysis run and rendered in this process as the command does it. `--agg
mean` gives the widest figures (a count's mean has a decimal), `--agg median` the widest step
column (checked on the folders of runs, whose `run` column makes them the widest tables). Every
option a user can type (`--scope`, `--by`, `--top`, every `--agg`, `--wide`) on a few traces
that differ most (runs of ranks, ROCm, MTIA, CPU-only, TraceLens' and HTA's): the defaults on
all of them would take minutes."""

import os
import re
from functools import partial
from pathlib import Path

import pytest
from conftest import DATA

import tracekit
from tracekit.analyses.aggregate import with_aggregate
from tracekit.analyses.breakdown import breakdown, largest
from tracekit.analyses.comms import comms
from tracekit.analyses.critical_path import collective_arrivals, critical_path
from tracekit.analyses.kernels import kernels, top
from tracekit.analyses.launches import launches
from tracekit.analyses.lint import checked, lint
from tracekit.analyses.overlap import overlap
from tracekit.analyses.summary import summary
from tracekit.analyses.syncs import sync_ledger
from tracekit.core.files import runs_in
from tracekit.core.runs import Analysed, RunResult, TraceInfo
from tracekit.front.render import render, render_lint
from tracekit.front.views import Layout

SHARED = Path(__file__).parents[1].parent / "shared"
WIDTH = 100


def trace_files() -> list[Path]:
    """Every trace file under tests/data and ../shared, each once (not the runtime counts
    beside the runner's traces, the manifests, the experiments' result files or the CUPTI records
    sample)."""
    found = {}
    for root in (DATA, SHARED):
        for p in sorted(root.rglob("*")):
            if (p.is_file() and p.name.endswith((".json", ".json.gz")) and "experiments" not in p.parts
                    and not p.name.startswith(("truth_", "manifest", "published", "cupti-fields"))
                    and p.parent.name != "names" and "repro" not in p.parts):  # repro: broken on purpose
                found.setdefault((p.name, p.stat().st_size), p)  # ../shared holds copies of some
    return list(found.values())


PER_STEP = {"summary": summary, "syncs": sync_ledger, "overlap": overlap, "breakdown": breakdown,
            "kernels": lambda t: top(kernels(t), 10), "kernels --by op": lambda t: top(kernels(t, by="op"), 10),
            "kernels --by category": partial(kernels, by="category"), "launches": launches}

# every other option of the per-step verbs (the table shows `--top` largest: `top`, `largest`)
OPTIONS = {**{f"{verb} --scope {scope}": partial(analysis, scope=scope) for scope in ("trace", "launched")
              for verb, analysis in (("summary", summary), ("breakdown", breakdown))},
           **{f"overlap --scope {scope}": partial(overlap, scope=scope) for scope in ("trace", "launched", "hta")},
           **{f"kernels --by {by} --scope {scope}": (lambda t, by=by, scope=scope: top(kernels(t, by=by, scope=scope), 10))
              for by, scope in (("op", "step"), ("op,name", "step"), ("name", "trace"), ("op,name", "launched"))},
           "kernels --top 30": lambda t: top(kernels(t), 30), "breakdown --top 3": lambda t: largest(breakdown(t), 3)}


def tables(runs: list[list], statistics=("mean",), options: dict = {}, wide: bool = False) -> dict[str, str]:
    """Each verb's table of the runs' traces (each a list of traces), default and with `--agg`
    of each of `statistics`, and of `options` (a verb and its options → its analysis); with
    `--wide` too where `wide`."""
    traces = [t for run in runs for t in run]
    infos = [TraceInfo.of(t) for t in traces]
    frames = {verb: [analysis(t) for t in traces] for verb, analysis in {**PER_STEP, **options}.items()}
    frames["comms"] = [frame for run in runs for frame in comms(run)]
    frames["critical-path"] = [critical_path(t, a) for run in runs for t, a in zip(run, collective_arrivals(run))]
    out = {}
    for verb, per_trace in frames.items():
        view = verb.split()[0]
        out[verb] = render(list(zip(infos, per_trace)), "table", view)
        if wide:
            out[f"{verb} --wide"] = render(list(zip(infos, per_trace)), "table", view, Layout(wide=True))
        for statistic in statistics if verb not in options else ():  # an option's: as the default's
            agg = [with_aggregate(f, statistic) for f in per_trace]
            out[f"{verb} --agg {statistic}"] = render(
                list(zip(infos, [top(f, 10) if view == "kernels" else f for f in agg])), "table", view)
    results = [RunResult(run[0].path, [Analysed(TraceInfo.of(t), checked(t)) for t in run]) for run in runs]
    out["lint"] = render_lint(*lint(results), "table")
    if wide:
        out["lint --wide"] = render_lint(*lint(results), "table", Layout(wide=True))
    return out


def widest(runs: list[list], statistics=("mean",), options: dict = {}, wide: bool = False) -> dict[str, int]:
    """Each verb's widest line; asserts too that no table parts a number from its unit, and
    that a kernel's name is elided only where the table takes the terminal's width (it has no
    room for more: issue 27, item 5), and that a share's column has one number of decimals, 2
    at most (`pct_of_busy` of a mean was `14.050` beside `9.84`: item 7)."""
    texts = tables(runs, statistics, options, wide)
    assert not {verb: names for verb, text in texts.items() if verb.endswith("--wide") and (names := broken_names(text))}
    texts = {verb: text for verb, text in texts.items() if not verb.endswith("--wide")}  # every column: as wide as it takes
    assert not {verb: split for verb, text in texts.items() if (split := unit_splits(text))}
    assert not [verb for verb, text in texts.items() if verb.startswith(("kernels", "critical-path")) and "…" in text
                and max(map(len, text.splitlines())) < WIDTH]
    assert not {verb: odd for verb, text in texts.items() if (odd := share_decimals(text))}
    return {verb: max(map(len, text.splitlines())) for verb, text in texts.items()}


def broken_names(text: str) -> list[str]:
    """A `--wide` table's columns whose names are broken over lines, or narrower than their
    name (`kernels --wide` at 100 columns squeezed every column to ~4 characters: issue 67):
    `--wide` shows every column as wide as it takes, the terminal's width or not."""
    lines = text.splitlines()
    rule = next((k for k, line in enumerate(lines) if line.startswith("─")), None)
    if rule is None:
        return []
    spans = [m.span() for m in re.finditer("─+", lines[rule])]
    paths = 1 if lines[0].startswith("path: ") else 0
    if lines[0] == "paths:":  # then one a line, indented
        paths = 1 + next(k for k, line in enumerate(lines[1:]) if not line.startswith("  /"))
    return [line[a:b] for a, b in spans for line in lines[paths:rule] if line[a:b].rstrip().endswith("_")]


UNIT = re.compile(r"(?:ns|µs|ms|s|%|×|B|KiB|MiB|GiB|GB/s|more|/ (?:ns|µs|ms|s))(?![\w/])")


def share_decimals(text: str) -> dict[str, set[int]]:
    """A table's share and rate columns (`pct`, `gbps` in the name, the lines of a broken name
    joined) whose figures have more than 2 decimals, or not the same number on every row."""
    lines, odd = text.splitlines(), {}
    for k, rule in enumerate(lines):
        if not rule.startswith("─"):
            continue
        above = lines[:k][::-1]  # the table's own heading: the lines above its rule, to a blank one or a note
        head = list(reversed(above[:next((j for j, line in enumerate(above) if not line.strip()
                                          or line.startswith("(")), len(above))][:3]))
        for m in re.finditer("─+", rule):
            name = "".join(line[m.start():m.end()].strip() for line in head)
            below = lines[k + 1:]
            body = below[:below.index("")] if "" in below else below  # the table's rows, to its end
            cells = [line[m.start():m.end()].strip() for line in body if line.strip()]
            places = {len(c.partition(".")[2]) for c in cells if re.fullmatch(r"-?[\d,]+\.\d+", c)}
            if re.search(r"pct|gbps", name) and (len(places) > 1 or max(places, default=0) > 2):
                odd[name] = places
    return odd


def unit_splits(text: str) -> list[str]:
    """The places where a line (or, under a table's rule, a column's line) ends with a number
    and the next one goes on with its unit (`0.026` over `ms`, `… 3` over `more`): lines read as
    prose, and a table's columns, bounded by its rule, where the next line goes on with the
    row (its first column blank)."""
    lines, found = text.splitlines(), []
    columns = []  # under a table's rule, to the blank line after it
    for a, b in zip(lines, lines[1:]):
        if b.startswith("─"):
            columns = [m.span() for m in re.finditer("─+", b)]
        elif not a.strip():
            columns = []
        going_on = columns and not b[:columns[0][1]].strip()
        for start, end in columns if going_on else [] if columns else [(0, None)]:
            top, below = a[start:end].strip(), b[start:end].strip()
            if re.search(r"\d$", top) and UNIT.match(below):
                found.append(f"{top[-20:]} | {below[:20]}")
    return found


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: str(p).split("/data/")[-1].split("/shared/")[-1])
def test_every_default_table_fits_100_columns(path, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    wide = widest([[tracekit.load(path)]])
    assert all(w <= WIDTH for w in wide.values()), {v: w for v, w in wide.items() if w > WIDTH}


EVERY_OPTION = [DATA / "h200x2-small" / "ddp", DATA / "gloo-cpu", DATA / "wild" / "hta" / "mtia_rank_0.json.gz",
                DATA / "wild" / "tracelens" / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                DATA / "external" / "hta-tests-data" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"]


@pytest.mark.parametrize("path", EVERY_OPTION, ids=lambda p: p.name)
def test_every_option_fits_100_columns(path, monkeypatch):
    """Every option of every verb (`--scope`, `--by`, `--top`, every `--agg`) fits 100 columns on
    traces that differ most; `--wide` breaks no column's name (issue 67, item 9: `launches` took
    131–140 columns)."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    loaded = tracekit.load(path)
    wide = widest([getattr(loaded, "traces", [loaded])], ("mean", "median", "p90", "min", "max"), OPTIONS, wide=True)
    assert all(w <= WIDTH for w in wide.values()), {v: w for v, w in wide.items() if w > WIDTH}


RUN_SETS = [DATA / name for name in ("h200x2-small", "h200x2-blocks4", "h200x2-lean", "h200x1-device", "gloo-cpu")] + [
    DATA / "wild" / "tensorboard-plugin" / "resnet50_num_workers_0", SHARED / "traces" / "h200x2-small"]


@pytest.mark.parametrize("path", [p for p in RUN_SETS if p.exists()], ids=lambda p: p.name)
def test_every_default_table_of_several_runs_fits_100_columns(path, monkeypatch):
    """Folders of run folders (one per variant: the `run` column) and of ranks; `--agg median`
    too, whose step column is the widest (kernels --by op of h200x2-small took 132 columns)."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    wide = widest([tracekit.load(run).traces for run in runs_in(str(path))], ("mean", "median"))
    assert all(w <= WIDTH for w in wide.values()), {v: w for v, w in wide.items() if w > WIDTH}


DIFF_PAIRS = [(DATA / "h200x2-small" / "ddp", DATA / "h200x2-small" / "fsdp1"),
              (DATA / "wild" / "tracelens" / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
               DATA / "wild" / "tracelens" / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
              (DATA / "external" / "hta-tests-data" / "trace_diff" / "control" / "control.json.gz",
               DATA / "external" / "hta-tests-data" / "trace_diff" / "test" / "test.json.gz"),
              (DATA.resolve() / "external" / "hta-tests-data" / "critical_path" / "cuda_event_sync_multi_stream" /
               "event_sync_trace.json.gz", DATA.resolve() / "h200x2-small" / "ddp" / "rank0.trace.json.gz")]


@pytest.mark.parametrize("pair", DIFF_PAIRS, ids=lambda p: f"{p[0].parent.name}-{p[1].parent.name}")
def test_diff_fits_100_columns(pair):
    """`diff` of real pairs, each and over ranks: its header wraps after a long path (the
    TraceLens H100 against MI300 pair took 111 columns), a path longer than a line is shown
    shorter, its file's name whole (HTA's multi-stream trace by its absolute path: 120 columns),
    its tables fit, and neither they, the lead nor a warning part a number from its unit
    (`157.567` over `ms` in the header of HTA's trace_diff pair)."""
    from click.testing import CliRunner

    from tracekit.front.cli import main
    for ranks in ("each", "mean"):
        result = CliRunner(env={"COLUMNS": str(WIDTH)}).invoke(main, ["diff", "--ranks", ranks, *map(str, pair)])
        assert result.exit_code == 0, result.stderr
        assert max(map(len, result.stdout.splitlines())) <= WIDTH
        heads = [line for line in result.stdout.splitlines() if line.startswith(("A ", "B "))]
        assert heads and all(p.name in h for p, h in zip(pair, heads))
        assert not unit_splits(result.stdout) and not unit_splits(result.stderr)
