"""`tracekit kernels` against a plain scan of the trace JSON (docs/metrics.md)."""

import gzip
import json
from collections import defaultdict

from click.testing import CliRunner
from conftest import DATA

from tracekit.front.cli import main

FSDP2 = DATA / "h200x2-blocks4" / "fsdp2"


def scanned(path, step=1):
    """{(name): [count, total ns]} of the device activities launched in ProfilerStep#step, by
    reading the JSON: launches whose call starts inside the step's window, durations in ns."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    (window,) = [e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("cat") == "user_annotation"]
    lo, hi = window["ts"], window["ts"] + window["dur"]
    launched = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {}) and lo <= e["ts"] < hi}
    out = defaultdict(lambda: [0, 0])
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("correlation") in launched:
            out[e["name"]][0] += 1
            out[e["name"]][1] += round(e["dur"] * 1000)
    return out


def kernels(*args):
    result = CliRunner().invoke(main, ["kernels", "--format", "json", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["traces"]


def test_the_top_kernel_is_what_a_plain_scan_finds():
    for trace in kernels(FSDP2):
        want = scanned(FSDP2 / f"rank{trace['rank']}.pt.trace.json.gz")
        name, (count, total) = max(want.items(), key=lambda kv: kv[1][1])
        (step,) = trace["steps"]
        top = step["kernels"][0]
        assert (top["name"], top["count"], top["total_ns"]) == (name, count, total)
        assert top["mean_ns"] == round(total / count)
        assert top["pct_of_busy"] == round(total / step["gpu_busy_ns"] * 100, 2)
        assert len(step["kernels"]) == 10  # --top 10


def test_by_category_adds_up_to_every_activity():
    (trace,) = kernels("--by", "category", "--rank", 0, "--top", 100, FSDP2)
    want = scanned(FSDP2 / "rank0.pt.trace.json.gz")
    groups = trace["steps"][0]["kernels"]
    assert sum(g["count"] for g in groups) == sum(c for c, _ in want.values())
    assert sum(g["total_ns"] for g in groups) == sum(t for _, t in want.values())
    assert {(g["category"], g["coll_kind"]) for g in groups if g["category"] == "comm"} == {
        ("comm", "all_gather"), ("comm", "reduce_scatter")}


def test_by_op_names_the_launching_op():
    (trace,) = kernels("--by", "op", "--rank", 0, FSDP2)
    ops = {g["op"]: g for g in trace["steps"][0]["kernels"]}
    assert ops["record_param_comms"]["category"] == "comm" and ops["record_param_comms"]["count"] == 15
