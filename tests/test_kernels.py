"""`tracekit kernels` against a plain scan of the trace JSON (docs/metrics.md)."""

import gzip
import json
from collections import defaultdict

import pytest
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


def op_rate(path, op, step=1):
    """TFLOP/s of `op` in ProfilerStep#step by reading the JSON: Σ 2·M·N·K (+ M·N for addmm's
    bias) over its instances that launched a kernel in the step, over Σ those kernels' durations
    (the op's memsets left out)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    (window,) = [e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("cat") == "user_annotation"]
    lo, hi = window["ts"], window["ts"] + window["dur"]
    kernel = {e["args"]["correlation"]: e for e in events if e.get("cat") == "kernel"}
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and lo <= e["ts"] < hi
             and e.get("args", {}).get("correlation") in kernel]
    flops = ns = 0
    for o in (e for e in events if e.get("cat") == "cpu_op" and e["name"] == op):
        inside = [kernel[c["args"]["correlation"]] for c in calls if c["tid"] == o["tid"]
                  and o["ts"] <= c["ts"] and c["ts"] + c["dur"] <= o["ts"] + o["dur"]]
        if not inside:
            continue
        dims = o["args"]["Input Dims"]
        (m, k), (_, n) = (dims[1], dims[2]) if op == "aten::addmm" else (dims[0], dims[1])
        flops += 2 * m * n * k + (m * n if op == "aten::addmm" else 0)
        ns += sum(round(e["dur"] * 1000) for e in inside)
    return flops / ns / 1e3


def test_by_op_gives_matmul_ops_their_flops_over_their_compute_time():
    """`aten::mm` and `aten::addmm` launch a memset beside their GEMMs (category `mixed`): their
    TFLOP/s is still their FLOPs over their kernels' time, as a scan of the JSON finds, and %
    of the H200's bf16 peak (989.4). Before: null, for the memset."""
    path = DATA / "h200x2-blocks4" / "fsdp1" / "rank0.pt.trace.json.gz"
    (trace,) = kernels("--by", "op", "--rank", 0, "--top", 100, path.parent)
    ops = {g["op"]: g for g in trace["steps"][0]["kernels"]}
    assert trace["steps"][0]["peak_sku"] == "H200 SXM"
    for op in ("aten::mm", "aten::addmm"):
        assert ops[op]["category"] == "mixed"
        assert ops[op]["tflops"] == pytest.approx(op_rate(path, op), abs=0.006)
        assert ops[op]["pct_peak"] == pytest.approx(ops[op]["tflops"] / 989.4 * 100, abs=0.01)
    attention = ops["aten::_cudnn_attention_backward"]
    assert attention["category"] == "mixed" and 0 < attention["pct_peak"] <= 100
