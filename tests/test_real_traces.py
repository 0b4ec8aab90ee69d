"""Real H200 traces: the trace alone reproduces what the runtime counted in the recorded step."""

import json

import pytest
from click.testing import CliRunner
from conftest import DATA

from tracekit.front.cli import main

H200 = DATA / "h200x2-small"
TRACES = sorted(H200.glob("*/rank*.trace.json.gz"))
TRUTH_KEYS = {"Event.synchronize": ("syncs", "cudaEventSynchronize"),
              "all_gather_into_tensor": ("collectives", "all_gather"),
              "reduce_scatter_tensor": ("collectives", "reduce_scatter")}


@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name[:5]}")
def test_summary_matches_runtime_counts(path):
    truth = json.loads((path.parent / f"truth_{path.name.split('.')[0]}.json").read_text())
    result = CliRunner().invoke(main, ["summary", "--format", "json", str(path)])
    assert result.exit_code == 0, result.output
    (trace,) = json.loads(result.stdout)["traces"]
    assert trace["rank"] == truth["rank"] and trace["world_size"] == truth["world"]
    (step,) = trace["steps"]
    assert step["step"] == 1
    counts = truth["runtime_counts_in_profiled_step"]
    for key, (group, field) in TRUTH_KEYS.items():
        assert step[group].get(field, 0) == counts.get(key, 0), (key, step[group])
    assert step["gpu_busy_ns"] <= step["gpu_span_ns"]
