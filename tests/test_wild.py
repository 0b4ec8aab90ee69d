"""Traces as other setups write them, built so that the right answers are known exactly:
odd field types, the 2021 schema, unknown categories, other libraries' communication
kernels, epoch timestamps with nanoseconds, profiling cycles, missing optional extras."""

import gzip
import json
import sys
from pathlib import Path

import polars as pl
import pytest
import synth
from click.testing import CliRunner
from conftest import DATA

import tracekit
from tracekit.analyses.lint import trace_findings
from tracekit.analyses.summary import summary
from tracekit.analyses.syncs import sync_ledger
from tracekit.front.cli import main


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def test_a_field_of_another_type_never_rejects_the_file(tmp_path):
    """roctracer writes `"bytes": "1"`; a kernel's bytes as text still parse as a number."""
    call = synth.call("hipMemcpyWithStream", 1.0, 1.0, corr=1)
    call["args"]["bytes"] = "1"
    memcpy = synth.kernel("Memcpy DtoD", 3.0, 2.0, corr=1, cat="gpu_memcpy", bytes="2048")
    trace = tracekit.load(synth.write(tmp_path, "rank0.json", synth.doc([synth.step(1, 0.0, 10.0), call, memcpy])))
    assert trace.gpu["bytes"].to_list() == [2048]
    assert trace.facts["lenient_events"] == 2  # the call and the memcpy; the step's fields are as typed
    kinds = dict(trace_findings(trace).select("kind", "severity").iter_rows())
    assert kinds["lenient_fields"] == "info"


def test_a_name_that_is_not_utf8_is_read_replaced_and_named(tmp_path):
    """A kernel name with bytes no UTF-8 text holds (0xff, a lone continuation byte 0x80, a
    truncated 3-byte sequence) is read with each replaced by U+FFFD, as Python's
    `errors="replace"` does, and lint counts them: 3."""
    path = synth.write(tmp_path, "rank0.json", synth.doc([synth.step(1, 0.0, 10.0), *synth.launched("kAB", 1.0, 2.0, 1.0, corr=1)]))
    path.write_bytes(path.read_bytes().replace(b'"kAB"', b'"k\xff\x80A\xe2\x82B"'))
    trace = tracekit.load(path)
    assert trace.gpu["name"].to_list() == [b"k\xff\x80A\xe2\x82B".decode("utf-8", "replace")] == ["k\ufffd\ufffdA\ufffdB"]
    found = trace_findings(trace).filter(pl.col("kind") == "replaced_text")
    assert found.select("severity", "count").rows() == [("warning", 3)]


def test_one_bad_event_among_good_ones_is_dropped_and_named(tmp_path):
    events = [synth.step(1, 0.0, 10.0), *synth.launched("k", 1.0, 2.0, 1.0, corr=1),
              {"ph": "X", "cat": "cpu_op", "name": "x", "ts": "soon", "dur": 1}, 7]
    path = synth.write(tmp_path, "rank0.json", synth.doc(events))
    trace = tracekit.load(path)
    assert trace.gpu.height == 1 and dict(trace.facts["dropped"]) == {
        "events without a numeric ts": 1, "elements that are not event objects": 1}
    result = cli("summary", path)
    assert result.exit_code == 0 and "tracekit: warning: dropped_events" in result.stderr


def pytorch_1_8(tmp_path, name="worker0.pt.trace.json"):
    """PyTorch 1.8's schema: Operator/Runtime/Kernel/Memcpy, `external id`, string tids,
    `tid: "stream 7"`, ProfilerStep#N as an Operator. Step 5 launches k1 and a copy, step 6 k2."""
    def ev(cat, name, ts, dur, pid=25738, tid="25738", **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        ev("Operator", "ProfilerStep#5", 1623142623460000, 100), ev("Operator", "ProfilerStep#6", 1623142623460100, 100),
        ev("Operator", "aten::conv2d", 1623142623460010, 20, **{"External id": 2}),
        ev("Runtime", "cudaLaunchKernel", 1623142623460011, 5, correlation=11, **{"external id": 2}),
        ev("Kernel", "k1", 1623142623460030, 40, pid=0, tid="stream 7", device=0, stream=7, correlation=11,
           **{"external id": 2}),
        ev("Runtime", "cudaMemcpyAsync", 1623142623460020, 5, correlation=12, **{"external id": 2}),
        ev("Memcpy", "Memcpy HtoD (Pageable -> Device)", 1623142623460080, 10, pid=0, tid="stream 7", device=0,
           correlation=12, bytes=64, **{"external id": 2}),
        ev("Runtime", "cudaLaunchKernel", 1623142623460110, 5, correlation=13, **{"external id": 3}),
        ev("Kernel", "k2", 1623142623460150, 30, pid=0, tid="stream 7", correlation=13, **{"external id": 3}),
        ev("Trace", "PyTorch Profiler (0)", 1623142623460000, 300, pid="Traces", tid="PyTorch Profiler"),
    ]
    return synth.write(tmp_path, name, {"schemaVersion": 1, "traceEvents": events})


def test_the_2021_schema_reads_as_what_it_is(tmp_path):
    trace = tracekit.load(pytorch_1_8(tmp_path))
    assert trace.steps["step"].to_list() == [5, 6] and trace.facts["schema"].startswith("kineto 2021")
    rows = {r["step"]: r for r in summary(trace).to_dicts()}
    assert (rows[5]["kernels"], rows[6]["kernels"]) == (1, 1)
    assert (rows[5]["gpu_span_ns"], rows[6]["gpu_span_ns"]) == (60_000, 30_000)
    copy = trace.gpu.filter(pl.col("kind") == "gpu_memcpy").row(0, named=True)
    assert (copy["stream"], copy["ext_id"], copy["category"], copy["bytes"]) == (7, 2, "memcpy", 64)
    assert set(trace.calls["tid"].to_list()) == {25738}


def test_unknown_categories_are_counted_and_named(tmp_path):
    events = [synth.step(1, 0.0, 10.0), *synth.launched("k", 1.0, 2.0, 1.0, corr=1),
              {"ph": "X", "cat": "npu_kernel", "name": "n", "pid": 0, "tid": 1, "ts": 3.0, "dur": 1.0},
              {"ph": "X", "cat": "npu_kernel", "name": "m", "pid": 0, "tid": 1, "ts": 4.0, "dur": 1.0}]
    path = synth.write(tmp_path, "rank0.json", synth.doc(events))
    assert dict(tracekit.load(path).facts["unknown_categories"]) == {"npu_kernel": 2}
    result = cli("lint", "--format", "json", path)
    (unknown,) = [f for f in json.loads(result.stdout)["traces"][0]["findings"] if f["kind"] == "unknown_category"]
    assert unknown["count"] == 2 and "'npu_kernel'" in unknown["detail"]


KERNELS = {  # name → (category, collective kind)
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)": ("comm", "all_to_all"),
    "void deep_ep::internode_ll::combine<false, 7168>(void*)": ("comm", "all_to_all"),
    "void notify_dispatch<8>(int const*, int*)": ("comm", "all_to_all"),
    "void dpsk::ep::internode::dispatch<true, 8, 1, 4096>(int4*, float*)": ("comm", "all_to_all"),  # DeepSeek
    "void dpsk::ep::intranode::cached_notify<8>(int*)": ("comm", "all_to_all"),
    "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*)": ("comm", "all_to_all"),
    "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)": ("comm", "other"),
    "void rcclGenericKernel<1, false>(ncclDevKernelArgsStorage<4096ul>)": ("comm", "other"),
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*)": ("comm", "all_reduce"),
    "void nvshmemi_transfer_rma_kernel<(nvshmemi_op_t)0>(void*)": ("comm", "other"),
    "__amd_rocclr_copyBuffer": ("memcpy", None),
    "__amd_rocclr_fillBufferAligned": ("memset", None),
    "my_fancy_allgather_kernel": ("comm", "all_gather"),  # by --comm-kernel
    "void at::native::vectorized_elementwise_kernel<4>(int)": ("compute", None),
}


def test_communication_kernels_of_other_libraries(tmp_path):
    events = [synth.step(1, 0.0, 1000.0)]
    for i, name in enumerate(KERNELS, 1):
        events += synth.launched(name, float(i), 10.0 * i, 5.0, corr=i)
    path = synth.write(tmp_path, "rank0.json", synth.doc(events))
    trace = tracekit.load(path, comm_kernels=("my_fancy",))
    assert dict(zip(trace.gpu["name"], zip(trace.gpu["category"], trace.gpu["coll_kind"]))) == KERNELS
    assert tracekit.load(path).gpu.filter(pl.col("name") == "my_fancy_allgather_kernel")["category"][0] == "compute"
    result = cli("summary", "--format", "json", "--comm-kernel", "my_fancy", path)
    assert json.loads(result.stdout)["traces"][0]["steps"][0]["collectives"]["all_gather"] == 1
    bad = cli("summary", "--comm-kernel", "(", path)
    assert bad.exit_code == 2 and bad.stderr.startswith("tracekit: --comm-kernel '(' is not a regular expression")


def test_epoch_microseconds_with_nanoseconds_decode_exactly(tmp_path):
    """1712195495519689.047 µs has more digits than a float holds (its neighbours are 0.25 µs
    apart): decoded from the text, every nanosecond is kept."""
    events = [synth.step(1, "T0", 10.0), *synth.launched("k", "T1", "T2", 0.333, corr=1)]
    text = json.dumps(synth.doc(events))
    for mark, ts in (("T0", "1712195495519689.047"), ("T1", "1712195495519689.048"), ("T2", "1712195495519690.001")):
        text = text.replace(f'"{mark}"', ts)  # a Python float cannot even write these
    (tmp_path / "rank0.json").write_text(text)
    trace = tracekit.load(tmp_path / "rank0.json")
    assert trace.origin_us == 1712195495519689
    assert trace.steps.row(0) == (1, 47, 10_047)
    assert trace.gpu.select("start", "end").row(0) == (1_001, 1_334)
    assert trace.calls["start"].to_list() == [48]
    assert trace.facts["exact_timestamps"] == 3 and trace.facts["lenient_events"] == 0


def test_tensorboard_cycles_by_file_name(tmp_path):
    """`worker0.<ms>.pt.trace.json`: the last cycle by default, `--cycle first` or N."""
    pytorch_1_8(tmp_path, "worker0.1623143089861.pt.trace.json")
    pytorch_1_8(tmp_path, "worker0.1623143566756.pt.trace.json")
    result = cli("summary", "--format", "json", tmp_path)
    (trace,) = json.loads(result.stdout)["traces"]
    assert trace["path"].endswith("worker0.1623143566756.pt.trace.json")
    assert "worker0.1623143089861.pt.trace.json" in cli("lint", "--format", "csv", tmp_path).stdout
    for cycle in ("first", "1"):
        (trace,) = json.loads(cli("summary", "--format", "json", "--cycle", cycle, tmp_path).stdout)["traces"]
        assert trace["path"].endswith("worker0.1623143089861.pt.trace.json")
    bad = cli("summary", "--cycle", "zero", tmp_path)
    assert bad.exit_code == 2 and "Invalid value for '--cycle'" in bad.stderr


def test_syncs_without_device_records_have_no_gpu_idle(tmp_path):
    events = [synth.step(1, 0.0, 100.0), synth.call("cudaStreamSynchronize", 10.0, 20.0, corr=1)]
    (call,) = sync_ledger(tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events))))["calls"][0]
    assert call["blocked_ns"] == 20_000 and call["gpu_idle_ns"] is None


def test_pictures_without_matplotlib_say_how_to_get_it(tmp_path, monkeypatch):
    path = synth.write(tmp_path, "rank0.json", synth.doc([synth.step(1, 0.0, 10.0),
                                                           *synth.launched("k", 1.0, 2.0, 1.0, corr=1)]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for args in (("plot", "timeline", path, "-o", tmp_path / "t.png"),
                 ("diff", "--plot", tmp_path / "w.png", path, path)):
        result = cli(*args)
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert result.stderr.strip().splitlines()[-1] == \
            "tracekit: pictures need matplotlib: pip install 'torch-tracekit[plot]'"
    assert not (tmp_path / "t.png").exists() and not (tmp_path / "w.png").exists()


def test_lint_strict_fails_on_errors_only(tmp_path):
    for rank in (0, 2):  # world size 4: ranks 1 and 3 are missing
        synth.write(tmp_path, f"rank{rank}.json", synth.doc([synth.step(1, 0.0, 10.0)], rank=rank, world_size=4))
    relaxed, strict = cli("lint", tmp_path), cli("lint", "--strict", "--format", "json", tmp_path)
    assert relaxed.exit_code == 0 and strict.exit_code == 1
    (missing,) = [f for f in json.loads(strict.stdout)["runs"][0]["findings"] if f["kind"] == "missing_ranks"]
    assert missing["severity"] == "error" and missing["detail"].endswith("no trace in the directory: 1, 3")
    assert cli("lint", "--strict", tmp_path / "rank0.json").exit_code == 0


@pytest.mark.parametrize("lag", [True, False])
def test_lint_measures_lag_orphans_and_same_stream_overlap(tmp_path, lag):
    """Step 1 [0,100) launches k_a, which runs [150,170): 20 µs of it inside step 2's window
    [100,200) (with lag). A kernel launched before the steps (orphan, 7 µs); two kernels on
    stream 9 overlapping by 3 µs."""
    k_a = (150.0, 20.0) if lag else (50.0, 20.0)
    events = [synth.step(1, 0.0, 100.0), synth.step(2, 100.0, 100.0),
              *synth.launched("k_a", 90.0, *k_a, corr=1),
              synth.call("cudaLaunchKernel", -10.0, 1.0, corr=2), synth.kernel("early", -5.0, 7.0, corr=2),
              *synth.launched("s1", 110.0, 120.0, 10.0, corr=3, stream=9),
              *synth.launched("s2", 111.0, 127.0, 10.0, corr=4, stream=9)]
    found = {r["kind"]: r for r in trace_findings(tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))).to_dicts()}
    assert (found["orphan_gpu_work"]["count"], found["orphan_gpu_work"]["ns"]) == (1, 7_000)
    assert (found["same_stream_overlap"]["count"], found["same_stream_overlap"]["ns"]) == (1, 3_000)
    if lag:
        assert (found["gpu_lag"]["step"], found["gpu_lag"]["ns"]) == (1, 20_000)
    else:
        assert "gpu_lag" not in found


def test_a_utf8_byte_order_mark_is_read(tmp_path):
    """A BOM before the JSON (some editors and Windows tools write one): plain, gzipped, and
    large enough to be read a block at a time, the same trace as without it."""
    events = [synth.step(1, 0.0, 100.0), *synth.launched("k", 1.0, 2.0, 3.0, corr=1)]
    text = json.dumps(synth.doc(events), indent=1).encode()
    plain = tracekit.load(synth.write(tmp_path, "plain.json", synth.doc(events)))
    for name, data in (("bom.json", b"\xef\xbb\xbf" + text), ("bom.json.gz", gzip.compress(b"\xef\xbb\xbf" + text))):
        (tmp_path / name).write_bytes(data)
        trace = tracekit.load(tmp_path / name)
        assert trace.gpu.select("name", "start", "end").equals(plain.gpu.select("name", "start", "end"))
        assert cli("summary", "--format", "json", tmp_path / name).exit_code == 0


def test_lag_counts_all_of_a_steps_work_after_its_window(tmp_path):
    """Windows [0, 100), [100, 140), [180, 220) µs; step 1 launches k, which runs [120, 200):
    20 µs in step 2's window, 40 µs between windows, 20 µs in step 3's — all 80 µs ran after
    step 1's window (the next window alone holds only 20)."""
    events = [synth.step(1, 0.0, 100.0), synth.step(2, 100.0, 40.0), synth.step(3, 180.0, 40.0),
              *synth.launched("k", 90.0, 120.0, 80.0, corr=1)]
    found = {r["kind"]: r for r in trace_findings(tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))).to_dicts()}
    assert (found["gpu_lag"]["step"], found["gpu_lag"]["ns"]) == (1, 80_000)


def test_launches_without_any_device_record_warn_on_every_verb(tmp_path):
    """260 launches, no kernel record: a warning on stderr of every verb, not only `lint`."""
    events = [synth.step(1, 0.0, 1000.0)] + [synth.call("cudaLaunchKernel", 1.0 + i, 0.5, corr=i) for i in range(260)]
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    for verb in ("summary", "syncs", "comms", "overlap", "breakdown"):
        result = CliRunner().invoke(main, [verb, str(path)])
        assert result.exit_code == 0
        assert "warning: launches_without_records" in result.stderr and "260 kernel launches" in result.stderr


def test_a_file_fusing_several_ranks_is_warned(tmp_path):
    """Four processes in one file (as TraceFuse writes them): each records ProfilerStep#1 on
    its own thread and drives its own GPU. Every verb warns; one rank's own file does not."""
    events = []
    for rank in range(4):
        pid = 1000 + rank
        mark = synth.step(1, 0.0, 100.0, tid=pid)
        mark["pid"] = pid
        pair = synth.launched("k", 1.0, 10.0, 5.0, corr=100 * rank + 1)
        pair[0]["pid"] = pair[0]["tid"] = pid
        pair[1]["args"]["device"] = rank
        events += [mark, *pair]
    fused = synth.write(tmp_path, "fused.json", synth.doc(events))
    result = CliRunner().invoke(main, ["summary", str(fused)])
    assert result.exit_code == 0 and "warning: fused_ranks" in result.stderr and "4 processes" in result.stderr
    one = synth.write(tmp_path, "one.json", synth.doc([e for e in events if e["pid"] in (1000, 0)]))
    assert "fused_ranks" not in CliRunner().invoke(main, ["summary", str(one)]).stderr


def fused_ranks(ranks: int, rank_args: bool) -> list:
    """`ranks` processes as TraceFuse fuses them: rank r's pids shifted by r × 10⁴ (its CPU
    pid and its device row), its correlation ids by r × 10⁴; each records ProfilerStep#1 and
    #2 and issues 8 hipEventSynchronize in step 1 and one kernel per step."""
    events = []
    for r in range(ranks):
        own = [synth.step(1, 0.0, 100.0), synth.step(2, 100.0, 100.0),
               *[synth.call("hipEventSynchronize", 10.0 + 5 * i, 2.0, corr=50 + i) for i in range(8)],
               *synth.launched("k", 1.0, 60.0, 10.0 + r, corr=1), *synth.launched("k", 101.0, 150.0, 10.0, corr=2)]
        for e in own:
            e["pid"] += r * 10_000
            if "correlation" in e["args"]:
                e["args"]["correlation"] += r * 10_000
            if rank_args:
                e["args"]["rank"] = r
        events += own
    return events


@pytest.mark.parametrize("rank_args", [True, False])
def test_a_file_fusing_several_ranks_is_read_rank_by_rank(tmp_path, rank_args):
    """Four processes fused into one file: four ranks, each with its own 8 syncs (not 32) and
    its own device's kernels; ranks from `args.rank`, else from the processes' order."""
    path = synth.write(tmp_path, "fused.json", {"traceEvents": fused_ranks(4, rank_args)})
    run = tracekit.load(path)
    assert [t.rank for t in run.traces] == [0, 1, 2, 3] and {t.world_size for t in run.traces} == {4}
    for r, trace in enumerate(run.traces):
        rows = summary(trace).to_dicts()
        assert [row["syncs.hipEventSynchronize"] for row in rows] == [8, 0]
        assert [row["gpu_busy_ns"] for row in rows] == [(10 + r) * 1000, 10_000]
    result = CliRunner().invoke(main, ["summary", "--format", "json", str(path)])
    assert result.exit_code == 0 and "fused_ranks" not in result.stderr
    doc = json.loads(result.stdout)
    assert [(t["rank"], t["steps"][0]["syncs"]["hipEventSynchronize"]) for t in doc["traces"]] == \
        [(0, 8), (1, 8), (2, 8), (3, 8)]


def test_a_fused_file_that_cannot_be_split_safely_is_warned(tmp_path):
    """Correlation ids not shifted apart (two processes launch id 1): which process launched a
    kernel is ambiguous, so the file is read as one trace, with the warning."""
    events = fused_ranks(2, rank_args=False)
    for e in events:
        if "correlation" in e["args"]:
            e["args"]["correlation"] %= 10_000
    path = synth.write(tmp_path, "fused.json", synth.doc(events))
    assert isinstance(tracekit.load(path), tracekit.Trace)
    result = CliRunner().invoke(main, ["summary", str(path)])
    assert result.exit_code == 0 and "warning: fused_ranks" in result.stderr


def trace_fused(files: list, out: Path) -> Path:
    """The rank files fused into one as TraceLens' TraceFuse does: every event's pid and
    correlation id shifted by rank × a power of ten above the largest, `args.rank` set, the
    top-level metadata (distributedInfo) left out."""
    docs = [json.loads(gzip.decompress(f.read_bytes())) for f in files]
    events = [e for d in docs for e in d["traceEvents"]]
    shift = {k: 10 ** (len(str(max(v for v in values if isinstance(v, int)))) + 1) for k, values in (
        ("pid", [e.get("pid") for e in events]),
        ("correlation", [e.get("args", {}).get("correlation") for e in events] + [1]))}
    fused = []
    for rank, d in enumerate(docs):
        for e in d["traceEvents"]:
            e = dict(e, args=dict(e.get("args", {}), rank=rank))
            if isinstance(e.get("pid"), int):
                e["pid"] += rank * shift["pid"]
            if isinstance(e["args"].get("correlation"), int):
                e["args"]["correlation"] += rank * shift["correlation"]
            fused.append(e)
    out.write_bytes(gzip.compress(json.dumps({"traceEvents": fused}).encode()))
    return out


def test_two_real_ranks_fused_read_as_their_own_files(tmp_path):
    """H200 FSDP1 ranks 0 and 1 fused: each rank's summary, syncs and cross-rank comms figures
    are those of its own file."""
    apart = DATA / "h200x2-small" / "fsdp1"
    fused = trace_fused(sorted(apart.glob("rank*.trace.json.gz")), tmp_path / "fused.json.gz")

    def figures(path, verb):
        result = CliRunner().invoke(main, [verb, "--format", "json", str(path)])
        assert result.exit_code == 0, result.output
        return [(t["rank"], t["steps"]) for t in json.loads(result.stdout)["traces"]]

    for verb in ("summary", "syncs", "comms", "overlap", "breakdown"):
        assert figures(fused, verb) == figures(apart, verb), verb


def test_launchless_kernels_are_orphans_whatever_range_their_external_id_names(tmp_path):
    """An event-replay trace (ROCm): a replayed `aten::convolution_backward` launches 2 MIOpen
    kernels (their `hipLaunchKernel` calls in the trace); 3 more kernels run inside the step
    with correlation ids whose calls are not in the trace, their External id that of the
    replayed op (roctracer fills it from the range open at the time). Device work with no
    launching call has no launching thread: the 3 are in no step and have no op, and `lint`
    names them (`orphan_gpu_work`); the op launched 2."""
    from tracekit.analyses.phases import launch_context

    def launched(name, corr, call_ts, ts):
        call = synth.call("hipLaunchKernel", call_ts, 1.0, corr, cat="cuda_runtime")
        call["args"]["External id"] = 5
        kernel = synth.kernel(name, ts, 10.0, corr)
        kernel["args"]["External id"] = 5
        return [call, kernel]

    replayed = [synth.kernel(f"MIOpenConvBwdWeights{i}", 200.0 + 20 * i, 10.0, 900 + i) for i in range(3)]
    for k in replayed:
        k["args"]["External id"] = 5
    events = [synth.step(1, 0.0, 1000.0), synth.op("aten::convolution_backward", 10.0, 100.0, **{"External id": 5}),
              *launched("MIOpenConvBwdData", 1, 20.0, 120.0), *launched("MIOpenConvBwdBias", 2, 40.0, 140.0),
              *replayed]
    trace = tracekit.load(synth.write(tmp_path, "replay.json", synth.doc(events)), cache=False)
    ops = dict(zip(trace.gpu["name"], launch_context(trace)["op"]))
    steps = dict(zip(trace.gpu["name"], trace.gpu["step"]))
    assert {n: (steps[n], ops[n]) for n in steps} == {
        "MIOpenConvBwdData": (1, "aten::convolution_backward"), "MIOpenConvBwdBias": (1, "aten::convolution_backward"),
        **{f"MIOpenConvBwdWeights{i}": (None, None) for i in range(3)}}
    (orphans,) = trace_findings(trace).filter(pl.col("kind") == "orphan_gpu_work").to_dicts()
    assert orphans["count"] == 3
