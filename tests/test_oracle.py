"""Every verb's time figures against the brute-force oracle (tests/oracle.py) on random small
traces: several devices and streams, overlapping kernels, communication on several streams,
memcpy/memset, device work lagging across step boundaries, launches outside every step or
missing, nested CPU ops on several threads, host syncs."""

from fractions import Fraction

import polars as pl
import pytest
from conftest import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import per_step, reference

import synth
import tracekit
from tracekit.analyses.breakdown import breakdown
from tracekit.analyses.comms import collective_kernels
from tracekit.analyses.diff import diff_runs, step_items
from tracekit.analyses.overlap import overlap
from tracekit.analyses.summary import summary
from tracekit.analyses.timeline import timeline

NAMES = {"compute": ("gemm", "kernel"), "comm": ("ncclDevKernel_AllGather_RING_LL(x)", "kernel"),
         "comm2": ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)", "kernel"),
         "memcpy": ("Memcpy DtoD", "gpu_memcpy"), "memset": ("Memset (Device)", "gpu_memset")}
US = 1000.0  # the generator works in ns; Kineto writes µs


def at(ns: int) -> float:
    return ns / US


@st.composite
def nested(draw, lo: int, hi: int, depth: int = 0) -> list[tuple[int, int]]:
    """Properly nested intervals inside [lo, hi) (a CPU thread's ops)."""
    out, t = [], lo
    while t < hi and len(out) < 3 and draw(st.booleans()):
        start = draw(st.integers(t, hi - 1))
        end = draw(st.integers(start + 1, hi))
        out.append((start, end))
        if depth < 2 and end - start > 2:
            out += draw(nested(start, end, depth + 1))
        t = end
    return out


@st.composite
def traces(draw):
    """A trace document: 1-3 steps on the main thread, activities on 1-2 devices."""
    n_steps = draw(st.integers(1, 3))
    bounds = sorted(draw(st.lists(st.integers(20, 280), min_size=n_steps - 1, max_size=n_steps - 1, unique=True)))
    windows = list(zip([0, *bounds], [*bounds, 300]))
    events = [synth.step(i + 1, at(a), at(b - a)) for i, (a, b) in enumerate(windows)]
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(sorted(NAMES)))
        name, cat = NAMES[kind]
        start, dur = draw(st.integers(0, 330)), draw(st.integers(0, 60))
        device, stream = draw(st.integers(0, 1)), draw(st.integers(1, 3))
        corr = 100 + i
        kernel = synth.kernel(name, at(start), at(dur), corr, stream=stream, cat=cat, **(
            {"Collective name": "allgather" if kind == "comm" else "reducescatter", "dtype": "Float",
             "In msg nelems": 8, "Out msg nelems": 16, "Group size": 2, "Process Group Name": "0"}
            if kind.startswith("comm") else {}))
        kernel["args"]["device"] = device
        events.append(kernel)
        launch = draw(st.sampled_from(["step", "step", "step", "outside", "none"]))
        if launch == "step":
            a, b = draw(st.sampled_from(windows))
            events.append(synth.call("cudaLaunchKernel", at(draw(st.integers(a, b - 1))), at(1), corr))
        elif launch == "outside":
            events.append(synth.call("cudaLaunchKernel", at(-5), at(1), corr))
    for tid in (100, 101):
        for a, b in draw(nested(0, 340)):
            events.append(synth.op(f"op{a}_{b}", at(a), at(b - a), tid=tid))
    for j in range(draw(st.integers(0, 2))):
        start = draw(st.integers(0, 320))
        events.append(synth.call(draw(st.sampled_from(["cudaStreamSynchronize", "cudaGetDevice"])), at(start),
                                 at(draw(st.integers(1, 30))), 900 + j, tid=draw(st.sampled_from([100, 102]))))
    return synth.doc(events)


def check(trace, scope: str) -> None:
    truth = reference(trace, scope)
    key = ["step", "device"]
    rows = {(r["step"], r["device"]): r for r in summary(trace, scope).to_dicts() if r["device"] is not None}
    lapped = {(r["step"], r["device"]): r for r in overlap(trace, scope).to_dicts() if r["device"] is not None}
    split = {(r["step"], r["device"]): r for r in breakdown(trace, scope).to_dicts() if r["device"] is not None}
    assert set(rows) == set(truth) == set(lapped) == set(split)
    for group, want in truth.items():
        row, lap, parts = rows[group], lapped[group], split[group]
        got = {"span": row["gpu_span_ns"], "busy": row["gpu_busy_ns"], "idle": row["idle_ns"],
               "comm": lap["comm_ns"], "compute": lap["compute_ns"], "overlap": lap["overlap_ns"],
               "exposed_comm": lap["exposed_comm_ns"], "comm_alone": lap["comm_alone_ns"]}
        assert got == {k: want.get(k, 0) for k in got}, group
        assert row["exposed_comm_ns"] == lap["exposed_comm_ns"] and parts["span_ns"] == want.get("span", 0)
        assert {(p["category"], p["cause"]): p["ns"] for p in parts["parts"]} == dict(want["parts"]), group
    shares = timeline(trace, scope).shares
    for (step, device), want in truth.items():
        mine = shares.filter(pl.col("step").eq_missing(step) & (pl.col("device") == device))
        got = dict(mine.select("row", "share_ns").iter_rows())
        for row, exact in want["shares"].items():
            assert abs(got[row] - exact) < 1, (row, got[row], exact)
        hidden = want["parts"].get(("compute", "other step's GPU work"), 0)  # comm under another step's compute
        assert sum(got.values()) == sum(want["shares"].values(), Fraction(0)) == want.get("busy", 0) - hidden
    if scope == "step":
        exposed = collective_kernels(trace).filter(pl.col("step").is_not_null())
        per_group = exposed.group_by(key).agg(pl.col("exposed_ns").sum())
        for step, device, ns in per_group.iter_rows():
            assert ns == truth[(step, device)].get("exposed_comm", 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_every_verb_agrees_with_the_oracle(tmp_path_factory, doc):
    path = synth.write(tmp_path_factory.mktemp("oracle"), "rank0.json", doc)
    trace = tracekit.load(path)
    check(trace, "step")
    check(trace, "trace")
    check(trace, "launched")
    check(trace, "launched")
    if trace.gpu.filter(pl.col("step").is_not_null()).height:
        result = diff_runs([trace], [trace])
        (d,) = result.per_rank
        truth = reference(trace)
        spans = {}
        for (s, _), v in truth.items():
            if s is not None:
                spans[s] = spans.get(s, 0) + v.get("span", 0)
        assert d.steps == len(spans)  # every step, each side's mean (whole ns, rounded half up)
        assert d.a_step_ns == (2 * sum(spans.values()) + len(spans)) // (2 * len(spans))
        idle = sum(ns for (s, _), v in truth.items() if s == d.a_step for (c, _), ns in v["parts"].items() if c == "idle")
        assert d.a_items.filter(pl.col("kind") == "idle")["ns"].sum() == idle
        assert d.a_items["ns"].sum() == spans[d.a_step]  # the median step's activities add up to its span exactly


def test_compute_on_one_device_hides_no_comm_on_another(tmp_path):
    """A GEMM on device 0 and an all-gather on device 1 at the same time: 0 % overlap, the
    whole all-gather exposed."""
    gemm = synth.launched("gemm", 1.0, 10.0, 100.0, corr=1)
    gather = synth.nccl("all_gather", 2.0, 10.0, 100.0, corr=2)
    gemm[1]["args"]["device"], gather[1]["args"]["device"] = 0, 1
    trace = tracekit.load(synth.write(tmp_path, "rank0.json", synth.doc([synth.step(1, 0.0, 500.0), *gemm, *gather])))
    rows = {r["device"]: r for r in overlap(trace).to_dicts()}
    assert (rows[1]["comm_ns"], rows[1]["overlap_ns"], rows[1]["overlap_pct"], rows[1]["exposed_comm_ns"]) == \
        (100_000, 0, 0.0, 100_000)
    assert rows[0]["comm_ns"] == 0 and rows[0]["compute_ns"] == 100_000
    parts = {r["device"]: r["parts"] for r in breakdown(trace).to_dicts()}
    assert parts[1] == [{"category": "comm", "cause": "all_gather", "ns": 100_000, "pct": 100.0}]


def test_comm_hidden_by_another_steps_compute_is_overlapped_in_every_view(tmp_path):
    """Step 1 launches a GEMM that runs late, [100,200) µs; step 2's all-gather [120,180) runs
    entirely under it on the same device, and step 2's own kernel at [200,230). Step 2: span
    110 µs, busy 90 (comm 60 + compute 30), idle 20 (the GEMM's tail); its comm is overlapped
    (100 %), none exposed or alone — per step as in the trace scope. Its partition gives the
    60 µs to compute, cause `other step's GPU work`, and diff's items still add up to 110 µs."""
    events = [synth.step(1, 0.0, 100.0), synth.step(2, 100.0, 100.0),
              *synth.launched("gemm", 90.0, 100.0, 100.0, corr=1),
              *synth.nccl("all_gather", 110.0, 120.0, 60.0, corr=2),
              *synth.launched("k", 111.0, 200.0, 30.0, corr=3)]
    trace = tracekit.load(synth.write(tmp_path, "rank0.json", synth.doc(events)))
    want = {"comm_ns": 60_000, "compute_ns": 30_000, "overlap_ns": 60_000, "overlap_pct": 100.0,
            "exposed_comm_ns": 0, "comm_alone_ns": 0}
    rows = {r["step"]: r for r in overlap(trace).to_dicts()}
    assert {k: rows[2][k] for k in want} == want
    (whole,) = overlap(trace, "trace").to_dicts()
    assert (whole["comm_ns"], whole["overlap_ns"], whole["overlap_pct"], whole["exposed_comm_ns"]) == \
        (60_000, 60_000, 100.0, 0)
    row = summary(trace).filter(pl.col("step") == 2).row(0, named=True)
    assert (row["gpu_span_ns"], row["gpu_busy_ns"], row["idle_ns"], row["exposed_comm_ns"]) == \
        (110_000, 90_000, 20_000, 0)
    parts = {r["step"]: r["parts"] for r in breakdown(trace).to_dicts()}
    assert parts[2] == [{"category": "compute", "cause": "other step's GPU work", "ns": 60_000, "pct": 54.55},  # of 110
                        {"category": "compute", "cause": None, "ns": 30_000, "pct": 27.27},
                        {"category": "idle", "cause": "other step's GPU work", "ns": 20_000, "pct": 18.18}]
    assert collective_kernels(trace).filter(pl.col("step") == 2)["exposed_ns"].to_list() == [0]
    items = step_items(trace, 2)
    assert items["ns"].sum() == 110_000
    hidden = items.filter(pl.col("row").is_null() & (pl.col("kind") == "compute"))
    assert hidden["name"].to_list() == ["other step's GPU work"] and hidden["ns"].to_list() == [60_000]
    truth = per_step(trace)[(2, 0)]
    assert (truth["overlap"], truth["exposed_comm"], truth["span"], truth["idle"]) == (60_000, 0, 110_000, 20_000)
    check(trace, "step")
    check(trace, "trace")


SMALL_REAL = ["critical_path/cuda_event_sync/", "critical_path/cuda_event_sync_multi_stream/", "triton_example",
              "amd_trace", "trace_filter/sampled_rank-1", "critical_path/alexnet"]


@pytest.mark.parametrize("name", SMALL_REAL)
def test_real_traces_agree_with_the_oracle(name):
    (path,) = [p for p in sorted((DATA / "external" / "hta-tests-data").rglob("*.json.gz")) if name in str(p)]
    trace = tracekit.load(path)
    check(trace, "step")
    check(trace, "trace")
    check(trace, "launched")
