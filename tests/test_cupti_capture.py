"""The `cupti` capture's writer (runners/cupti_capture.py), from synthetic activity records
whose answers are stated by hand: which step and phase each was launched in, its Kineto name."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analyses.phases import launch_context
from tracekit.runners.cupti_capture import MARK_VALUE, demangled, kineto_trace

MS = 1_000_000
T0 = 1_796_145_233_000_000_000  # wall clock ns, as CUPTI gives it
SOFTMAX = ("_ZN43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6320softmax_warp_forwardIN3c108BFloat16ES2_fLi10ELb0ELb0EEEvPT0"
           "_PKT_iiiPKbib")  # from a real CUPTI record (shared/experiments/cupti-capture/fields-sample.json)


def kernel(name, corr, start_ms, end_ms, stream=7):
    return {"kind": "kernel", "name": name, "start": T0 + int(start_ms * MS), "end": T0 + int(end_ms * MS),
            "device_id": 0, "context_id": 1, "stream_id": stream, "correlation_id": corr, "grid_x": 4, "grid_y": 1,
            "grid_z": 1, "block_x": 128, "block_y": 1, "block_z": 1, "registers_per_thread": 32,
            "static_shared_memory": 0, "dynamic_shared_memory": 1024, "queued": 0, "graph_id": 0}


def marker(corr, at_ms):
    return {"kind": "memset", "start": T0 + int(at_ms * MS), "end": T0 + int(at_ms * MS) + 500, "device_id": 0,
            "context_id": 1, "stream_id": 7, "correlation_id": corr, "bytes": 1, "value": MARK_VALUE, "memory_kind": 3}


def two_steps():
    """Two steps of three phases; marks (host wall clock) at 0, 3, 7, 9 ms and 10, 13, 17, 19 ms;
    the markers' correlation ids 10, 20, 30, 40 and 50, 60, 70, 80. Step 1's optimizer kernel
    (correlation 35) runs late, at 11–12 ms, inside step 2's window: it was launched in step 1.
    Correlation 45 was launched between the steps (no step); 5 before the first mark (the
    warm-up step) and 90 after the last: not kept."""
    marks = [(1, [(None, 0), ("forward", 3), ("backward", 7), ("optimizer", 9)]),
             (2, [(None, 10), ("forward", 13), ("backward", 17), ("optimizer", 19)])]
    steps = [(n, [(p, T0 + t * MS) for p, t in m]) for n, m in marks]
    records = [marker(c, t) for c, t in [(10, 0.1), (20, 3.1), (30, 7.5), (40, 9.1), (50, 12.5), (60, 13.1),
                                         (70, 17.1), (80, 19.1)]]
    records += [kernel(SOFTMAX, 11, 0.2, 1.0), kernel("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", 12, 1.0, 2.0),
                kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 13, 1.5, 2.5, stream=73),
                kernel("bwd", 21, 3.2, 7.0), kernel("opt", 35, 11.0, 12.0), kernel("between", 45, 12.0, 12.4),
                kernel("fwd2", 51, 12.6, 13.0), kernel("bwd2", 61, 13.2, 17.0), kernel("opt2", 71, 17.2, 19.0),
                kernel("after", 90, 19.5, 20.0), kernel("warm-up", 5, -3.0, -2.0),
                {"kind": "memcpy", "start": T0 + 4 * MS, "end": T0 + 4 * MS + 1000, "device_id": 0, "context_id": 1,
                 "stream_id": 7, "correlation_id": 22, "bytes": 131072, "copy_kind": 1, "src_kind": 2, "dst_kind": 3},
                {"kind": "memset", "start": T0 + 5 * MS, "end": T0 + 5 * MS + 767, "device_id": 0, "context_id": 1,
                 "stream_id": 7, "correlation_id": 23, "bytes": 4, "value": 0, "memory_kind": 3}]
    return records, steps


def written(tmp_path, records, steps):
    path = tmp_path / "rank0.pt.trace.json.gz"
    trace = kineto_trace(records, [steps], pid=610, tid=610, base_ns=T0 // 10**9 * 10**9,
                         meta={"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}})
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path, trace


def test_each_activity_lands_in_the_step_and_phase_it_was_launched_in(tmp_path):
    path, _ = written(tmp_path, *two_steps())
    trace = tracekit.load(path)
    gpu = trace.gpu.with_row_index("row").join(launch_context(trace), on="row").sort("correlation")
    got = {c: (s, p) for c, s, p in gpu.select("correlation", "step", "phase").iter_rows()}
    # 45 ran outside every marked phase: nothing in the trace places it (docs/metrics.md: unknown)
    assert got == {11: (1, "forward"), 12: (1, "forward"), 13: (1, "forward"), 21: (1, "backward"),
                   22: (1, "backward"), 23: (1, "backward"), 35: (1, "optimizer"), 45: (None, "unknown"),
                   51: (2, "forward"), 61: (2, "backward"), 71: (2, "optimizer")}
    assert trace.steps["step"].to_list() == [1, 2] and trace.calls.height == 0
    assert gpu.height == 11  # nor are the eight markers, the workload's


def test_names_and_fields_are_written_as_kineto_writes_them(tmp_path):
    _, trace = written(tmp_path, *two_steps())
    events = {e["args"]["correlation"]: e for e in trace["traceEvents"] if "correlation" in e.get("args", {})}
    assert events[11]["name"] == ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, "
                                  "float, 10, false, false>(c10::BFloat16*, c10::BFloat16 const*, int, int, int, "
                                  "bool const*, int, bool)")
    assert events[12]["name"] == "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT"  # never C++: as it came
    assert events[11]["args"]["grid"] == [4, 1, 1] and events[11]["args"]["shared memory"] == 1024
    assert (events[11]["pid"], events[11]["tid"], events[13]["tid"]) == (0, 7, 73)
    assert events[22]["name"] == "Memcpy HtoD (Pinned -> Device)" and events[22]["cat"] == "gpu_memcpy"
    assert events[23]["name"] == "Memset (Device)" and events[23]["args"]["bytes"] == 4
    assert events[11]["ts"] == pytest.approx(200.0, abs=1e-6) and events[11]["dur"] == 800.0  # µs since base


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="binutils' c++filt absent")
def test_demangled_names_agree_with_cxxfilt():
    sample = json.loads(open(__file__.replace("test_cupti_capture.py", "data/cupti-fields-sample.json")).read())
    names = [SOFTMAX] + [r["name"] for r in sample if r.get("name", "").startswith("_Z")]
    theirs = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    assert [demangled(n) for n in names] == theirs


def test_a_capture_whose_markers_are_not_the_marks_is_refused(tmp_path):
    records, steps = two_steps()
    with pytest.raises(ValueError, match="7 marker memsets where the runner made 8"):
        kineto_trace(records[1:], [steps], pid=1, tid=1, base_ns=0)


def test_rounds_keep_their_steps_and_drop_the_warm_up_steps_between_them(tmp_path):
    """Two rounds of one step each (`--profile-rounds 2`): the second round's warm-up step
    (correlation 45, launched after round 1's last marker and before round 2's first) is
    dropped, where inside one block it would be kept unplaced (45 in the test above)."""
    records, (first, second) = two_steps()
    path = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(kineto_trace(records, [[first], [second]], pid=610, tid=610, base_ns=T0 // 10**9 * 10**9), f)
    trace = tracekit.load(path)
    assert sorted(trace.gpu["correlation"].to_list()) == [11, 12, 13, 21, 22, 23, 35, 51, 61, 71]
    assert trace.steps["step"].to_list() == [1, 2] and trace.gpu["step"].null_count() == 0


def test_the_profiler_overhead_is_each_rounds_block_against_its_two_neighbours():
    """Control blocks of 100, 120, 140 ms (median steps) around recorded blocks of 121 and 143:
    round 1 121 ÷ 110, round 2 143 ÷ 130, both 1.1; pooling every step would say 123 ÷ 120."""
    from tracekit.runners.worker import profiler_overhead

    got = profiler_overhead([[121.0, 120.0, 125.0], [143.0]], [[100.0], [119.0, 120.0, 121.0], [140.0]])
    assert got == {"profiler_overhead": 1.1, "profiler_overhead_by_round": [1.1, 1.1]}


def test_the_runner_alternates_rounds_and_writes_one_trace_of_their_steps(tmp_path, monkeypatch):
    """`recorded_figures` in cupti mode, 3 rounds of 2 steps, on CPU with a stand-in capture
    (its markers and one kernel per phase as records, numbered from one counter as CUPTI
    numbers calls): the blocks run C R C R C R C, then the `full` naming step; every block
    replays the same batches; one trace holds the 6 recorded steps, each with its 3 kernels."""
    import torch

    from tracekit.runners import worker

    order, batches, counter, state = [], [], iter(range(1, 10**6)), {"batch": 0}

    class Capture:
        def __init__(self, device):
            self.records, self.on, self.dropped = [], False, 0
            state["capture"] = self

        def start(self):
            self.on = True

        def stop(self):
            self.on = False

        def mark(self):
            self.records.append(marker(next(counter), 0))

    def step(clock):
        on = state["capture"].on
        order.append("R" if on else "C")
        batches.append(state["batch"])
        state["batch"] += 1
        clock.start()
        for phase in ("forward", "backward", "optimizer"):
            with clock.phase(phase):
                if on:
                    state["capture"].records.append(kernel(phase, next(counter), 0, 1))

    def back():
        state["batch"] = 0
    monkeypatch.setattr(worker, "capture_mode", lambda mode, device: ("cupti", None))
    monkeypatch.setattr(worker, "DeviceCapture", Capture)
    monkeypatch.setattr("tracekit.runners.cupti_capture.trace_meta", lambda device: {})
    cfg = {"profile_steps": 2, "profile_mode": "cupti", "profile_rounds": 3, "with_stack": False}
    got = worker.recorded_figures(step, back, cfg, torch.device("cpu"), tmp_path, "fsdp2", 0)
    assert "".join(order) == "CCC" + "RRRCCC" * 3 + "CC"  # each block its warm-up step, then 2; names: 1
    assert batches == [0, 1, 2] * 7 + [0, 1]
    assert len(got["profiled_step_ms"]) == 6 and len(got["control_step_ms"]) == 8
    assert len(got["profiler_overhead_by_round"]) == 3 and got["recorded"][0]["rounds"] == 3
    assert [r["trace"] for r in got["recorded"]] == ["fsdp2/rank0.pt.trace.json.gz", "fsdp2/names/rank0.pt.trace.json.gz"]
    trace = tracekit.load(tmp_path / got["trace"])
    assert trace.steps["step"].to_list() == [1, 2, 3, 4, 5, 6]
    assert trace.gpu.group_by("step").len().sort("step")["len"].to_list() == [3] * 6


def test_the_step_time_every_verb_sees_is_the_marks_span(tmp_path):
    """What the loaded trace calls a step is the runner's ProfilerStep#N (wall clock, 9 ms each)."""
    path, _ = written(tmp_path, *two_steps())
    trace = tracekit.load(path)
    spans = trace.steps.select(ms=(pl.col("cpu_end") - pl.col("cpu_start")) / MS)["ms"].to_list()
    assert spans == [9.0, 9.0]


# A real capture: tests/data/h200x1-cupti (README there), through the core and every verb.
REAL = Path(__file__).parent / "data" / "h200x1-cupti"


def cli(*args):
    from click.testing import CliRunner

    from tracekit.front.cli import main

    result = CliRunner().invoke(main, list(map(str, args)))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output[-3000:]
    return result


@pytest.mark.parametrize("variant", ["fsdp1", "fsdp2"])
def test_a_real_capture_has_the_kernels_of_a_kineto_capture_of_the_same_step(variant):
    """Every recorded step holds exactly the kernels (names, as Kineto demangles them, and
    count) of the `full` step that torch.profiler recorded right after (names/: an independent
    capture of the same procedure); every activity has a step and a phase and is named."""
    from tracekit.analyses.naming import named

    trace = tracekit.load(REAL / variant / "rank0.pt.trace.json.gz")
    full = tracekit.load(REAL / variant / "names" / "rank0.pt.trace.json.gz")
    theirs = sorted(full.gpu.filter((pl.col("kind") == "kernel") & (pl.col("step") == full.gpu["step"].max()))["name"])
    kernels = trace.gpu.filter(pl.col("kind") == "kernel")
    assert trace.steps["step"].to_list() == list(range(1, 11))  # 5 rounds of 2 steps (README there)
    for step in range(1, 11):
        assert sorted(kernels.filter(pl.col("step") == step)["name"]) == theirs
    gpu = trace.gpu.with_row_index("row").join(launch_context(trace), on="row")
    assert gpu["step"].null_count() == 0 and gpu["phase"].null_count() == 0
    matched, total = named(trace, full)
    assert matched == total == trace.gpu.height


@pytest.mark.parametrize("variant", ["fsdp1", "fsdp2"])
def test_a_real_captures_steps_span_what_their_cuda_events_measured(variant):
    """Each step's device activity (first start to last end) against the step's CUDA-event time
    (the manifest's `recorded[0].step_ms`, another clock): never longer, and within 1 % except
    where the GPU waited for the first launch after the drain before a round's first step (up
    to 2 %)."""
    manifest = json.loads((REAL / "manifest.json").read_text())
    recorded = manifest["variants"][variant]["ranks"][0]["recorded"][0]
    per_round = manifest["config"]["profile_steps"]
    assert recorded["mode"] == "cupti" and recorded["rounds"] == 5 and len(recorded["step_ms"]) == 5 * per_round
    trace = tracekit.load(REAL / variant / "rank0.pt.trace.json.gz")
    spans = trace.gpu.group_by("step").agg(ms=(pl.col("end").max() - pl.col("start").min()) / 1e6).sort("step")["ms"]
    for step, (traced, timed) in enumerate(zip(spans, recorded["step_ms"]), 1):
        assert traced <= timed * 1.001
        assert traced >= timed * (0.98 if step % per_round == 1 else 0.99), (step, traced, timed)


def test_every_verb_runs_on_a_real_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    for verb in ("summary", "syncs", "comms", "overlap", "breakdown", "kernels", "launches", "lint"):
        cli(verb, "--format", "json", run / "fsdp2")
    by_op = json.loads(cli("kernels", "--by", "op", "--format", "json", run / "fsdp2").stdout)
    ops = {k["op"] for t in by_op["traces"] for s in t["steps"] for k in s["kernels"]}
    assert "aten::mm" in ops and None not in ops  # named from the full step, in a per-step verb too
    cli("export", run / "fsdp2" / "rank0.pt.trace.json.gz", "-o", tmp_path / "t.pftrace")
    diff = json.loads(cli("diff", "--format", "json", run / "fsdp1", run / "fsdp2").stdout)
    assert diff
    cli("report", run)
    assert "1 count matches (1 not recorded by the runtime)" in cli("check", run).output  # fsdp2's is {}; it read "all 1 counts match"


def test_a_named_table_is_not_read_back_from_before_naming(tmp_path, monkeypatch):
    """`report` caches a recording's diff items; a later `diff` names the recording first: it
    must get named items, not the table cached before naming."""
    from tracekit.analyses.diff import all_items
    from tracekit.core import cache
    from tracekit.front.cli.common import named_beside

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = REAL / "fsdp2" / "rank0.pt.trace.json.gz"
    unnamed = all_items(tracekit.load(path))
    cache.writer().submit(lambda: None).result()
    again = tracekit.load(path)
    named_beside(again)
    items = all_items(again)
    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    fresh = tracekit.load(path)
    named_beside(fresh)
    assert unnamed.filter(pl.col("row").is_not_null())["op"].null_count() > 0  # what a stale table looked like
    assert items.sort(items.columns).equals(all_items(fresh).sort(items.columns))


def test_reading_the_cache_prints_nothing(tmp_path, monkeypatch, capfd):
    """polars 1.31 warned "Could not memory_map compressed IPC file" once per table read."""
    from tracekit.core import cache

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = REAL / "fsdp2" / "rank0.pt.trace.json.gz"
    tracekit.load(path)
    cache.writer().submit(lambda: None).result()
    capfd.readouterr()
    cached = tracekit.load(path)
    from tracekit.analyses.timeline import timeline
    timeline(cached, "step")
    cache.writer().submit(lambda: None).result()
    timeline(tracekit.load(path), "step")
    assert capfd.readouterr().err == ""


def test_the_reconciliations_step_row_is_the_recorded_steps_delta():
    """The step row sums every item, those in no phase (`host: other`) too: it equals B − A of
    the two recorded steps' spans (`step_delta_ns`, measured from the steps, not the items).
    With 5 timed steps the verdicts are `too few steps`: no "unexplained" warning then."""
    from click.testing import CliRunner

    from tracekit.front.cli import main

    result = CliRunner().invoke(main, ["diff", "--format", "json", str(REAL / "fsdp1"), str(REAL / "fsdp2")])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    step = next(r for r in out["reconciliation"] if r["phase"] == "step")
    assert step["attributed_d_ms"] == pytest.approx(out["step_delta_ns"] / 1e6, abs=1e-3)
    assert {r["verdict"] for r in out["reconciliation"]} == {"too few steps"}
    assert "unexplained" not in result.stderr


def test_the_lead_never_says_minus_zero():
    from tracekit.analyses.lead import more_or_less, signed_ms

    assert (signed_ms(-0.0004), signed_ms(0.0004), signed_ms(-1.234)) == ("0.000 ms", "0.000 ms", "−1.23 ms")
    assert (more_or_less(-0.0004), more_or_less(2.5)) == ("as long (to 0.001 ms)", "2.50 ms more")


def test_without_cupti_python_the_recording_falls_back_to_device_saying_why(monkeypatch):
    """Here cupti-python is not installed: on CUDA the runner would record in `device` mode
    with a one-line reason; off CUDA `cupti` records as `device` (lean there), silently."""
    import torch

    from tracekit.runners import worker
    from tracekit.runners.cupti_capture import why_unavailable

    try:
        import cupti  # noqa: F401
        pytest.skip("cupti-python is installed here")
    except ImportError:
        pass
    reason = why_unavailable()
    assert reason.startswith("cupti-python is not importable") and "\n" not in reason
    assert worker.capture_mode("cupti", torch.device("cpu")) == ("device", None)
    assert worker.capture_mode("cupti", torch.device("cuda", 0)) == ("device", reason)
    assert worker.capture_mode("full", torch.device("cuda", 0)) == ("full", None)


def test_a_device_only_captures_critical_path_says_its_gaps_are_not_explained():
    """A `cupti` recording holds no runtime call: the gaps between its device work are waits
    the trace cannot explain (a launch or another stream), named so, never `stream order`,
    which in a trace with launches means the stream itself was busy. A `device` recording of
    the same kind of step (launches recorded) keeps `stream order`."""
    from tracekit.analyses.critical_path import critical_path

    def waits(trace):
        items = critical_path(trace, top=None).explode("items").unnest("items")
        return set(items.filter(pl.col("category") == "waiting")["kind"].drop_nulls())

    cupti = tracekit.load(REAL / "fsdp1" / "rank0.pt.trace.json.gz")
    assert cupti.calls.height == 0 and cupti.gpu.height > 0
    assert "stream gap, launch not recorded" in waits(cupti) and "stream order" not in waits(cupti)
    device = tracekit.load(REAL.parent / "h200x1-device" / "fsdp2" / "rank0.pt.trace.json.gz")
    assert device.calls.height > 0 and "stream gap, launch not recorded" not in waits(device)


class Recorded:
    """A finished capture as `write_trace` reads it: its records and CUPTI's dropped count."""

    def __init__(self, records, dropped=0):
        self.records, self.dropped = records, dropped


def through_the_writer(tmp_path, monkeypatch, records, steps, dropped=0):
    """`write_trace` of the records (the writer the runner calls), then the trace loaded."""
    from tracekit.runners import cupti_capture

    monkeypatch.setattr(cupti_capture, "trace_meta", lambda device: {})
    path = tmp_path / "rank0.pt.trace.json.gz"
    lost = cupti_capture.write_trace(path, Recorded(records, dropped), [steps], None)
    with gzip.open(path, "rt") as f:
        return lost, json.load(f), tracekit.load(path)


def test_a_record_cupti_could_not_time_is_left_out_counted_and_warned(tmp_path, monkeypatch, capsys):
    """A kernel with start = end = 0 (CUPTI: timestamp not collected) among the two steps:
    before, the trace's base time became 0 and step 1's GPU span ~1.8e12 ms; now the record
    is left out, the base is the second before the first timed record, and it is said."""
    records, steps = two_steps()
    records.append({**kernel("untimed", 14, 0, 0), "start": 0, "end": 0})
    lost, doc, trace = through_the_writer(tmp_path, monkeypatch, records, steps)
    assert doc["baseTimeNanoseconds"] == (T0 - 3 * MS) // 10**9 * 10**9  # the warm-up kernel, at −3 ms
    assert lost["untimed_records"] == 1 and "untimed" not in trace.gpu["name"].to_list()
    span = trace.gpu.filter(pl.col("step") == 1).select((pl.col("end").max() - pl.col("start").min()) / MS).item()
    assert span == pytest.approx(11.8)  # 0.2 to 12.0 ms: the late optimizer kernel is step 1's
    assert "1 records CUPTI could not time (start = end = 0) left out" in capsys.readouterr().err


def test_records_cupti_dropped_are_counted_warned_and_linted(tmp_path, monkeypatch, capsys):
    """CUPTI's dropped count (12, as `DeviceCapture.stop` reads it) reaches the runner, stderr,
    the trace's name and `lint`'s `cupti_dropped_records` warning."""
    from tracekit.analyses.lint import trace_findings

    lost, doc, trace = through_the_writer(tmp_path, monkeypatch, *two_steps(), dropped=12)
    assert lost["dropped_records"] == 12 and doc["tracekitCapture"]["dropped_records"] == 12
    assert "CUPTI dropped 12 records" in capsys.readouterr().err
    found = trace_findings(trace).filter(pl.col("kind") == "cupti_dropped_records")
    assert found.select("severity", "count").rows() == [("warning", 12)]
    _, _, clean = through_the_writer(tmp_path, monkeypatch, *two_steps())
    assert "cupti_dropped_records" not in trace_findings(clean)["kind"].to_list()


def test_work_another_thread_launched_during_a_phase_keeps_its_step_not_the_phase(tmp_path, monkeypatch, capsys):
    """The runner's thread's calls carry an external correlation record; a copy launched by
    another thread (correlation 24, inside step 1's backward range, none) keeps step 1 but no
    phase (`unknown`), and is counted; before, it was put into the backward."""
    from tracekit.analyses.lint import trace_findings

    records, steps = two_steps()
    records.append({"kind": "memcpy", "start": T0 + 6 * MS, "end": T0 + 6 * MS + 1000, "device_id": 0,
                    "context_id": 1, "stream_id": 9, "correlation_id": 24, "bytes": 4096, "copy_kind": 1,
                    "src_kind": 2, "dst_kind": 3})
    records += [{"kind": "external", "correlation_id": r["correlation_id"], "external_id": 610}
                for r in records if r["correlation_id"] != 24]
    lost, _, trace = through_the_writer(tmp_path, monkeypatch, records, steps)
    gpu = trace.gpu.with_row_index("row").join(launch_context(trace), on="row")
    got = {c: (s, p) for c, s, p in gpu.select("correlation", "step", "phase").iter_rows()}
    assert got[24] == (1, "unknown") and got[22] == (1, "backward") and got[51] == (2, "forward")
    assert lost["other_thread_activities"] == 1 and lost["threads"] == "told"
    assert "1 activities launched by other threads" in capsys.readouterr().err
    # without any external record (CUPTI gave none) nothing is told apart, and the trace says so
    _, doc, unmarked = through_the_writer(tmp_path, monkeypatch, *two_steps())
    assert doc["tracekitCapture"]["threads"] == "not told"
    assert "cupti_threads_not_told" in trace_findings(unmarked)["kind"].to_list()
    assert "cupti_threads_not_told" not in trace_findings(trace)["kind"].to_list()
