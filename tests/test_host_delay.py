"""The injected-host-delay oracle (examples/host_delay.py, docs/runs/host_delay.sh).

On the GPU, `diff A B` of the two factories must name the delay's region as the largest idle
item. On CPU the step has no device idle (a CPU-only trace's step is split among its
outermost host ops, `diff.host_items`: the runner's `tracekit#<phase>` marks), so the naming
is tested here on a synthetic cupti + full pair whose answer is worked out by hand, and the
workload itself on CPU: B spends the delay inside the named region, A is B without it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner
from test_align import full, recorded

from tracekit.front.cli import main
from tracekit.runners.factories import import_file, load_factory

EXAMPLE = str(Path(__file__).parents[1] / "examples" / "host_delay.py")


def test_diff_names_the_injected_region_as_the_largest_idle_item(tmp_path):
    """A: the pair of test_align (a 4 ms gap k1 → k2; its full window 54 µs). B: the same with
    a 50 µs region `example::host_delay` in the full window (104 µs) and the recorded gap 4 ms
    longer (8 ms). B's gap splits 8 ms × 50/104 = 3,846,153.8 ns to the region (largest
    remainders: 3,846,154); A has none: Δ +3.846 ms, the largest item. The rest of the 4 ms
    goes to the other names' larger shares of the longer gap (proportional rule, metrics.md)."""
    for side, region, late in (("a", None, 0.0), ("b", ("example::host_delay", 50.0), 4.0)):
        (tmp_path / side).mkdir()
        recorded(tmp_path / side, late_ms=late)
        full(tmp_path / side, region)
    result = CliRunner().invoke(main, ["diff", "--format", "json", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    items = answer["items"]
    largest = max(items, key=lambda i: abs(i["delta_ns"]))
    assert (largest["kind"], largest["name"], largest["delta_ns"]) == ("idle", "host: example::host_delay", 3846154)
    assert sum(i["delta_ns"] for i in items) == answer["step_delta_ns"] == 4_000_000


def test_b_spends_the_delay_in_the_named_region_and_a_is_b_without_it():
    """On CPU under torch.profiler: one forward of B holds `example::host_delay` once, at least
    DELAY_MS long and with no op inside; A has no such region and computes the same outputs
    from the same seed."""
    host_delay = import_file(EXAMPLE)
    outputs, regions = {}, {}
    for side in ("plain", "delayed"):
        torch.manual_seed(0)
        work = load_factory(f"{EXAMPLE}:{side}", {})()
        x, _ = work.batch(0, 0, torch.device("cpu"))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            outputs[side] = work.model(x)
        regions[side] = [e for e in prof.events() if e.name == host_delay.REGION]
    assert regions["plain"] == [] and len(regions["delayed"]) == 1
    region = regions["delayed"][0]
    assert region.time_range.elapsed_us() >= host_delay.DELAY_MS * 1000 and region.cpu_children == []
    assert torch.equal(outputs["plain"], outputs["delayed"])


REAL = Path(__file__).parents[1] / "docs" / "runs" / "h100x1" / "host-delay"


def real_diff(a: str, b: str) -> dict:
    result = CliRunner().invoke(main, ["diff", "--format", "json", "--top", "100000", str(REAL / a / "fsdp2"),
                                       str(REAL / b / "fsdp2")])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_on_the_gpu_the_injected_delay_is_named_within_15_percent_and_decided():
    """The oracle's GPU run (one H100, docs/runs/README.md "Host causes of device idle"): B
    busy-waits 5 ms (TRACEKIT_EXAMPLE_DELAY_MS's default) in `example::host_delay` every forward,
    A is B without it, A2 is A again; the default cupti recording, named from each `full` step.
    B − A: the region is the largest idle item, within ±15 % of 5 ms, its interval over the
    recorded steps above 0; A2 − A: no idle item outside noise above 0.5 ms. The items sum
    exactly to the step's Δ on both."""
    ab, aa = real_diff("A", "B"), real_diff("A", "A2")
    for d in (ab, aa):
        assert sum(i["delta_ns"] for i in d["items"]) == d["step_delta_ns"]
    idle = sorted((i for i in ab["items"] if i["kind"] == "idle"), key=lambda i: -abs(i["delta_ns"]))
    top = idle[0]
    assert top["name"] == "host: example::host_delay" and abs(top["delta_ns"] - 5_000_000) <= 750_000
    assert top["delta_lo_ns"] > 0 and not top["within_noise"]
    assert [i["name"] for i in aa["items"] if i["kind"] == "idle" and abs(i["delta_ns"]) > 500_000
            and not i["within_noise"]] == []
