"""Memory over the step (`tracekit memory`, the memory step of `tracekit profile`, its Δ in
`diff` and `report`): against answers known without tracekit — a synthetic allocator snapshot
whose every allocation is stated here, the model state of the tiny preset from its parameter
count, and a workload that holds one extra buffer of known size (examples/held_buffer.py)."""

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PerfettoTrace
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

from tracekit.analyses.memory import memory_answer, memory_delta, memory_lead
from tracekit.core.memory_files import from_snapshot, load_memory, with_phases, with_state
from tracekit.front.cli import main

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ["ddp", "fsdp1", "fsdp2"]
MiB = 2 ** 20
FSDP2_GATHER = [{"filename": "/x/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "line": 1066,
                 "name": "alloc_storage"}]
MODEL = [{"filename": "/home/u/model.py", "line": 12, "name": "forward"}]
MARK = [{"filename": "/x/runners/memory_record.py", "line": 1, "name": "phase_mark"}]


def snapshot(extra: int = 0) -> dict:
    """One step's allocator history, every figure stated: 4 MiB of parameters and 8 MiB of
    optimizer state from before (segments), marks at 10 (start), 20 (forward), 30 (backward)
    and 40 µs (optimizer); in forward an all-gather output of 2 MiB (freed at 22 µs) and an
    activation of 3 MiB (freed at 25 µs), plus `extra` bytes made by the model at 12 µs and
    freed at 28 µs; a 1 MiB gradient made at 24 µs, freed at 39 µs; a 1 MiB workspace in the
    optimizer (33 to 35 µs). Reserved: 16 MiB before, one more 8 MiB segment at 11 µs.
    The peak: 4 + 8 + 2 + 3 MiB (+ extra) at 15 µs, in forward."""
    trace = []

    def add(action, t, addr, size, frames=()):
        trace.append({"action": action, "time_us": t, "addr": addr, "size": size, "frames": list(frames)})
    for t, addr in ((10, 900), (20, 901), (30, 902), (40, 903)):
        add("alloc", t, addr, 512, MARK)
        add("free_requested", t, addr, 512, MARK)
        add("free_completed", t, addr, 512, MARK)
    add("segment_alloc", 11, 5000, 8 * MiB)
    add("alloc", 11, 100, 2 * MiB, FSDP2_GATHER)
    if extra:
        add("alloc", 12, 400, extra, MODEL)
    add("alloc", 15, 200, 3 * MiB, MODEL)
    add("free_requested", 22, 100, 2 * MiB, FSDP2_GATHER)
    add("alloc", 24, 300, MiB)
    add("free_requested", 25, 200, 3 * MiB)
    if extra:
        add("free_requested", 28, 400, extra)
    add("alloc", 33, 600, MiB, [{"filename": "/x/site-packages/torch/optim/adamw.py", "line": 9, "name": "step"}])
    add("free_requested", 35, 600, MiB)
    add("free_requested", 39, 300, MiB)
    trace.sort(key=lambda e: e["time_us"])
    blocks = [{"address": 1, "size": 4 * MiB, "state": "active_allocated", "frames": []},
              {"address": 1 + 4 * MiB, "size": 8 * MiB, "state": "active_allocated", "frames": []},
              {"address": 1 + 12 * MiB, "size": 4 * MiB, "state": "inactive", "frames": []}]
    segments = [{"device": 0, "address": 1, "total_size": 16 * MiB, "blocks": blocks},
                {"device": 0, "address": 5000, "total_size": 8 * MiB,
                 "blocks": [{"address": 5000, "size": 8 * MiB, "state": "inactive", "frames": []}]}]
    return {"segments": segments, "device_traces": [trace]}


def test_the_runners_marker_is_the_one_the_reader_knows():
    from tracekit.core.memory_files import MARK_FUNCTION
    from tracekit.runners.memory_record import phase_mark

    assert phase_mark.__name__ == MARK_FUNCTION == MARK[0]["name"]


def answer_of(snap: dict, tags=True):
    record, marks = from_snapshot(snap, "synthetic")
    assert marks == [10_000, 20_000, 30_000, 40_000]
    record = with_phases(record, marks, ("forward", "backward", "optimizer"))
    if tags:
        record = with_state(record, [(1, 4 * MiB, "param"), (1 + 4 * MiB, 8 * MiB, "optimizer"), (300, MiB, "grad")],
                            30_000)
    return memory_answer(record)


def test_a_synthetic_snapshot_gives_its_stated_peak_categories_and_phases():
    a = answer_of(snapshot())
    assert (a.peak["bytes"], a.peak["at_ms"], a.peak["phase"]) == (17 * MiB, 0.005, "forward")
    assert a.peak["reserved_bytes"] == 24 * MiB and a.peak["slack_bytes"] == 7 * MiB
    assert dict(a.categories.select("category", "bytes").iter_rows()) == {
        "params": 4 * MiB, "optimizer": 8 * MiB, "params_unsharded": 2 * MiB, "activations": 3 * MiB,
        "slack": 7 * MiB}
    phases = {r["phase"]: r for r in a.phases.to_dicts()}
    assert [phases[p]["peak_bytes"] for p in ("forward", "backward", "optimizer")] == \
        [17 * MiB, 17 * MiB, 14 * MiB]  # backward: at its start, the gather's 2 MiB not yet freed; optimizer: 13 + 1
    per_phase = a.phase_categories.filter(a.phase_categories["phase"] == "optimizer")
    assert dict(per_phase.select("category", "bytes").iter_rows()) == {
        "params": 4 * MiB, "optimizer": 8 * MiB, "grads": MiB, "temporary": MiB}


def test_an_untagged_snapshot_falls_back_on_stacks_and_lifetimes():
    a = answer_of(snapshot(), tags=False)
    got = dict(a.categories.select("category", "bytes").iter_rows())
    assert got == {"params_unsharded": 2 * MiB, "activations": 3 * MiB, "before": 12 * MiB, "slack": 7 * MiB}


def test_an_injected_allocation_is_the_whole_peak_delta_synthetic():
    a, b = answer_of(snapshot()), answer_of(snapshot(extra=5 * MiB))
    delta = memory_delta([a], [b])
    rows = {(r["kind"], r["name"]): r["delta_bytes"] for r in delta.to_dicts()}
    assert rows["peak", "peak"] == 5 * MiB and rows["category", "activations"] == 5 * MiB
    assert rows["origin", "u/model.py(12): forward [activations]"] == 5 * MiB
    assert memory_lead(delta, "A", "B") == "B's peak is 5.00 MiB higher than A's (mean rank; in forward): " \
                                           "activations +5.00 MiB."


def test_memory_reads_a_snapshot_pickle_and_refuses_what_is_not_one(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    result = CliRunner().invoke(main, ["memory", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rank = json.loads(result.stdout)["ranks"][0]
    assert rank["peak"]["bytes"] == 17 * MiB and rank["peak"]["phase"] is None  # a user's snapshot: no marks
    bad = tmp_path / "code.pickle"
    bad.write_bytes(pickle.dumps(Path("x")))  # names a class: refused, not run
    result = CliRunner().invoke(main, ["memory", str(bad)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "names no classes" in result.output


def test_a_trace_without_memory_events_is_one_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "x", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    result = CliRunner().invoke(main, ["memory", str(path)])
    assert result.exit_code == 2 and "no [memory] events" in result.output and result.output.count("\n") == 1


def profile(tmp_path_factory, name, *args):
    out = tmp_path_factory.mktemp("memory") / name
    command = [sys.executable, "-m", "tracekit", "profile", "--device", "cpu", "--nproc", "2", "--warmup", "1",
               "--steps", "1", "--profile-steps", "1", "--no-report", "--out", str(out), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return profile(tmp_path_factory, "tiny", "--preset", "tiny", "--variants", ",".join(VARIANTS))


def tiny_parameters() -> int:
    from tracekit.runners.model import Transformer, model_config

    return sum(p.numel() for p in Transformer(model_config("tiny")).parameters())


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_state_at_the_peak_agrees_with_the_parameter_count(run, variant):
    """fp32 on CPU: parameters 4 B per element held, AdamW's two moments 8 B (+ a 4-byte step
    per parameter tensor), gradients 4 B — all of them live once backward is done, so at the
    optimizer phase's peak; the sharded variants hold 1/2 of each."""
    held = tiny_parameters() / (1 if variant == "ddp" else 2)
    for record in load_memory(run / variant):
        a = memory_answer(record)
        at_peak = dict(a.categories.select("category", "bytes").iter_rows())
        assert at_peak["params"] == pytest.approx(4 * held, rel=0.02)
        assert at_peak["optimizer"] == pytest.approx(8 * held, rel=0.02)
        optimizer = a.phase_categories.filter(a.phase_categories["phase"] == "optimizer")
        assert dict(optimizer.select("category", "bytes").iter_rows())["grads"] == pytest.approx(4 * held, rel=0.02)
        if variant != "ddp":
            assert at_peak["params_unsharded"] > 0  # some unit's full parameters are out at the peak


def test_memory_verb_fits_100_columns_and_reads_the_cpu_step_trace(run):
    result = CliRunner().invoke(main, ["memory", str(run)])
    assert result.exit_code == 0, result.output
    assert max(map(len, result.stdout.splitlines())) <= 100
    trace = run / "fsdp2" / "memory" / "rank0.pt.trace.json.gz"
    result = CliRunner().invoke(main, ["memory", str(trace), "--format", "json"])
    rank = json.loads(result.stdout)["ranks"][0]
    assert [p["phase"] for p in rank["phases"]] == ["forward", "backward", "optimizer"]
    assert any(row["op"] for row in rank["largest"])  # the profiler's view names the ops


def test_report_gives_each_variants_peak_against_the_baseline(run):
    result = CliRunner().invoke(main, ["report", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    peaks = {r["variant"]: r["peak_bytes"] for r in memory["variants"]}
    assert set(peaks) == set(VARIANTS) and peaks["fsdp2"] < peaks["ddp"]
    assert [(d["a"], d["b"]) for d in memory["deltas"]] == [("ddp", "fsdp1"), ("ddp", "fsdp2")]
    assert memory["deltas"][1]["lead"].startswith("fsdp2's peak is ") and "lower than ddp's" in \
        memory["deltas"][1]["lead"]
    table = CliRunner().invoke(main, ["report", str(run)]).stdout
    assert "memory at the peak" in table and max(map(len, table.splitlines())) <= 100


def test_export_has_a_memory_counter_per_rank_and_variant(run, tmp_path):
    out = tmp_path / "t.pftrace"
    result = CliRunner().invoke(main, ["export", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    trace = PerfettoTrace.FromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    processes = {t.uuid: t.process.process_name for t in tracks.values() if t.HasField("process")}
    counters = {u: processes[t.parent_uuid] for u, t in tracks.items()
                if t.name == "tracekit: memory allocated (bytes)"}
    assert sorted(counters.values()) == sorted(f"memory step · rank {r} · {v}" for v in VARIANTS for r in (0, 1))
    peaks = {(a.variant, a.rank): a.peak["bytes"] for a in map(memory_answer, load_memory(run))}
    for uuid, name in counters.items():
        values = [p.track_event.counter_value for p in trace.packet if p.HasField("track_event")
                  and p.track_event.track_uuid == uuid and p.track_event.type == TrackEvent.TYPE_COUNTER]
        _, rank, variant = name.split(" · ")
        assert max(values) == peaks[variant, int(rank.split()[1])]


@pytest.fixture(scope="module")
def held_pair(tmp_path_factory):
    model = str(ROOT / "examples" / "held_buffer.py")
    return [profile(tmp_path_factory, side, "--variants", "ddp", "--model", f"{model}:{factory}")
            for side, factory in (("A", "plain"), ("B", "held"))]


def test_diff_attributes_the_peak_delta_to_the_injected_buffer(held_pair):
    import importlib.util

    spec = importlib.util.spec_from_file_location("held_buffer", ROOT / "examples" / "held_buffer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    a, b = (p / "ddp" for p in held_pair)
    result = CliRunner().invoke(main, ["diff", str(a), str(b), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["memory"]
    peak = next(r for r in rows if r["kind"] == "peak")
    assert peak["delta_bytes"] == pytest.approx(example.HELD_BYTES, rel=0.01)
    activations = next(r for r in rows if r["kind"] == "category" and r["name"] == "activations")
    assert activations["delta_bytes"] == pytest.approx(example.HELD_BYTES, rel=0.01)
    top = next(r for r in rows if r["kind"] == "origin")
    assert "held_buffer.py" in top["name"] and top["delta_bytes"] == pytest.approx(example.HELD_BYTES, rel=0.01)
    table = CliRunner().invoke(main, ["diff", str(a), str(b)]).stdout
    assert max(map(len, table.splitlines())) <= 100
    assert "B's peak is 8.00 MiB higher than A's" in " ".join(table.replace("\u00a0", " ").split())  # the lead, wrapped


def test_memory_off_records_no_memory_step(tmp_path_factory):
    out = profile(tmp_path_factory, "off", "--preset", "tiny", "--variants", "ddp", "--memory", "off")
    assert not (out / "ddp" / "memory").exists()
    assert "memory_record" not in json.loads((out / "manifest.json").read_text())["variants"]["ddp"]["ranks"][0]


def test_the_memory_record_is_small(run):
    """Each rank's compact record (gzipped) stays small: on the tiny preset, under 32 KiB."""
    for path in run.glob("*/memory/rank?.json.gz"):
        assert path.stat().st_size < 32 * 1024
        assert json.loads(gzip.decompress(path.read_bytes()))["format"] == "tracekit-memory"


WILD_BERT = ROOT / "tests" / "data" / "wild" / "tracelens" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"


def test_a_wild_kineto_trace_peaks_where_the_allocators_own_total_does():
    """A trace from elsewhere (TraceLens' test data, H100, profile_memory): the peak rebuilt from
    the events' bytes equals the largest `Total Allocated` the allocator itself wrote into them
    over the step, and the reserved bytes there its `Total Reserved`."""
    doc = json.loads(gzip.decompress(WILD_BERT.read_bytes()))
    step = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    cuda = [e["args"] for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
            and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    top = max(cuda, key=lambda a: a["Total Allocated"])
    result = CliRunner().invoke(main, ["memory", str(WILD_BERT), "--format", "json"])
    assert result.exit_code == 0, result.output
    rank = json.loads(result.stdout)["ranks"][0]
    assert rank["peak"]["bytes"] == top["Total Allocated"] and rank["peak"]["reserved_bytes"] == top["Total Reserved"]
    assert [p["phase"] for p in rank["phases"]] == [f"step {step['name'].split('#')[1]}"]
