"""The runner's marks written into a recording that has no CPU side (`device` mode on CUDA):
checked against torch's own annotations of the same steps, recorded on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from tracekit.runners.clock import PhaseClock
from tracekit.runners.recording import profiler, with_marks


def recorded_steps(tmp_path, steps: int = 3):
    """`steps` small CPU steps recorded in `lean` mode (torch writes `ProfilerStep#N` and the
    clock's `tracekit#<phase>` annotations itself); the exported trace and each step's clock."""
    x = torch.randn(256, 256)
    path = tmp_path / "trace.json"
    clocks = []

    def step(clock):
        clock.start()
        for phase in ("forward", "backward", "optimizer"):
            with clock.phase(phase):
                for _ in range(20):
                    x.mul_(1.0001)
    with profiler(torch.device("cpu"), "lean", steps, False, lambda p: p.export_chrome_trace(str(path))) as prof:
        step(PhaseClock(torch.device("cpu")))
        prof.step()
        for _ in range(steps):
            clock = PhaseClock(torch.device("cpu"))
            step(clock)
            clocks.append(clock)
            prof.step()
    return json.loads(path.read_text()), clocks


def spans(events, source):
    """name → [(start µs, end µs)] of the user annotations from `source` (None: torch's)."""
    out = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("args", {}).get("source") == source:
            out.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
    return out


def test_marks_land_where_torch_recorded_the_same_steps_and_phases(tmp_path):
    """A phase's mark span runs from the previous mark to its own, so it holds torch's
    `tracekit#<phase>` annotation (entered after the previous mark, left before its own), by
    under 2 ms each side; a step's span (first mark to last) lies inside torch's
    `ProfilerStep#N` (which runs from one `prof.step()` to the next)."""
    trace, clocks = recorded_steps(tmp_path)
    marked = with_marks({**trace, "traceEvents": []}, [(i + 1, c.span(), c.spans()) for i, c in enumerate(clocks)])
    ours = spans(marked["traceEvents"], "tracekit runner (phase clocks, wall clock)")
    theirs = spans(trace["traceEvents"], None)
    for phase in ("forward", "backward", "optimizer"):
        name = f"tracekit#{phase}"
        assert len(ours[name]) == len(theirs[name]) == 3  # the profiler's warm-up step is not kept
        for (start, end), (t_start, t_end) in zip(ours[name], theirs[name]):
            assert 0 <= t_start - start < 2000 and 0 <= end - t_end < 2000, (phase, start, t_start, end, t_end)
    for n in (1, 2, 3):
        (start, end), = ours[f"ProfilerStep#{n}"]
        (t_start, t_end), = theirs[f"ProfilerStep#{n}"]
        assert t_start <= start < end <= t_end


def test_marks_are_added_to_the_trace_as_it_was(tmp_path):
    trace, clocks = recorded_steps(tmp_path, steps=1)
    marked = with_marks(trace, [(1, clocks[0].span(), clocks[0].spans())])
    assert marked["traceEvents"][:len(trace["traceEvents"])] == trace["traceEvents"]
    assert len(marked["traceEvents"]) == len(trace["traceEvents"]) + 4  # the step and its three phases
    assert {k: v for k, v in marked.items() if k != "traceEvents"} == {k: v for k, v in trace.items() if k != "traceEvents"}


@pytest.mark.parametrize("mode", ["device", "lean"])
def test_off_cuda_device_mode_records_what_lean_does(mode):
    prof = profiler(torch.device("cpu"), mode, 1, False, lambda p: None)
    assert [a.name for a in prof.activities] == ["CPU"]


def test_a_real_device_recording_gets_its_steps_and_phases_from_the_runners_marks():
    """A real `device`-mode recording (tests/data/h200x1-device: CUDA activities only, the marks
    written in by the runner): every GPU activity falls in one of the three steps and in a
    phase; each step's GPU activity spans what the step's CUDA events measured (the manifest's
    `recorded[0].step_ms`, an independent clock) within 1 %; on the device the phases follow
    one another (forward, backward, optimizer) with the same activities in every step."""
    from pathlib import Path

    import polars as pl

    import tracekit
    from tracekit.analyses.phases import launch_context

    folder = Path(__file__).parent / "data" / "h200x1-device"
    trace = tracekit.load(folder / "fsdp2" / "rank0.pt.trace.json.gz")
    events = json.loads((folder / "manifest.json").read_text())["variants"]["fsdp2"]["ranks"][0]["recorded"][0]
    assert events["mode"] == "device" and trace.steps["step"].to_list() == [1, 2, 3]
    gpu = trace.gpu.with_row_index("row").join(launch_context(trace), on="row")
    assert gpu["step"].null_count() == 0 and gpu["phase"].null_count() == 0
    spans = gpu.group_by("step").agg(ms=(pl.col("end").max() - pl.col("start").min()) / 1e6).sort("step")["ms"]
    for traced, timed in zip(spans, events["step_ms"]):
        assert traced == pytest.approx(timed, rel=0.01)
    phases = gpu.group_by("step", "phase").agg(pl.len(), first=pl.col("start").min(), last=pl.col("end").max())
    for _, rows in phases.group_by("step"):
        rows = rows.sort("first")
        assert rows["phase"].to_list() == ["forward", "backward", "optimizer"]
        assert (rows["last"].head(2) <= rows["first"].tail(2)).all()
    assert phases.group_by("phase").agg(pl.col("len").n_unique())["len"].to_list() == [1, 1, 1]
