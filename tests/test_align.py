"""A recorded (`cupti`) step aligned with its `full` step, and its idle gaps named by the host
work between the launches around them there (analyses/align.py, docs/metrics.md "Recorded
steps named from the full step"). Answers worked out by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import synth
from click.testing import CliRunner
from test_cupti_capture import MS, T0, kernel, marker

import tracekit
from tracekit.analyses.align import aligned, matched_pairs
from tracekit.analyses.diff import all_items, step_items, step_times
from tracekit.analyses.naming import named
from tracekit.front.cli import main
from tracekit.runners.cupti_capture import kineto_trace

DATA = Path(__file__).parent / "data"


def recorded(tmp_path: Path, names=("k1", "k2", "k3"), late_ms: float = 0.0) -> Path:
    """One cupti step of one phase (marks at 0 and 20 ms): k1 runs 1–2 ms, k2 6–7 ms, k3
    7–8 ms on stream 7 (k2 and k3 `late_ms` later); the device idles 2–6 ms (+ `late_ms`)
    between k1 and k2."""
    records = [marker(10, 0.1), marker(20, 19.9), kernel(names[0], 11, 1.0, 2.0),
               kernel(names[1], 12, 6.0 + late_ms, 7.0 + late_ms), kernel(names[2], 13, 7.0 + late_ms, 8.0 + late_ms)]
    steps = [(1, [(None, T0), ("forward", T0 + 20 * MS)])]
    path = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(kineto_trace(records, [steps], pid=1, tid=1, base_ns=T0 // 10**9 * 10**9), f)
    return path


def full(tmp_path: Path, region: tuple[str, float] | None = None) -> Path:
    """The full step (µs; 0–200): aten::mm 5–8 launches k1 (call 6–7); the annotation
    `FSDP::pre_forward (blocks.1)` 10–50 runs aten::copy_ 12–30 (no launch); nothing 50–60;
    aten::add 60–65 launches k2 (call 61–62), aten::relu 66–69 launches k3 (call 67–68).
    `region` (name, µs): an annotation of that length at 50, what follows it that much later."""
    name, late = region or (None, 0.0)
    events = [synth.step(1, 0.0, 200.0), synth.op("aten::mm", 5.0, 3.0, **{"External id": 1}),
              synth.op("FSDP::pre_forward (blocks.1)", 10.0, 40.0, cat="user_annotation"),
              synth.op("aten::copy_", 12.0, 18.0), synth.op("aten::add", 60.0 + late, 5.0, **{"External id": 2}),
              synth.op("aten::relu", 66.0 + late, 3.0, **{"External id": 3})]
    events += [synth.op(name, 50.0, late, cat="user_annotation")] if name else []
    for corr, (at, kernel_name) in enumerate(((6.0, "k1"), (61.0 + late, "k2"), (67.0 + late, "k3")), 1):
        events += synth.launched(kernel_name, at, 170.0 + 10 * corr, 5.0, corr=corr)
    (tmp_path / "names").mkdir(exist_ok=True)
    return synth.write(tmp_path / "names", "rank0.pt.trace.json.gz", synth.doc(events, world_size=1))


def test_differing_sequences_keep_what_matches_in_order():
    assert matched_pairs(["a", "b", "c"], ["a", "b", "c"]) == [(0, 0), (1, 1), (2, 2)]
    # an autotuning kernel in the recorded step only, and one of the full step missing
    assert matched_pairs(["a", "tune", "b", "c", "d"], ["a", "b", "x", "c", "d"]) == [(0, 0), (2, 1), (3, 3), (4, 4)]


def test_the_idle_gap_is_split_among_the_host_work_between_the_launches(tmp_path):
    """The gap k1 → k2 (4 ms recorded) is the full step's main thread from k1's call end (7 µs)
    to k2's call start (61 µs), 54 µs: aten::mm 1, FSDP::pre_forward's own time 2 + 20 = 22,
    aten::copy_ in it 18, aten::add before its call 1, no op 2 + 10 = 12 (`before aten::add`).
    4 ms × each / 54, floors 74074, 1629629, 1333333, 74074, 888888 (3,999,998 ns): the two ns
    left go to the largest remainders, 888888.9 and 1629629.6."""
    trace = tracekit.load(recorded(tmp_path))
    assert named(trace, tracekit.load(full(tmp_path))) == (3, 3)
    items = step_items(trace, 1).filter(pl.col("kind") == "idle")
    gap = items.filter(pl.col("name").is_in(["host: aten::mm", "host: FSDP::pre_forward", "host: aten::add",
                                             "host: aten::copy_ in FSDP::pre_forward", "host: before aten::add"]))
    got = {(n, o, u): ns for n, o, u, ns in gap.group_by("name", "op", "unit").agg(pl.col("ns").sum()).iter_rows()}
    assert got == {("host: aten::mm", "aten::mm", None): 74074,
                   ("host: FSDP::pre_forward", None, "blocks.1"): 1629630,
                   ("host: aten::copy_ in FSDP::pre_forward", "aten::copy_", "blocks.1"): 1333333,
                   ("host: aten::add", "aten::add", None): 74074,
                   ("host: before aten::add", "aten::add", None): 888889}
    assert not items["name"].str.contains("tracekit#").any()  # no idle time left to the phase mark
    # an FSDP annotation is the idle part's FSDP label too (`diff --by fsdp`)
    assert set(items.filter(pl.col("unit") == "blocks.1")["fsdp"]) == {"FSDP::pre_forward"}
    assert items.filter(pl.col("unit").is_null())["fsdp"].null_count() == items.filter(pl.col("unit").is_null()).height
    # the step's items still sum to its time exactly: its device span, 1 to 8 ms
    assert step_items(trace, 1)["ns"].sum() == step_times(trace)[1] == 7 * MS


def test_a_gap_next_to_an_unaligned_activity_keeps_its_phase(tmp_path):
    """The recorded step ran kX where the full one ran k2: k1 and k3 align, kX does not, so
    the gap before it cannot be told and keeps the phase mark as its cause."""
    trace = tracekit.load(recorded(tmp_path, ("k1", "kX", "k3")))
    other = tracekit.load(full(tmp_path))
    pairs = aligned(trace, other).join(trace.gpu.with_row_index("row").select("row", "name"), on="row")
    assert pairs.sort("row").select("name", pl.col("full_row").is_not_null()).rows() == \
        [("k1", True), ("kX", False), ("k3", True)]
    assert named(trace, other) == (2, 3)
    idle = all_items(trace).filter(pl.col("kind") == "idle")
    assert idle.filter(pl.col("ns") == 4 * MS)["name"].to_list() == ["cpu_op: tracekit#forward"]


def test_diff_of_the_real_cupti_run_names_host_causes_not_phases():
    """tests/data/h200x1-cupti (H200, fsdp1 vs fsdp2, cupti with names/): of the ten largest
    idle items none is a phase mark, each carries its launching op or annotation (`host: …`),
    and the items sum exactly to the step Δ."""
    result = CliRunner().invoke(main, ["diff", "--format", "json", "--top", "100000", str(DATA / "h200x1-cupti"),
                                       "fsdp1", "fsdp2"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    items = answer["items"]
    idle = sorted((i for i in items if i["kind"] == "idle"), key=lambda i: -abs(i["delta_ns"]))[:10]
    assert len(idle) == 10
    assert all(i["name"].startswith("host: ") and "tracekit#" not in i["name"] for i in idle), idle
    assert sum(i["delta_ns"] for i in items) == answer["b_step_ns"] - answer["a_step_ns"]


def test_the_critical_path_names_the_stream_gap_alike(tmp_path):
    """critical-path of the same pair: the 4 ms stream gap k1 → k2, `stream gap, launch not
    recorded` unnamed, is the same five host names with the same ns."""
    from tracekit.analyses.critical_path import critical_path

    trace = tracekit.load(recorded(tmp_path))
    named(trace, tracekit.load(full(tmp_path)))
    waits = {i["name"]: i["ns"] for i in critical_path(trace, top=None)["items"][0] if i["category"] == "waiting"}
    assert waits == {"host: aten::mm": 74074, "host: FSDP::pre_forward": 1629630, "host: aten::add": 74074,
                     "host: aten::copy_ in FSDP::pre_forward": 1333333, "host: before aten::add": 888889}
