"""The interleaved comparison (runners/interleave.py, docs/profile.md "Comparing variants"): the
rotation the blocks run in, the rounds each variant's figures are grouped into, the recorded
rounds taken in the same rotation, the A/A control, and the sequential fallback — the loops with
stand-in trainees, then real CPU runs (gloo, 2 ranks) through the command."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch

import tracekit

READING = {"host": {"forward": 1.0, "backward": 1.0, "optimizer": 1.0, "step": 3.0}, "device": None}


def stand_in_trainees(monkeypatch, ran: list[str]):
    """Trainees that train nothing: each block appends its variant to `ran` and its steps take
    the next numbers of one counter as their times, so a step's time says when it ran."""
    from tracekit.runners import interleave

    clock = itertools.count(1)

    class Trainee:
        def __init__(self, variant, cfg, rank, device, say=None, built=lambda: None):
            self.variant = variant
            built()

        def warm_up(self):
            pass

        def timed_work(self, recompiled, saved):
            return lambda clock: None

        def run_steps(self, works, label):
            ran.append(self.variant)
            return [float(next(clock)) for _ in works], [READING] * len(works), 1.0

        def figures(self, times, readings, wall, phases, saved, recompiled):
            return {"step_ms": {"all": times}}

        def resident_bytes(self):
            return 0
    monkeypatch.setattr(interleave, "Trainee", Trainee)


def test_blocks_run_in_mirrored_rounds_and_each_round_holds_both_blocks_of_a_variant(monkeypatch):
    """Two variants, 3 rounds of blocks of 2: a b b a, then b a a b, then a b b a; round r of a
    variant holds the steps of its two blocks in that round (times = the order they ran in)."""
    from tracekit.runners.interleave import run_interleaved

    ran: list[str] = []
    stand_in_trainees(monkeypatch, ran)
    cfg = {"block_steps": 2, "rounds": 3, "profile_steps": 0}
    got = run_interleaved(["a", "b"], cfg, 0, torch.device("cpu"), None, False)
    assert ran == ["a", "b", "b", "a", "b", "a", "a", "b", "a", "b", "b", "a"]
    assert [r["step_ms"] for r in got["a"]["rounds"]] == [[1, 2, 7, 8], [11, 12, 13, 14], [17, 18, 23, 24]]
    assert [r["step_ms"] for r in got["b"]["rounds"]] == [[3, 4, 5, 6], [9, 10, 15, 16], [19, 20, 21, 22]]
    assert [r["positions"] for r in got["a"]["rounds"]] == [[0, 3], [1, 2], [0, 3]]
    assert got["a"]["step_ms"]["all"] == [1, 2, 7, 8, 11, 12, 13, 14, 17, 18, 23, 24]
    assert got["b"]["rounds"][1]["phase_ms"]["host"]["step"] == [3.0] * 4 and got["b"]["peak_allocated_bytes"] is None


def test_recorded_rounds_alternate_the_variants_and_each_trace_numbers_its_rounds(tmp_path, monkeypatch):
    """cupti mode with a stand-in capture, 2 variants, 3 recorded rounds of 1 step: each round
    runs a control block then a recorded block of each variant, a b in even rounds and b a in
    odd ones; then a control block each; then each variant's `full` naming step. Each trace
    holds its 3 rounds' steps, numbered 1..3; `steps_per_round` says how they group."""
    from tracekit.runners import interleave, worker
    from test_cupti_capture import kernel, marker

    blocks, counter, state = [], itertools.count(1), {}

    class Capture:
        def __init__(self, device):
            self.records, self.on, self.dropped = [], False, 0

        def start(self):
            self.on = True
            state["on"] = self

        def stop(self):
            self.on = False
            state.pop("on")

        def mark(self):
            self.records.append(marker(next(counter), 0))

    class Trainee:
        def __init__(self, variant):
            self.variant = variant

        def step(self, clock):
            capture = state.get("on")
            blocks.append((self.variant, "R" if capture else "C"))
            clock.start()
            for phase in ("forward", "backward", "optimizer"):
                with clock.phase(phase):
                    if capture:
                        capture.records.append(kernel(phase, next(counter), 0, 1))

        def bookmark(self):
            return lambda: None
    monkeypatch.setattr(worker, "capture_mode", lambda mode, device: ("cupti", None))
    monkeypatch.setattr(worker, "DeviceCapture", Capture)
    monkeypatch.setattr("tracekit.runners.cupti_capture.trace_meta", lambda device: {})
    cfg = {"profile_steps": 1, "profile_mode": "cupti", "profile_rounds": 3, "with_stack": False}
    got = interleave.recorded_rounds({"a": Trainee("a"), "b": Trainee("b")}, cfg, torch.device("cpu"), tmp_path, 0)
    # every block: the profiler's warm-up step, then its 1 step
    expected = [("a", "C"), ("a", "R"), ("b", "C"), ("b", "R"),  # round 0
                ("b", "C"), ("b", "R"), ("a", "C"), ("a", "R"),  # round 1
                ("a", "C"), ("a", "R"), ("b", "C"), ("b", "R"),  # round 2
                ("a", "C"), ("b", "C"),  # the last control blocks
                ("a", "C"), ("b", "C")]  # the naming steps (full mode: no capture)
    assert blocks[::2] == expected and blocks[1::2] == expected
    for variant in ("a", "b"):
        assert got[variant]["recorded"][0]["rounds"] == 3 and got[variant]["recorded"][0]["steps_per_round"] == 1
        assert len(got[variant]["profiler_overhead_by_round"]) == 3 and len(got[variant]["control_step_ms"]) == 4
        trace = tracekit.load(tmp_path / got[variant]["trace"])
        assert trace.steps["step"].to_list() == [1, 2, 3]
        assert trace.gpu.group_by("step").len().sort("step")["len"].to_list() == [3, 3, 3]


def run(tmp_path, *args, env=None):
    import os

    out = tmp_path / "run"
    command = ["profile", "--device", "cpu", "--nproc", "2", "--preset", "tiny", "--warmup", "1", "--no-report",
               "--out", str(out), *map(str, args)]
    result = subprocess.run([sys.executable, "-m", "tracekit", *command], capture_output=True, text=True,
                            timeout=600, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    return out, json.loads((out / "manifest.json").read_text()), result.stderr


@pytest.fixture(scope="module")
def with_control(tmp_path_factory):
    return run(tmp_path_factory.mktemp("interleaved"), "--variants", "ddp,fsdp2", "--control", "--rounds", 2,
               "--block-steps", 2, "--profile-steps", 1)


def test_every_variant_and_the_control_ran_side_by_side_in_lockstep_on_both_ranks(with_control):
    out, manifest, stderr = with_control
    assert manifest["comparison"] == {
        "design": "interleaved", "note": "", "control": "ddp-control", "block_steps": 2, "rounds": 2,
        "order": [["ddp", "fsdp2", "ddp-control", "ddp-control", "fsdp2", "ddp"],
                  ["ddp-control", "fsdp2", "ddp", "ddp", "fsdp2", "ddp-control"]]}
    assert list(manifest["variants"]) == ["ddp", "fsdp2", "ddp-control"]
    assert manifest["variants"]["ddp-control"]["control_of"] == "ddp"
    assert "control_of" not in manifest["variants"]["ddp"] and "repeats" not in manifest["variants"]["ddp"]
    for variant, entry in manifest["variants"].items():
        assert entry["status"] == "ok" and [r["rank"] for r in entry["ranks"]] == [0, 1]
        for r in entry["ranks"]:
            assert [x["round"] for x in r["rounds"]] == [0, 1]
            assert [len(x["step_ms"]) for x in r["rounds"]] == [4, 4]  # two blocks of 2 a round
            assert [s for x in r["rounds"] for s in x["step_ms"]] == r["step_ms"]["all"]
            assert [sorted(x["positions"]) for x in r["rounds"]] == \
                [sorted(i for i, v in enumerate(o) if v == variant) for o in manifest["comparison"]["order"]]
            assert [x["mode"] for x in r["recorded"]] == ["device", "full"]
        for rank in (0, 1):
            trace = tracekit.load(out / variant / f"rank{rank}.pt.trace.json.gz")
            assert trace.rank == rank and trace.world_size == 2 and trace.steps["step"].to_list() == [1]
    # the same model and data in every variant: the first step's loss is the same
    losses = {round(e["ranks"][0]["first_step"]["loss"], 5) for e in manifest["variants"].values()}
    assert len(losses) == 1
    assert "ddp, fsdp2, ddp-control side by side: building" in stderr


def test_check_passes_on_an_interleaved_run(with_control):
    out, _, _ = with_control
    result = subprocess.run([sys.executable, "-m", "tracekit", "check", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_variants_that_do_not_fit_together_fall_back_to_running_one_after_another(tmp_path):
    """fsdp2 runs out of memory when built (the OOM test hook): the interleaved run fails, the
    variants then run one by one, and the manifest says so; ddp is measured, fsdp2 is oom."""
    _, manifest, stderr = run(tmp_path, "--variants", "ddp,fsdp2", "--rounds", 1, "--block-steps", 1,
                              "--steps", 2, "--profile-steps", 0, env={"TRACEKIT_OOM": "fsdp2@tiny:1"})
    comparison = manifest["comparison"]
    assert comparison["design"] == "sequential" and comparison["control"] is None
    assert comparison["note"].startswith("the interleaved run failed (oom: rank ")
    assert comparison["note"].endswith("the variants ran one after another")
    assert manifest["variants"]["ddp"]["status"] == "ok" and manifest["variants"]["fsdp2"]["status"] == "oom"
    assert len(manifest["variants"]["ddp"]["ranks"][0]["step_ms"]["all"]) == 2  # --steps, sequential
    assert "the variants run one after another instead" in stderr


@pytest.mark.parametrize(("options", "design", "note"), [
    ({}, "interleaved", ""),
    ({"repeats": 3}, "sequential", "--repeats 3"),
    ({"checkpoint": "sync"}, "sequential", "--checkpoint"),
    ({"variants": ["ddp", "lightning-ddp"]}, "sequential", "Lightning variants (lightning-ddp) own their process"),
    ({"compare": "sequential"}, "sequential", "--compare sequential"),
    ({"compare": "interleaved"}, "interleaved", ""),
])
def test_the_design_is_interleaved_unless_the_options_or_variants_are_the_sequential_ones(options, design, note):
    from tracekit.runners.launch import comparison_design

    o = {"variants": ["ddp", "fsdp2"], "repeats": 1, "checkpoint": None, "compare": None, **options}
    assert comparison_design(o) == (design, note)


@pytest.mark.parametrize(("args", "message"), [
    (["--compare", "interleaved", "--repeats", "3"], "--repeats 3 repeats the sequential comparison"),
    (["--rounds", "0"], "--rounds and --block-steps must be at least 1"),
    (["--compare", "interleaved", "--checkpoint", "sync"], "--checkpoint times saves in the sequential comparison"),
])
def test_options_of_the_other_design_are_one_line_and_exit_2(tmp_path, args, message):
    result = subprocess.run([sys.executable, "-m", "tracekit", "profile", "--device", "cpu", *args,
                             "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()
