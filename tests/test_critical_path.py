"""The critical path: synthetic steps whose paths are known by construction, a brute-force
longest path on random DAGs, and the edges HTA's own tests assert on its critical-path
traces (facebookresearch/HolisticTraceAnalysis, tests/test_critical_path_analysis.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synth
import tracekit
from tracekit.analyses.critical_path import (collective_arrivals, critical_path, dependency_graph,
                                             longest_path, path_edges)

DATA = Path(__file__).parent / "data"
HTA = Path("/work/shared/external/hta-tests-data/critical_path")
if not HTA.is_dir():
    HTA = Path(__file__).parent / "data" / "external" / "hta-tests-data" / "critical_path"


def parts(trace, arrivals=None) -> dict:
    row = critical_path(trace, arrivals).row(0, named=True)
    split = {c: row[f"{c}_ns"] for c in ("host", "runtime", "compute", "comm", "copy", "waiting")}
    assert sum(split.values()) == row["span_ns"]  # the path's time adds up to the span
    assert row["path_ns"] == row["span_ns"] - split["waiting"]
    return {**split, "span": row["span_ns"]}


def sync_mark(kind, ts, corr, stream=-1, wait_on_stream=-1, record=-1):
    return {"ph": "X", "cat": "cuda_sync", "name": kind, "pid": 0, "tid": stream, "ts": ts, "dur": 0,
            "args": {"cuda_sync_kind": kind, "wait_on_stream": wait_on_stream,
                     "wait_on_cuda_event_record_corr_id": record, "stream": stream, "correlation": corr,
                     "device": 0}}


def loaded(tmp_path, events, name="t.json", rank=0):
    return tracekit.load(synth.write(tmp_path, name, synth.doc(events, rank=rank)))


def test_host_bound_chain_is_all_host(tmp_path):
    """The host never waits: the path is the thread (98 µs of ops, 2 µs of launch calls);
    the kernels hang off it."""
    events = [synth.step(1, 0.0, 100.0), synth.op("aten::a", 0.0, 40.0), synth.op("aten::b", 40.0, 50.0),
              *synth.launched("k1", 38.0, 45.0, 2.0, corr=1), *synth.launched("k2", 88.0, 92.0, 2.0, corr=2)]
    assert parts(loaded(tmp_path, events)) == {"host": 98_000, "runtime": 2_000, "compute": 0, "comm": 0,
                                               "copy": 0, "waiting": 0, "span": 100_000}


def test_gpu_bound_chain_runs_through_the_kernels(tmp_path):
    """Three 30 µs kernels queued back to back, the host blocked in cudaDeviceSynchronize:
    host 0–1, launch latency 1–10, kernels 10–100, sync return 100–101, host 101–102."""
    events = [synth.step(1, 0.0, 102.0), *synth.launched("k1", 1.0, 10.0, 30.0, corr=1),
              *synth.launched("k2", 3.0, 40.0, 30.0, corr=2), *synth.launched("k3", 5.0, 70.0, 30.0, corr=3),
              synth.call("cudaDeviceSynchronize", 7.0, 94.0, corr=4)]
    assert parts(loaded(tmp_path, events)) == {"host": 2_000, "runtime": 0, "compute": 90_000, "comm": 0,
                                               "copy": 0, "waiting": 10_000, "span": 102_000}


def cross_stream(tmp_path):
    """k1 (stream 7) → event → k2 (stream 8, made to wait for it); k4 is launched on stream 7
    after the record and must not be the waited-on kernel."""
    events = [synth.step(1, 0.0, 170.0), *synth.launched("k1", 1.0, 10.0, 100.0, corr=1),
              synth.call("cudaEventRecord", 3.0, 1.0, corr=2), synth.call("cudaStreamWaitEvent", 5.0, 1.0, corr=3),
              sync_mark("Stream Wait Event", 5.0, 3, stream=8, wait_on_stream=7, record=2),
              *synth.launched("k2", 7.0, 110.0, 50.0, corr=4, stream=8),
              *synth.launched("k4", 9.0, 111.0, 4.0, corr=5),
              synth.call("cudaDeviceSynchronize", 12.0, 150.0, corr=6)]
    return loaded(tmp_path, events)


def named_edges(trace, step, kind):
    nodes, edges = dependency_graph(trace, step)
    names = nodes.select("node", "name", "end")
    return (edges.filter(pl.col("kind") == kind)
            .join(names.rename({"node": "u", "name": "from", "end": "from_end"}), on="u")
            .join(names.rename({"node": "v", "name": "to", "end": "to_end"}), on="v"))


def test_cross_stream_wait_links_the_recorded_kernel(tmp_path):
    trace = cross_stream(tmp_path)
    waits = named_edges(trace, 1, "event wait")
    assert waits.select("from", "from_end", "to", "to_end").rows() == [("k1", True, "k2", False)]
    # host 0–1, launch latency 1–10, k1 10–110, k2 110–160, sync return 160–162, host 162–170
    assert parts(trace) == {"host": 9_000, "runtime": 0, "compute": 150_000, "comm": 0, "copy": 0,
                            "waiting": 11_000, "span": 170_000}
    assert "event wait" in path_edges(trace)["kind"].to_list()


def test_event_sync_waits_for_the_recorded_kernel_not_a_later_one(tmp_path):
    """cudaEventSynchronize on an event recorded after k1: the host resumes when k1 ends,
    though k4 (launched after the record, on the same stream) ends inside the call too."""
    events = [synth.step(1, 0.0, 150.0), *synth.launched("k1", 1.0, 10.0, 50.0, corr=1),
              synth.call("cudaEventRecord", 3.0, 1.0, corr=2), *synth.launched("k4", 5.0, 60.0, 40.0, corr=3),
              synth.call("cudaEventSynchronize", 7.0, 96.0, corr=5),
              sync_mark("Event Sync", 7.0, 5, wait_on_stream=7, record=2),
              synth.op("aten::after", 103.0, 44.0)]
    trace = loaded(tmp_path, events)
    syncs = named_edges(trace, 1, "sync")
    assert syncs.select("from", "to").rows() == [("k1", "cudaEventSynchronize")]
    # host 0–1, latency 1–10, k1 10–60, sync 60–103 waiting, aten::after 103–147, step 147–150
    assert parts(trace) == {"host": 48_000, "runtime": 0, "compute": 50_000, "comm": 0, "copy": 0,
                            "waiting": 52_000, "span": 150_000}


def two_ranks(tmp_path, rank0: list, rank1: list):
    """The run of two synthetic ranks' events (world size 2), written to `tmp_path/run`."""
    (tmp_path / "run").mkdir()
    synth.write(tmp_path / "run", "rank0.json", synth.doc(rank0, rank=0))
    synth.write(tmp_path / "run", "rank1.json", synth.doc(rank1, rank=1))
    return tracekit.load(tmp_path / "run")


def test_late_rank_makes_the_collective_wait(tmp_path):
    """Rank 1 computes 5–60 µs before joining the all-reduce that rank 0 entered at 10 µs:
    on rank 0 the kernel's first 50 µs are waiting for rank 1, its last 40 µs comm."""
    blocked = synth.call("cudaDeviceSynchronize", 5.0, 190.0, corr=9)
    rank0 = [synth.step(1, 0.0, 200.0), *synth.nccl("all_reduce", 1.0, 10.0, 90.0, corr=1), blocked]
    rank1 = [synth.step(1, 0.0, 200.0), *synth.launched("work", 1.0, 5.0, 55.0, corr=1),
             *synth.nccl("all_reduce", 3.0, 60.0, 40.0, corr=2), blocked]
    run = two_ranks(tmp_path, rank0, rank1)
    arrivals = collective_arrivals(run.traces)
    alone = parts(run.traces[0])
    assert alone["comm"] == 90_000
    joined = parts(run.traces[0], arrivals[0])
    assert joined["comm"] == 40_000
    items = critical_path(run.traces[0], arrivals[0]).row(0, named=True)["items"]
    late = [i for i in items if i["kind"] == "collective arrival"]
    assert [(i["category"], i["ns"]) for i in late] == [("waiting", 50_000)]
    assert late[0]["name"].endswith("(rank 1 late)")
    assert arrivals[1].height == 0  # rank 1 arrived last: nothing of its kernel is waiting


def brute_force(times, edges, source, sink) -> int | None:
    """The heaviest source → sink path by enumerating every simple path (small graphs)."""
    best = None
    out: dict[int, list] = {}
    for u, v, w in edges:
        out.setdefault(u, []).append((v, w))
    stack = [(source, 0, {source})]
    while stack:
        node, weight, seen = stack.pop()
        if node == sink:
            best = weight if best is None else max(best, weight)
        for v, w in out.get(node, []):
            if v not in seen:
                stack.append((v, weight + w, seen | {v}))
    return best


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_longest_path_matches_brute_force(data):
    """Random graphs whose edges go forward in time, with Δt = 0 cycles where times tie
    (node times drawn from a few values, so many tie)."""
    n = data.draw(st.integers(2, 8))
    span = data.draw(st.sampled_from([3, 50]))
    times = np.array(sorted(data.draw(st.lists(st.integers(0, span), min_size=n, max_size=n))), np.int64)
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20))
    edges = []
    for a, b in pairs:
        u, v = (a, b) if times[a] == times[b] else (min(a, b), max(a, b))
        if u == v:
            continue
        w = data.draw(st.integers(0, int(times[v] - times[u])))  # no heavier than its Δt
        edges.append((u, v, w))
    expected = brute_force(times, edges, 0, n - 1)
    best = {}
    for a, b, c in edges:
        best[(a, b)] = max(best.get((a, b), 0), c)
    # as drawn, and by tail, which puts chains of edges one after another (as in host lanes)
    for listed in (edges, sorted(edges)):
        u, v, w = (np.array(c, np.int64) for c in zip(*listed)) if listed else (np.zeros(0, np.int64),) * 3
        nodes, weight = longest_path(times, u, v, w, 0, n - 1)
        if expected is None:
            assert nodes == []
            continue
        assert weight == expected
        assert nodes[0] == 0 and nodes[-1] == n - 1
        assert sum(best[(a, b)] for a, b in zip(nodes, nodes[1:])) == expected


# HTA's tests, on the same traces (what each asserts, in our graph; docs/metrics.md says why
# weights and node counts differ).
def hta(name: str):
    folder = HTA / name
    if not folder.is_dir():
        pytest.skip(f"HTA test data not here: {folder}")
    return tracekit.load(next(folder.glob("*.json.gz")))


def test_hta_event_sync_edges():
    """test_critical_path_analysis_event_sync: the spin kernel's end → the end of
    cudaEventSynchronize and of cudaDeviceSynchronize (SYNC_DEPENDENCY, weight 0)."""
    trace = hta("cuda_event_sync")
    syncs = named_edges(trace, 100, "sync").filter(pl.col("from").str.contains("spin_kernel"))
    assert sorted(syncs["to"].to_list()) == ["cudaDeviceSynchronize", "cudaEventSynchronize"]
    assert syncs["from_end"].all() and syncs["to_end"].all() and not syncs["work"].any()


def test_hta_multi_stream_event_record_points_at_stream_20():
    """test_critical_path_analysis_event_sync_multistream: the event recorded by correlation
    1385 on stream 20 syncs back to kernel 1 (correlation 27, stream 20), not kernel 2
    (stream 28); the edge runs from its end to the Memset on stream 24."""
    trace = hta("cuda_event_sync_multi_stream")
    nodes, edges = dependency_graph(trace, 0)
    waits = (edges.filter(pl.col("kind") == "event wait")
             .join(nodes.select(u="node", u_corr="correlation", u_name="name", u_end="end"), on="u")
             .join(nodes.select(v="node", v_corr="correlation", v_name="name", v_end="end"), on="v"))
    assert waits.select("u_corr", "u_name", "u_end", "v_corr", "v_name", "v_end").rows() == [
        (27, "ampere_sgemm_128x64_nn", True, 1411, "Memset (Device)", False)]
    assert not waits["work"].any()


def test_hta_alexnet_gpu_gpu_sync_edge():
    """test_critical_path_analysis (AlexNet part): a sync edge from fft2d_c2r_32x32
    (correlation 5606, stream 20) to the elementwise kernel of correlation 5629 (stream 7);
    and, as HTA checks on its simple_add trace, the epilogue kernel's end → the end of the
    cudaDeviceSynchronize after it."""
    trace = hta("alexnet")
    nodes, edges = dependency_graph(trace, 0)
    named = (edges.join(nodes.select(u="node", u_corr="correlation", u_name="name", u_end="end"), on="u")
             .join(nodes.select(v="node", v_corr="correlation", v_name="name", v_end="end"), on="v"))
    fft = named.filter((pl.col("u_corr") == 5606) & (pl.col("v_corr") == 5629))
    assert fft.select("kind", "work", "u_end", "v_end").rows() == [("event wait", False, True, False)]
    assert fft["u_name"][0].startswith("void fft2d_c2r_32x32<float, false, false, 0u, false, false>")
    epilogue = named.filter((pl.col("u_corr") == 5889) & (pl.col("v_corr") == 5894))
    assert epilogue.select("kind", "work", "u_end", "v_end").rows() == [("sync", False, True, True)]
    assert epilogue["u_name"][0].startswith("void epilogue::impl::globalKernel")


def test_diff_of_the_h200_fsdp_runs_marks_critical_items():
    """Acceptance: `diff` of the committed H200 FSDP1/FSDP2 runs says, per item, on which side's
    critical path it lies; an item marked for a side has device time on that side's path."""
    import json

    from click.testing import CliRunner

    from tracekit.front.cli import main

    run = Path(__file__).parent / "data" / "h200x2-blocks4"
    result = CliRunner().invoke(main, ["diff", "--format", "json", "--top", "200", str(run / "fsdp1"), str(run / "fsdp2")])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    marks = {i["critical"] for i in items}
    assert marks <= {"", "A", "B", "both"} and marks & {"A", "B", "both"}
    for i in items:
        assert (i["a_cp_ns"] > 0) == (i["critical"] in ("A", "both"))
        assert (i["b_cp_ns"] > 0) == (i["critical"] in ("B", "both"))
        assert i["a_cp_ns"] <= i["a_busy_ns"] and i["b_cp_ns"] <= i["b_busy_ns"]


def test_device_only_capture_tells_no_host_time(tmp_path):
    """No runtime call recorded (kernels and an annotation only): the path runs through the
    device work over the device span (20–100 µs: two kernels and the 30 µs gap between
    them), no time taken for host work."""
    events = [synth.step(1, 0.0, 200.0), synth.op("tracekit#forward", 5.0, 150.0, cat="user_annotation"),
              synth.kernel("k1", 20.0, 30.0, None), synth.kernel("k2", 80.0, 20.0, None)]
    for e in events[2:]:
        del e["args"]["correlation"]
    assert parts(loaded(tmp_path, events)) == {"host": 0, "runtime": 0, "compute": 50_000, "comm": 0, "copy": 0,
                                               "waiting": 30_000, "span": 80_000}


def test_lean_capture_names_unrecorded_host_time():
    """A `lean` recording (runtime calls, phase annotations, no CPU ops): the annotations' self
    time is host work of kind `ops not recorded`."""
    trace = tracekit.load(Path(__file__).parent / "data" / "h200x2-lean" / "fsdp2" / "rank0.pt.trace.json.gz")
    assert trace.calls.height > 0 and not (trace.ops["cat"] == "cpu_op").any()
    row = critical_path(trace, top=None).row(0, named=True)
    kinds = {i["kind"] for i in row["items"] if i["category"] == "host"}
    assert kinds == {"ops not recorded"}
    assert row["runtime_ns"] > 0


def test_hta_simple_add_edges():
    """test_critical_path_basic_add, on its simple_add trace (tests/data/external/hta-simple-add):
    aten::relu_ ⊃ aten::clamp_min_ ⊃ cudaLaunchKernel (correlation 5543) gives five host-order
    edges of 15, 14, 17, 15 and 32 µs, the first and last the self time of relu_, the second
    and fourth of clamp_min_, the third the launch call's; the fft kernel (correlation 5597)
    starts 27 µs after its launch call starts and ends 7 µs before the next kernel on its
    stream (5604) starts; 5604's launch call → its start is an edge (HTA weighs it 0, the
    kernel having been queued; here every launch edge weighs 0 and spans its Δt, 17 µs); the
    epilogue kernel (5889) ends → cudaDeviceSynchronize (5894) ends (a sync edge, weight 0).
    HTA's path (315 nodes, 159 events) is over one annotation's instance, ours over the step,
    so the path's size is not compared."""
    trace = tracekit.load(Path(__file__).parent / "data" / "external" / "hta-simple-add"
                          / "benchmark_result_493459_1694039959_trace.json.gz")
    nodes, edges = dependency_graph(trace, trace.steps["step"][0])
    ends = nodes.select("node", "name", "correlation", "end")
    named = (edges.join(ends.rename({"node": "u", "name": "u_name", "correlation": "u_corr", "end": "u_end"}), on="u")
             .join(ends.rename({"node": "v", "name": "v_name", "correlation": "v_corr", "end": "v_end"}), on="v"))
    lane = named.filter(pl.col("kind") == "self")

    def host_edge(**where):
        found = lane.filter(*[pl.col(k) == x for k, x in where.items()])
        assert found.height == 1, where
        return found.row(0, named=True)

    e3 = host_edge(u_corr=5543, u_end=False, v_corr=5543, v_end=True)
    e2 = host_edge(v=e3["u"])
    e1 = host_edge(v=e2["u"])
    e4 = host_edge(u=e3["v"])
    e5 = host_edge(u=e4["v"])
    assert [(e["name"], e["category"], e["ns"]) for e in (e1, e2, e3, e4, e5)] == [
        ("aten::relu_", "host", 15_000), ("aten::clamp_min_", "host", 14_000), ("cudaLaunchKernel", "runtime", 17_000),
        ("aten::clamp_min_", "host", 15_000), ("aten::relu_", "host", 32_000)]
    assert all(e["work"] for e in (e1, e2, e3, e4, e5))
    assert (e1["u_name"], e5["v_name"]) == ("aten::relu_", "aten::relu_")

    def edge(kind, u_corr, u_end, v_corr, v_end):
        found = named.filter((pl.col("kind") == kind) & (pl.col("u_corr") == u_corr) & (pl.col("u_end") == u_end)
                             & (pl.col("v_corr") == v_corr) & (pl.col("v_end") == v_end))
        assert found.height == 1, (kind, u_corr, v_corr)
        return found.row(0, named=True)

    fft_launch = edge("launch", 5597, False, 5597, False)
    assert fft_launch["v_name"].startswith("void fft2d_r2c_32x32") and fft_launch["ns"] == 27_000
    assert edge("stream order", 5597, True, 5604, False)["ns"] == 7_000
    queued = edge("launch", 5604, False, 5604, False)
    assert (queued["v_name"], queued["work"], queued["ns"]) == ("ampere_gcgemm_64x64_nt", False, 17_000)
    sync = edge("sync", 5889, True, 5894, True)
    assert sync["u_name"].startswith("void epilogue::impl::globalKernel") and sync["v_name"] == "cudaDeviceSynchronize"
    assert not sync["work"]


def test_agg_mean_is_of_every_step_by_item_name_sorted_and_top_items():
    """`--agg mean --top 3` on the TensorBoard plugin's ResNet-50 steps: the statistic row has
    the 3 items of largest mean time over the steps (a step without an item counting 0),
    largest first, each step's own `ProfilerStep#N` annotation one item; the items' means
    computed here from every step's whole list."""
    import json
    import re
    from collections import defaultdict

    from click.testing import CliRunner

    from tracekit.front.cli import main

    path = Path(__file__).parent / "data" / "wild" / "tensorboard-plugin" / "resnet50_num_workers_0"

    def doc(*args):
        result = CliRunner().invoke(main, ["critical-path", "--format", "json", *args, str(path)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["traces"][0]["steps"]

    steps = [s for s in doc("--top", "100000") if s["step"] is not None]
    assert len(steps) > 2
    totals = defaultdict(int)
    for s in steps:
        for item in s["items"]:
            totals[item["category"], item["kind"], re.sub(r"^ProfilerStep#\d+$", "ProfilerStep", item["name"])] \
                += item["ns"]
    means = sorted(((round(ns / len(steps)), key) for key, ns in totals.items()), reverse=True)
    row = next(s for s in doc("--agg", "mean", "--top", "3") if s.get("agg") == "mean")
    assert [(i["category"], i["kind"], i["name"]) for i in row["items"]] == [k for _, k in means[:3]]
    assert [i["ns"] for i in row["items"]] == [ns for ns, _ in means[:3]]
    every = next(s for s in doc("--agg", "mean", "--top", "100000") if s.get("agg") == "mean")["items"]
    assert [i["ns"] for i in every] == sorted((i["ns"] for i in every), reverse=True)
    assert not [i for s in [*steps, {"items": every}] for i in s["items"] if re.match(r"ProfilerStep#\d", i["name"])]
    assert "ProfilerStep" in {i["name"] for i in every}


def test_main_thread_resumes_after_the_autograd_thread_hands_off(tmp_path):
    """The main thread waits in backward (1–49 µs) while the autograd thread runs aten::mm
    (2–48), then issues the optimizer (52–92) whose kernel the GPU waits for: the host was the
    bottleneck. The path forks into the autograd thread (thread order, 1–2), comes back when
    it hands off (48–49) and runs on through the optimizer: 2 µs waiting, not the 48 µs the
    path reported when it could not return to the main thread (issue 65 item 1;
    ../shared/repro/critical-path-handoff)."""
    events = [synth.step(1, 0.0, 100.0),
              synth.op("autograd::engine::evaluate_function: MmBackward0", 1.0, 48.0, cat="user_annotation"),
              synth.op("aten::mm", 2.0, 46.0, tid=2), synth.call("cudaLaunchKernel", 3.0, 2.0, corr=11, tid=2),
              synth.op("aten::_foreach_add_", 52.0, 40.0), synth.call("cudaLaunchKernel", 90.0, 2.0, corr=12),
              synth.kernel("bwd_kernel", 6.0, 10.0, corr=11), synth.kernel("opt_kernel", 93.0, 5.0, corr=12)]
    trace = loaded(tmp_path, events)
    assert parts(trace) == {"host": 94_000, "runtime": 4_000, "compute": 0, "comm": 0, "copy": 0, "waiting": 2_000,
                            "span": 100_000}
    edges = path_edges(trace).filter(pl.col("category") == "waiting")
    assert edges.filter(pl.col("kind") == "hand-off").select("start", "end").rows() == [(48_000, 49_000)]


def test_fsdp2_path_reaches_the_optimizer_after_backward():
    """h200x2-small fsdp2 rank 0: backward runs on the autograd thread, then the main thread
    issues AdamW's `_foreach_*` ops to the GPU. The path returns to the main thread through one
    hand-off and spends the optimizer's host time, which it could not reach before (the GPU's
    `stream order` waits stood in for it)."""
    trace = tracekit.load(DATA / "h200x2-small" / "fsdp2" / "rank0.trace.json.gz")
    edges = path_edges(trace)
    assert edges.filter(pl.col("kind") == "hand-off").height == 1
    foreach = edges.filter(pl.col("name").str.starts_with("aten::_foreach_") & (pl.col("category") == "host"))
    assert foreach["ns"].sum() > 1_000_000


def test_stream_wait_without_a_record_id_infers_the_work_that_held_it(tmp_path):
    """A `Stream Wait Event` record without `wait_on_cuda_event_record_corr_id` (as on every
    trace tracekit records): k2 (stream 8) waits for k1 (stream 7, ends at 110). Of the
    activities on other streams launched before the wait, k1 ends last before k2 starts; k3
    ends earlier, k4 is launched after the wait. So k1 → k2 is `event wait (inferred)`, and the
    path is the recorded-id case's: host 0–1, latency 1–10, k1 10–110, k2 110–160, sync return
    160–162, host 162–170 (issue 65 item 2)."""
    events = [synth.step(1, 0.0, 170.0), *synth.launched("k1", 1.0, 10.0, 100.0, corr=1),
              *synth.launched("k3", 2.0, 12.0, 8.0, corr=2, stream=9),
              synth.call("cudaEventRecord", 3.0, 1.0, corr=3), synth.call("cudaStreamWaitEvent", 5.0, 1.0, corr=4),
              sync_mark("Stream Wait Event", 5.0, 4, stream=8),
              *synth.launched("k2", 7.0, 110.0, 50.0, corr=5, stream=8),
              *synth.launched("k4", 9.0, 111.0, 4.0, corr=6),
              synth.call("cudaDeviceSynchronize", 12.0, 150.0, corr=7)]
    trace = loaded(tmp_path, events)
    waits = named_edges(trace, 1, "event wait (inferred)")
    assert waits.select("from", "from_end", "to", "to_end").rows() == [("k1", True, "k2", False)]
    assert parts(trace) == {"host": 9_000, "runtime": 0, "compute": 150_000, "comm": 0, "copy": 0,
                            "waiting": 11_000, "span": 170_000}


def test_fsdp1_compute_waits_on_nccl_without_record_ids():
    """h200x2-small fsdp1 rank 1: no `Stream Wait Event` carries a record id, yet compute
    waits on NCCL's streams: some NCCL kernel's end leads to the start of an activity on
    another stream (there was no such edge before: the waits were `stream order`)."""
    trace = tracekit.load(DATA / "h200x2-small" / "fsdp1" / "rank1.trace.json.gz")
    assert trace.marks.filter(pl.col("sync_kind") == "Stream Wait Event")["wait_on_record"].max() < 0
    nodes, edges = dependency_graph(trace, trace.steps["step"][0])
    names = nodes.select("node", "name")
    waits = (edges.filter(pl.col("kind") == "event wait (inferred)")
             .join(names.rename({"node": "u", "name": "from"}), on="u"))
    assert waits.filter(pl.col("from").str.starts_with("nccl")).height > 0


def test_lint_says_when_event_waits_carry_no_record_id():
    """`event_ids_missing`: h200x2-small fsdp1 rank 1 holds 256 `Stream Wait Event` and 2,054
    `Event Sync` records (counted in its JSON), every one with record id -1; of HTA's
    multi-stream trace's four, only its first `Event Sync` lacks one (the JSON: -1)."""
    from tracekit.analyses.lint import trace_findings

    found = trace_findings(tracekit.load(DATA / "h200x2-small" / "fsdp1" / "rank1.trace.json.gz"))
    assert found.filter(pl.col("kind") == "event_ids_missing").select("severity", "count").rows() == [("info", 2310)]
    trace = hta("cuda_event_sync_multi_stream")
    found = trace_findings(trace).filter(pl.col("kind") == "event_ids_missing")
    assert found.select("count").rows() == [(1,)] and found["detail"][0].startswith("1 of 4 ")


def test_event_sync_without_a_record_id_waits_on_the_event_s_stream(tmp_path):
    """An `Event Sync` record that names the event's stream (7) but not its record: the host
    resumes after k1, the last activity launched on stream 7 before the call, though k5 on
    stream 8 ends later inside the call (the latest-ending activity on any stream, which
    `sync (inferred)` took; issue 65 item 3). Host 0–1, latency 1–10, k1 10–60, sync 60–103
    waiting, aten::after 103–147, step 147–150."""
    events = [synth.step(1, 0.0, 150.0), *synth.launched("k1", 1.0, 10.0, 50.0, corr=1),
              *synth.launched("k5", 3.0, 85.0, 5.0, corr=2, stream=8),
              synth.call("cudaEventSynchronize", 7.0, 96.0, corr=5),
              sync_mark("Event Sync", 7.0, 5, wait_on_stream=7),
              synth.op("aten::after", 103.0, 44.0)]
    trace = loaded(tmp_path, events)
    assert named_edges(trace, 1, "sync").select("from", "to").rows() == [("k1", "cudaEventSynchronize")]
    assert named_edges(trace, 1, "sync (inferred)").height == 0
    assert parts(trace) == {"host": 48_000, "runtime": 0, "compute": 50_000, "comm": 0, "copy": 0,
                            "waiting": 52_000, "span": 150_000}


def test_a_step_waiting_on_the_previous_step_s_gpu_work_is_carried_over():
    """h200x2-lean fsdp2 rank 1: step 2 opens with a `cudaStreamSynchronize` on stream 7 that
    lasts 16 ms, because step 1's optimizer kernels still run there (the last ends inside the
    call). That wait is `carried-over work` named for step 1's last kernel on the stream, not
    `blocked: cudaStreamSynchronize` (issue 65 item 4)."""
    trace = tracekit.load(DATA / "h200x2-lean" / "fsdp2" / "rank1.pt.trace.json.gz")
    call = trace.calls.filter((pl.col("name") == "cudaStreamSynchronize") & (pl.col("step") == 2)).sort("start").row(
        0, named=True)
    previous = trace.gpu.filter((pl.col("step") == 1) & (pl.col("stream") == 7)).sort("end").row(-1, named=True)
    assert call["start"] < previous["end"] < call["end"]
    items = critical_path(trace, top=None).filter(pl.col("step") == 2)["items"][0]
    carried = [i for i in items if i["kind"] == "carried-over work"]
    assert carried == [{"category": "waiting", "kind": "carried-over work",
                        "name": f"carried-over work: {previous['name']}", "ns": call["end"] - call["start"]}]
    assert not [i for i in items if i["kind"] == "blocked" and i["ns"] > 1_000_000]


def test_cpu_only_with_stack_step_has_a_path_through_its_python_frames():
    """A real CPU-only `with_stack` trace (tests/data/cpu-stack): `profiler.step()`'s Python
    frame starts inside `ProfilerStep#1` and ends 0.12 ms after it, so the step's thread had no
    way to its end and the step had no figures (issue 67 item 4). The frame now ends with the
    step: one thread never waits, so the path is the whole step, all host."""
    trace = tracekit.load(DATA / "cpu-stack" / "cpu_stack.pt.trace.json.gz")
    step = trace.ops.filter(pl.col("name") == "ProfilerStep#1").row(0, named=True)
    row = critical_path(trace).row(0, named=True)
    assert (row["span_ns"], row["path_ns"], row["host_ns"]) == (step["end"] - step["start"],) * 3


def test_collectives_pair_by_step_when_one_rank_s_trace_begins_earlier(tmp_path):
    """Rank 0's trace begins earlier: it holds an all-reduce launched before step 1 (at -50 µs)
    that rank 1's trace does not. Step 1's all-reduce is the first of step 1 on both ranks, so
    rank 0's (entered at 10 µs) waits for rank 1's (at 60 µs), as in
    `test_late_rank_makes_the_collective_wait`; paired by launch index over the trace, rank 0's
    earlier one would pair with rank 1's and step 1's with nothing (issue 65 item 5)."""
    blocked = synth.call("cudaDeviceSynchronize", 5.0, 190.0, corr=9)
    rank0 = [*synth.nccl("all_reduce", -60.0, -50.0, 20.0, corr=7), synth.step(1, 0.0, 200.0),
             *synth.nccl("all_reduce", 1.0, 10.0, 90.0, corr=8), blocked]
    rank1 = [synth.step(1, 0.0, 200.0), *synth.launched("work", 1.0, 5.0, 55.0, corr=1),
             *synth.nccl("all_reduce", 3.0, 60.0, 40.0, corr=2), blocked]
    run = two_ranks(tmp_path, rank0, rank1)
    arrivals = collective_arrivals(run.traces)
    assert parts(run.traces[0], arrivals[0])["comm"] == 40_000
    assert arrivals[1].height == 0


def test_shifted_windows_are_said(tmp_path):
    """The run of `test_collectives_pair_by_step_when_one_rank_s_trace_begins_earlier`: rank 0
    holds one all-reduce outside the steps, rank 1 none — one note, naming both counts; the
    h200x2-small fsdp2 run, whose ranks line up, gets none."""
    from tracekit.analyses.critical_path import collective_starts, shifted_windows

    blocked = synth.call("cudaDeviceSynchronize", 5.0, 190.0, corr=9)
    rank0 = [*synth.nccl("all_reduce", -60.0, -50.0, 20.0, corr=7), synth.step(1, 0.0, 200.0),
             *synth.nccl("all_reduce", 1.0, 10.0, 90.0, corr=8), blocked]
    rank1 = [synth.step(1, 0.0, 200.0), *synth.nccl("all_reduce", 3.0, 60.0, 40.0, corr=2), blocked]
    (tmp_path / "run").mkdir()
    synth.write(tmp_path / "run", "rank0.json", synth.doc(rank0, rank=0))
    synth.write(tmp_path / "run", "rank1.json", synth.doc(rank1, rank=1))
    notes = shifted_windows([collective_starts(t) for t in tracekit.load(tmp_path / "run").traces])
    assert len(notes) == 1 and "windows are shifted" in notes[0] and "(rank 0: 1, rank 1: 0)" in notes[0]
    run = tracekit.load(DATA / "h200x2-small" / "fsdp2")
    assert shifted_windows([collective_starts(t) for t in run.traces]) == []
