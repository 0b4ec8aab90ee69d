"""Real traces that other people published (tests/data/wild, tests/data/external) and ours
(H200): every verb runs on each without a traceback, each file's own published figures are
reproduced, and every verb reports the same span, idle and exposed comm for every step."""

import csv
import json
from collections import defaultdict

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import DATA
from oracle import per_step
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PerfettoTrace
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

import tracekit
from tracekit.analyses.breakdown import breakdown
from tracekit.analyses.comms import collective_kernels
from tracekit.analyses.diff import diff_runs
from tracekit.analyses.overlap import overlap
from tracekit.analyses.summary import summary
from tracekit.front.cli import main

WILD = DATA / "wild"
TRACES = sorted([*WILD.rglob("*.json.gz"), *(DATA / "external").rglob("*.json.gz"),
                 *(DATA / "h200x2-small").glob("*/rank*.trace.json.gz")])


def ids(path):
    return "/".join(path.relative_to(DATA).parts[-2:])


def cli(*args):
    result = CliRunner().invoke(main, list(map(str, args)))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output[-3000:]
    return result


@pytest.mark.parametrize("path", TRACES, ids=ids)
def test_every_verb_runs(path, tmp_path):
    for verb in ("summary", "syncs", "comms", "overlap", "breakdown", "launches"):
        cli(verb, "--format", "json", path)
    cli("kernels", "--by", "op,name", "--format", "table", path)
    cli("lint", "--format", "table", path)
    cli("summary", "--scope", "trace", "--agg", "p90", "--format", "table", path)
    cli("overlap", "--scope", "hta", "--format", "json", path)
    cli("export", path, "-o", tmp_path / "t.pftrace")
    if tracekit.load(path).has_gpu:
        cli("diff", "--format", "json", path, path)


def tracelens_truth(path):
    rows = csv.DictReader(path.with_name(path.name.replace(".json.gz", ".gpu_timeline.csv")).open())
    return {row["type"]: float(row["time ms"]) * 1e6 for row in rows}  # ns


TRACELENS = sorted((WILD / "tracelens").rglob("*.json.gz"))


@pytest.mark.parametrize("path", TRACELENS, ids=ids)
def test_tracelens_span_and_busy(path):
    """TraceLens' gpu_timeline (its own regression reference, made without
    --include_unlinked_kernels): total_time is the whole-trace span of the launched device
    activities (`--scope launched`), busy_time their union. TraceLens works in float µs, so a
    few ns per activity of rounding are allowed."""
    truth = tracelens_truth(path)
    trace = tracekit.load(path)
    row = summary(trace, "launched").row(0, named=True)
    slack = trace.gpu.height
    assert abs(row["gpu_span_ns"] - truth["total_time"]) <= slack
    assert abs(row["gpu_busy_ns"] - truth["busy_time"]) <= slack
    assert truth["total_comm_time"] == row["comm_ns"] == 0


TENSORBOARD = json.loads((WILD / "tensorboard-plugin" / "published.json").read_text())


@pytest.mark.parametrize("run", sorted(TENSORBOARD))
def test_tensorboard_plugin_steps_and_kernel_counts(run):
    """The plugin's own result check (span 1 of each run: the first cycle): steps 5–10 and
    the kernel table's calls, in total and for its most called kernels."""
    truth = TENSORBOARD[run]
    (trace,) = tracekit.load(WILD / "tensorboard-plugin" / run, cycle=str(truth["span"])).traces
    assert trace.steps["step"].to_list() == truth["steps"]
    assert summary(trace, "trace")["kernels"][0] == truth["kernel_calls_total"]
    counts = dict(trace.gpu.filter(pl.col("kind") == "kernel").group_by("name").len().iter_rows())
    assert {name: counts[name] for name in truth["kernel_calls"]} == truth["kernel_calls"]


def test_hta_mtia_temporal_breakdown():
    """HTA's tests/test_trace_analysis.py::test_mtia_temporal_breakdown on this trace: compute
    7305596 µs of a 13328347 µs span (54.81 %). HTA drops the 137 DMA transfers that carry no
    stream and works in whole µs; both leave its idle 0.13 points above ours and its
    non-compute as much below (docs/metrics.md)."""
    trace = tracekit.load(WILD / "hta" / "mtia_rank_0.json.gz")
    (row,) = breakdown(trace, "trace").to_dicts()
    ns = defaultdict(int)
    for part in row["parts"]:
        ns[part["category"]] += part["ns"]
    pct = {k: v / row["span_ns"] * 100 for k, v in ns.items()}
    assert abs(pct["compute"] - 7305596 * 100 / 13328347) < 0.01
    assert abs(pct["idle"] - 5648827 * 100 / 13328347) < 0.2
    assert abs(pct["memcpy"] - 373924 * 100 / 13328347) < 0.2
    assert trace.gpu.filter(pl.col("name").str.starts_with("dma")).height == 22361


def exported(path, tmp_path):
    """Per (track kind, device, step) the summed slice time of a Perfetto export."""
    out = tmp_path / "t.pftrace"
    cli("export", path, "-o", out)
    packets = PerfettoTrace.FromString(out.read_bytes()).packet
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in packets if p.HasField("track_descriptor")}
    sums, open_at = defaultdict(int), {}
    for p in packets:
        if not p.HasField("track_event"):
            continue
        name = names.get(p.track_event.track_uuid, "")
        if not name.startswith("tracekit: ") or " · GPU " not in name:
            continue
        kind, device = name[len("tracekit: "):].split(" · GPU ")[0], int(name.split(" · GPU ")[1].split(" ")[0])
        if p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN:
            step = next(a.int_value for a in p.track_event.debug_annotations if a.name == "step")
            open_at[p.track_event.track_uuid] = (p.timestamp, step)
        elif p.track_event.type == TrackEvent.TYPE_SLICE_END:
            start, step = open_at.pop(p.track_event.track_uuid)
            sums[(kind, device, step)] += p.timestamp - start
    return sums


@pytest.mark.parametrize("path", TRACES, ids=ids)
def test_every_verb_reports_the_oracles_span_idle_and_exposed_comm(path, tmp_path):
    """Each verb's span, idle, overlap and exposed comm per step and device against a plain
    sweep over the step's device activities (tests/oracle.py: `per_step`): summary, overlap,
    breakdown, comms, the Perfetto export and diff's step time and comm items."""
    trace = tracekit.load(path)
    truth = per_step(trace)
    rows = summary(trace).filter(pl.col("device").is_not_null())
    assert set(truth) == {(r["step"], r["device"]) for r in rows.to_dicts()}
    if rows.height == 0:
        return
    key = ["step", "device"]
    lap = overlap(trace).select(*key, pl.col("exposed_comm_ns").alias("o_exposed"), "comm_alone_ns")
    split = breakdown(trace).explode("parts").unnest("parts").group_by(key).agg(
        b_span=pl.col("ns").sum(), b_idle=pl.col("ns").filter(pl.col("category") == "idle").sum(),
        b_exposed=pl.col("ns").filter(pl.col("category") == "comm").sum())
    comm = collective_kernels(trace).group_by(key).agg(c_exposed=pl.col("exposed_ns").sum())
    table = rows.join(lap, on=key).join(split, on=key).join(comm, on=key, how="left").with_columns(
        pl.col("c_exposed").fill_null(0))
    sums = exported(path, tmp_path)
    for r in table.to_dicts():
        s, d = r["step"], r["device"]
        want = truth[(s, d)]
        assert r["gpu_span_ns"] == r["b_span"] == sums[("GPU span", d, s)] == want["span"], r
        assert r["idle_ns"] == r["b_idle"] == sums[("idle", d, s)] == want["idle"], r
        assert want["exposed_comm"] == r["exposed_comm_ns"] == r["o_exposed"] == r["b_exposed"] == r["c_exposed"] \
            == sums[("exposed comm", d, s)]
        assert r["overlap_ns"] == sums[("overlapped comm", d, s)] == want["overlap"]
    diff = diff_runs([trace], [trace], "all").per_rank[0]
    spans = {}
    for (s, _), v in truth.items():
        if s is not None:
            spans[s] = spans.get(s, 0) + v["span"]
    assert diff.a_step_ns == (2 * sum(spans.values()) + len(spans)) // (2 * len(spans))  # the mean step, whole ns
    assert diff.a_items["ns"].sum() == spans[diff.a_step]  # the median step's activities
    exposed = diff.a_items.filter(pl.col("kind") == "comm")["ns"].sum()
    assert exposed == sum(v["exposed_comm"] for (s, _), v in truth.items() if s == diff.a_step)
