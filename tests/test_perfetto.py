"""Perfetto export decoded with the perfetto package's own protos; `open` against a real client."""

import threading
import urllib.error
import urllib.request
from collections import Counter

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import DATA, messages
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PerfettoTrace
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

import tracekit
from tracekit.analyses.timeline import timeline as step_timeline
from tracekit.front.cli import main
from tracekit.front.serve import make_server, ui_link

FSDP1 = DATA / "h200x2-small" / "fsdp1"


def decode(path):
    trace = PerfettoTrace.FromString(path.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    events = [p for p in trace.packet if p.HasField("track_event")]
    return tracks, events


def track_name(track):
    return track.process.process_name if track.HasField("process") else track.name


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "fsdp1.pftrace"
    result = CliRunner().invoke(main, ["export", str(FSDP1), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return decode(out)


def test_one_slice_per_gpu_activity_and_the_tracks_exist(exported):
    tracks, events = exported
    names = Counter(track_name(t) for t in tracks.values())
    run = tracekit.load(FSDP1)
    assert sum(1 for n in names if n.startswith("rank ")) == 2
    for derived in ("tracekit: host syncs", "tracekit: steps"):
        assert names[derived] == 2, derived
    for derived in ("exposed comm", "overlapped comm", "idle", "GPU span"):
        assert [names[f"tracekit: {derived} · GPU {d}"] for d in (0, 1)] == [1, 1], derived
    for counter in ("activities running", "collectives in flight"):  # GPU 0 on rank 0, GPU 1 on rank 1
        assert [names[f"tracekit: GPU {d} {counter}"] for d in (0, 1)] == [1, 1]
    gpu_tracks = {u for u, t in tracks.items() if t.name.startswith("GPU ") and "stream" in t.name}
    begins = sum(1 for e in events if e.track_event.track_uuid in gpu_tracks
                 and e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN)
    assert begins == sum(t.gpu.height for t in run.traces)


def test_a_known_kernel_round_trips(exported):
    tracks, events = exported
    trace = tracekit.load(FSDP1 / "rank0.trace.json.gz")
    kernel = trace.gpu.filter(pl.col("name").str.starts_with("ncclDevKernel_AllGather")).sort("start").row(0, named=True)
    start = trace.origin_us * 1000 + kernel["start"]
    matches = [e for e in events if e.timestamp == start and e.track_event.name == kernel["name"]]
    (begin,) = matches
    end = next(e for e in events if e.track_event.track_uuid == begin.track_event.track_uuid
               and e.track_event.type == TrackEvent.TYPE_SLICE_END and e.timestamp >= start)
    assert end.timestamp - start == kernel["end"] - kernel["start"]
    args = {a.name: a for a in begin.track_event.debug_annotations}
    assert args["correlation"].int_value == kernel["correlation"] and args["collective"].string_value == "_allgather_base"


def test_host_sync_track_counts_the_syncs(exported):
    tracks, events = exported
    sync_tracks = {u for u, t in tracks.items() if t.name == "tracekit: host syncs"}
    syncs = Counter(e.track_event.name for e in events if e.track_event.track_uuid in sync_tracks
                    and e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN)
    assert syncs["cudaEventSynchronize"] == 50  # 25 per rank, both ranks


def test_diff_export_aligns_both_sides(tmp_path):
    out = tmp_path / "diff.pftrace"
    result = CliRunner().invoke(main, ["export", "--diff", str(FSDP1), str(DATA / "h200x2-small" / "fsdp2"),
                                       "--rank", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    tracks, events = decode(out)
    processes = sorted(t.process.process_name for t in tracks.values() if t.HasField("process"))
    assert processes == ["A fsdp1 · rank 0", "A rank 0 · top diff items", "B fsdp2 · rank 0", "B rank 0 · top diff items"]
    span_tracks = {u for u, t in tracks.items() if t.name.startswith("tracekit: GPU span")}
    starts = {e.timestamp for e in events if e.track_event.track_uuid in span_tracks
              and e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN}
    assert starts == {1_000_000_000}
    item_tracks = [t.name for t in tracks.values() if "ms · " in t.name]
    assert any("chunk_cat" in n for n in item_tracks)


def test_diff_export_of_steps_that_start_late_in_their_traces(tmp_path):
    """A recording in rounds (`tests/data/h200x1-cupti`): its median steps start more than 1 s
    into the trace (they ended at 1 s before); both sides' compared step spans still start at
    one time, and no event lies before 0."""
    run = DATA / "h200x1-cupti"
    out = tmp_path / "diff.pftrace"
    result = CliRunner().invoke(main, ["export", "--diff", str(run), "fsdp1", "fsdp2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    tracks, events = decode(out)
    span_tracks = {u for u, t in tracks.items() if t.name.startswith("tracekit: GPU span")}
    a, b = (tracekit.load(run / v / "rank0.pt.trace.json.gz") for v in ("fsdp1", "fsdp2"))
    late = max(t.gpu.filter(pl.col("step") == s)["start"].min() for t in (a, b) for s in t.steps["step"])
    assert late > 1_000_000_000  # what the test is about
    begins = [e for e in events if e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
    assert min(e.timestamp for e in begins) >= 0
    starts = Counter(e.timestamp for e in begins if e.track_event.track_uuid in span_tracks)
    processes = {t.process.process_name for t in tracks.values() if t.HasField("process")}
    assert {"A fsdp1 · rank 0", "B fsdp2 · rank 0"} <= processes
    # each side's compared step is one span slice at the common start
    assert max(starts.values()) == 2 and min(starts) >= 0


def test_diff_export_of_cpu_only_traces_aligns_their_step_windows(tmp_path):
    """Two CPU-only traces (`tests/data/gloo-cpu`): no device work to start a span, so each
    side's compared step starts where its CPU window does; both `ProfilerStep#2` slices (the
    compared step, the median of steps 1-2) start at one time (was a TypeError: no device start)."""
    a, b = (DATA / "gloo-cpu" / f"rank{r}.pt.trace.json.gz" for r in (0, 1))
    out = tmp_path / "diff.pftrace"
    result = CliRunner().invoke(main, ["export", "--diff", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    tracks, events = decode(out)
    steps = {u for u, t in tracks.items() if t.name == "tracekit: steps"}
    begins = {(e.track_event.name, e.timestamp) for e in events if e.track_event.track_uuid in steps
              and e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN}
    assert len(steps) == 2 and ("ProfilerStep#2", 1_000_000_000) in begins
    assert {t for name, t in begins if name == "ProfilerStep#2"} == {1_000_000_000}
    assert {name for name, t in begins if t < 1_000_000_000} == {"ProfilerStep#1"}


def test_bad_input_writes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    out = tmp_path / "out.pftrace"
    result = CliRunner().invoke(main, ["export", str(bad), "-o", str(out)])
    assert result.exit_code == 2 and "not valid JSON" in " ".join(messages(result.stderr)) and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_open_serves_once_with_cors_and_404(tmp_path):
    trace = tmp_path / "t.pftrace"
    trace.write_bytes(b"perfetto bytes")
    server = make_server(trace, 0)
    port = server.server_address[1]
    thread = threading.Thread(target=lambda: [server.handle_request() for _ in range(2)])
    thread.start()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other")
    assert missing.value.code == 404
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/t.pftrace") as response:
        assert response.read() == b"perfetto bytes"
        assert response.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
    thread.join(timeout=5)
    assert server.fetched and not thread.is_alive()
    server.server_close()
    assert ui_link(port, "t.pftrace") == f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/t.pftrace"


def test_open_command_exits_after_the_fetch_and_reports_a_taken_port(tmp_path):
    import socket
    import subprocess
    import sys
    import time

    trace = tmp_path / "t.pftrace"
    trace.write_bytes(b"x" * 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        taken = CliRunner().invoke(main, ["open", "--no-browser", "--port", str(port), str(trace)])
        assert taken.exit_code == 2 and f"127.0.0.1:{port}: port is taken" in taken.stderr
    proc = subprocess.Popen([sys.executable, "-m", "tracekit", "open", "--no-browser", "--port", str(port), str(trace)],
                            stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/t.pftrace").read()
            break
        except OSError:
            time.sleep(0.1)
    assert body == b"x" * 100
    assert proc.wait(timeout=10) == 0
    assert "https://ui.perfetto.dev/#!/?url=" in proc.stderr.read()


def test_timeline_png(tmp_path):
    out = tmp_path / "step.png"
    result = CliRunner().invoke(main, ["plot", "timeline", str(FSDP1), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_lanes_are_grouped_per_device(tmp_path):
    """A rank driving GPUs 0 and 1, both with a stream 7 and GPU 1 with a stream 9: five lanes,
    GPU 0's stream and partition, then GPU 1's two streams and partition; each stream lane
    holds only its own device's kernels; the picture is drawn."""
    import synth

    from tracekit.analyses.comms import peer_waits
    from tracekit.front.plot import lanes

    events = [synth.step(1, 0.0, 100.0)]
    for corr, (device, stream) in enumerate([(0, 7), (1, 7), (1, 9)], 1):
        pair = synth.launched(f"k{corr}", float(corr), 10.0 * corr, 5.0, corr=corr, stream=stream)
        pair[1]["args"]["device"] = device
        events += pair
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    trace = tracekit.load(path)
    drawn = lanes(trace.gpu.filter(pl.col("step") == 1), step_timeline(trace).segments, peer_waits([trace])[0])
    assert [label for label, _, _ in drawn] == [
        "GPU 0 · stream 7", "GPU 0 · exposed comm / idle", "GPU 1 · stream 7", "GPU 1 · stream 9",
        "GPU 1 · exposed comm / idle"]
    assert [rows["name"].to_list() for label, rows, _ in drawn if "stream" in label] == [["k1"], ["k2"], ["k3"]]
    result = CliRunner().invoke(main, ["plot", "timeline", str(path), "-o", str(tmp_path / "t.png")])
    assert result.exit_code == 0, result.output


def test_critical_path_track_covers_each_step(exported):
    """One `tracekit: critical path` track per rank whose slices tile each step's span: from
    the step's CPU start to the later of its CPU end and its last device activity's end."""
    tracks, events = exported
    for rank in (0, 1):
        trace = tracekit.load(FSDP1 / f"rank{rank}.trace.json.gz")
        ends = trace.gpu.group_by("step").agg(pl.col("end").max())
        spans = trace.steps.join(ends, on="step", how="left").select(
            pl.max_horizontal("cpu_end", "end") - pl.col("cpu_start")).to_series().sum()
        process = next(u for u, t in tracks.items() if t.HasField("process") and t.process.process_name.startswith(
            f"rank {rank} "))
        (path_track,) = [u for u, t in tracks.items() if t.name == "tracekit: critical path" and t.parent_uuid == process]
        slices = [e for e in events if e.track_event.track_uuid == path_track]
        begins = [e.timestamp for e in slices if e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
        ends_ = [e.timestamp for e in slices if e.track_event.type == TrackEvent.TYPE_SLICE_END]
        assert sum(ends_) - sum(begins) == spans
        assert all(e.track_event.name.split(": ")[0] in ("host", "runtime", "compute", "comm", "copy", "waiting")
                   for e in slices if e.track_event.type == TrackEvent.TYPE_SLICE_BEGIN)


def test_timeline_of_a_cpu_only_trace_draws_its_threads(tmp_path, monkeypatch):
    """HTA's `cpu_only` trace has no device activity (no kernel, memcpy or memset event in the
    file): its step is drawn as its threads — the main thread's ops, and the two gloo threads'
    `gloo:all_reduce` transfers, clipped to the step's CPU window — and the legend names only
    what was drawn."""
    import gzip
    import json

    import tracekit.front.plot as plot

    path = DATA / "external" / "hta-tests-data" / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert raw and not [e for e in raw if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    drawn, bars = [], plot._bars
    monkeypatch.setattr(plot, "_bars", lambda ax, rows, origin, lane, colour: (
        drawn.append((lane, colour, rows["name"].to_list(), rows["start"].min(), rows["end"].max())),
        bars(ax, rows, origin, lane, colour)))
    out = tmp_path / "t.png"
    result = CliRunner().invoke(main, ["plot", "timeline", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the oracle, from the file's own events: the step's window, and per gloo thread its transfers in it
    (step,) = [e for e in raw if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    low, high = step["ts"], step["ts"] + step["dur"]
    gloo = {}
    for e in raw:
        if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce" and e["ts"] < high and e["ts"] + e["dur"] > low:
            gloo.setdefault(e["tid"], []).append(e)
    assert len(gloo) == 2
    collective = plot.HOST_COLOURS["collective"][0]
    comm = [d for d in drawn if d[1] == collective]
    assert sorted(len(d[2]) for d in comm) == sorted(len(v) for v in gloo.values())
    assert all(set(d[2]) == {"gloo:all_reduce"} for d in comm)
    origin = tracekit.load(path).origin_us * 1000
    assert min(d[3] for d in comm) >= round(low * 1000) - origin and max(d[4] for d in comm) <= round(high * 1000) - origin
    others = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["ts"] < high
              and e["ts"] + e["dur"] > low and not str(e["name"]).startswith(("ProfilerStep#", "gloo:"))]
    assert not others  # the main thread's few ops (aten::empty) ran after the step: its lane is not drawn
    assert {d[1] for d in drawn} == {collective}


def test_host_lanes_of_a_runner_step(tmp_path):
    """A CPU step the runner marked: per thread, the phases lane, then the outermost other ops
    (a nested op left out), a collective named, an op of a gloo thread that began before the
    step clipped to its window, ProfilerStep# and what lies outside the window left out."""
    import synth

    from tracekit.analyses.host_lanes import host_lanes

    events = [synth.step(1, 100.0, 100.0), synth.op("tracekit#forward", 101.0, 40.0),
              synth.op("aten::linear", 102.0, 10.0), synth.op("aten::addmm", 103.0, 5.0),
              synth.op("tracekit#backward", 142.0, 50.0), synth.op("c10d::allreduce_", 150.0, 4.0),
              synth.op("gloo:all_reduce", 90.0, 70.0, tid=7), synth.op("gloo:all_reduce", 250.0, 5.0, tid=7)]
    trace = tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))
    lanes = host_lanes(trace, 1)
    base = trace.steps["cpu_start"][0] - 100_000  # ns of the trace's 0 µs
    got = [(r["lane"], r["name"], r["category"], (r["start"] - base) // 1000, (r["end"] - base) // 1000)
           for r in lanes.to_dicts()]
    main_tid = synth.MAIN_TID
    assert lanes["tid"].to_list() == [main_tid] * 4 + [7]
    assert got == [("phases", "tracekit#forward", "forward", 101, 141), ("phases", "tracekit#backward", "backward", 142, 192),
                   ("ops", "aten::linear", "cpu op", 102, 112), ("ops", "c10d::allreduce_", "collective", 150, 154),
                   ("ops", "gloo:all_reduce", "collective", 100, 160)]


def test_a_cpu_step_without_ops_is_not_drawn_blank(tmp_path):
    """A CPU-only trace whose last step holds no op: the picture is of the step before it, which
    has one; asking for the empty step is one line and exit 2."""
    import synth

    import tracekit.front.plot as plot

    events = [synth.step(1, 0.0, 50.0), synth.op("aten::mm", 5.0, 10.0), synth.step(2, 100.0, 50.0)]
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    panels = [plot._panel(t, None, None) for t in [tracekit.load(path)]]
    assert [(p[1], [label for label, _, _ in p[4]]) for p in panels] == [(1, [f"thread {synth.MAIN_TID} · ops"])]
    result = CliRunner().invoke(main, ["plot", "timeline", str(path), "--steps", "2", "-o", str(tmp_path / "t.png")])
    assert result.exit_code == 2 and "no CPU op in step 2" in result.stderr and not (tmp_path / "t.png").exists()
