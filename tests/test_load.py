"""The trace model: units, origin, rank, steps by launch correlation."""

import polars as pl
import pytest
import synth

import tracekit
from tracekit.analyses.summary import summary


def lagging_gpu(tmp_path):
    """Step 1 [0,100) µs launches a kernel at 90 that runs 150–170 (inside step 2's window);
    step 2 [100,200) launches one at 110 that runs 175–180."""
    events = [synth.step(1, 0.0, 100.0), synth.step(2, 100.0, 100.0),
              *synth.launched("k_a", 90.0, 150.0, 20.0, corr=1),
              *synth.launched("k_b", 110.0, 175.0, 5.0, corr=2)]
    return synth.write(tmp_path, "rank0.trace.json", synth.doc(events))


def test_gpu_work_belongs_to_the_step_that_launched_it(tmp_path):
    trace = tracekit.load(lagging_gpu(tmp_path))
    by_step = dict(trace.gpu.select("name", "step").iter_rows())
    assert by_step == {"k_a": 1, "k_b": 2}
    rows = {r["step"]: r for r in summary(trace).to_dicts()}
    assert rows[1]["kernels"] == 1 and rows[2]["kernels"] == 1
    assert rows[1]["gpu_span_ns"] == 20_000 and rows[2]["gpu_span_ns"] == 5_000
    assert rows[1]["cpu_ns"] == 100_000


def test_times_are_integer_ns_from_the_floored_origin(tmp_path):
    events = [synth.step(1, 5148303008301.725, 10.5),
              *synth.launched("k", 5148303008302.001, 5148303008305.333, 0.667, corr=1)]
    trace = tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))
    assert trace.origin_us == 5148303008301
    k = trace.gpu.row(0, named=True)
    assert (k["start"], k["end"]) == (4_333, 5_000)
    assert trace.gpu.schema["start"] == pl.Int64


def test_two_streams_overlapping_union(tmp_path):
    events = [synth.step(1, 0.0, 100.0),
              *synth.launched("k1", 1.0, 10.0, 20.0, corr=1, stream=7),
              *synth.launched("k2", 2.0, 20.0, 20.0, corr=2, stream=8)]
    row = summary(tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))).row(0, named=True)
    assert row["gpu_span_ns"] == 30_000 and row["gpu_busy_ns"] == 30_000 and row["kernels"] == 2


def test_no_profiler_step_is_one_step_spanning_the_trace(tmp_path):
    events = [*synth.launched("k1", 1.0, 10.0, 5.0, corr=1), synth.kernel("orphan", 30.0, 2.0, corr=99)]
    trace = tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))
    assert trace.steps["step"].to_list() == [0]
    assert trace.gpu["step"].to_list() == [0, 0]


def test_rank_from_distributed_info_then_file_name_then_zero(tmp_path):
    events = [synth.step(1, 0.0, 10.0)]
    assert tracekit.load(synth.write(tmp_path, "rank5.json", synth.doc(events, rank=3))).rank == 3
    no_info = {"traceEvents": events}
    assert tracekit.load(synth.write(tmp_path, "worker_rank-7.pt.trace.json", no_info)).rank == 7
    t = tracekit.load(synth.write(tmp_path, "plain.json", no_info))
    assert t.rank == 0 and t.facts["rank_from"] == "default"


def test_run_directory_skips_non_trace_json_and_orders_ranks(tmp_path):
    for r in (1, 0):
        synth.write(tmp_path, f"rank{r}.trace.json.gz", synth.doc([synth.step(1, 0.0, 10.0)], rank=r))
    (tmp_path / "manifest.json").write_text('{"variant": "x"}')
    run = tracekit.load(tmp_path)
    assert [t.rank for t in run.traces] == [0, 1]
    assert run.facts["skipped"] == [str(tmp_path / "manifest.json")]


def test_several_files_of_one_rank_are_cycles_in_time_order(tmp_path):
    """Two traces of rank 0 that start at different times, the later one's steps numbered on
    from the earlier one's: the later is the last cycle."""
    for name, start, step in (("b.json", 0.0, 1), ("a.json", 500.0, 2)):
        synth.write(tmp_path, name, synth.doc([synth.step(step, start, 10.0)], rank=0))
    later, earlier = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    run = tracekit.load(tmp_path)
    assert [t.path for t in run.traces] == [later] and run.facts["cycles"] == {later: [earlier, later]}
    assert [t.path for t in tracekit.load(tmp_path, cycle="first").traces] == [earlier]
    assert [t.path for t in tracekit.load(tmp_path, cycle="2").traces] == [later]
    with pytest.raises(tracekit.TraceError, match="--cycle 3: there are 2 profiling cycle"):
        tracekit.load(tmp_path, cycle="3")


def test_cpu_only_trace_has_null_gpu_figures(tmp_path):
    events = [synth.step(1, 0.0, 50.0), synth.op("aten::mm", 1.0, 5.0)]
    row = summary(tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))).row(0, named=True)
    assert row["gpu_span_ns"] is None and row["gpu_busy_ns"] is None and row["kernels"] is None
    assert row["cpu_ns"] == 50_000
