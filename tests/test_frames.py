"""Python frames and annotations where no CPU op says what the host was doing (issue 67, item
7): idle blamed on the innermost frame that says something, not on `<frozen runpy>`; `kernels
--by op` naming the frame or annotation that launched device work outside every op (a CUDA
graph's replay), or why there is none."""

from __future__ import annotations

import gzip
import json

import polars as pl
from conftest import DATA

import synth
import tracekit
from tracekit.analyses.kernels import NO_CALL, kernels
from tracekit.analyses.timeline import timeline

TRACELENS = DATA / "wild" / "tracelens"


def frame(name, ts, dur):
    return synth.op(name, ts, dur, cat="python_function")


def test_idle_is_blamed_on_the_innermost_frame_that_says_something(tmp_path):
    """A with_stack step: `<frozen runpy>` ⊃ `train.py(234): <module>` ⊃ `train_step` (10–90 µs)
    ⊃ `_call_impl` (20–40 µs). The device idles from 10 to 60 µs: 20 µs in `_call_impl`, 1 µs in
    the launch, 29 µs in `train_step` alone (a frame named by its file's last two path
    components). Before: all 50 µs on `<frozen runpy>`."""
    events = [synth.step(1, 0.0, 100.0),
              frame("<frozen runpy>(198): _run_module_as_main", 0.0, 100.0),
              frame("train.py(234): <module>", 1.0, 98.0),
              frame("train.py(88): train_step", 10.0, 80.0),
              frame("torch/nn/modules/module.py(1743): _call_impl", 20.0, 20.0),
              *synth.launched("k1", 5.0, 6.0, 4.0, corr=1),
              *synth.launched("k2", 45.0, 60.0, 10.0, corr=2)]
    trace = tracekit.load(synth.write(tmp_path, "stack.json", synth.doc(events)))
    idle = (timeline(trace).segments.filter(pl.col("category") == "idle")
            .group_by("cause").agg(ns=(pl.col("end") - pl.col("start")).sum()))
    assert dict(idle.iter_rows()) == {"python: train.py(88): train_step": 29_000,
                                      "python: modules/module.py(1743): _call_impl": 20_000,
                                      "launch: cudaLaunchKernel": 1_000}


def test_a_real_with_stack_trace_blames_no_silent_frame():
    """TraceLens' H100 Qwen trace (with_stack): 2.69 ms of its idle went to `<string>(1):
    <module>`, the outermost frame; now to the CPU ops and frames inside it."""
    trace = tracekit.load(TRACELENS / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    causes = timeline(trace, "trace").segments.filter(pl.col("category") == "idle")["cause"]
    assert not causes.str.contains("<module>|runpy").any()
    assert causes.str.starts_with("python: qwen2/modeling_qwen2.py(").any()
    assert causes.str.starts_with("cpu_op: aten::").any()


def replayed(path, launch):
    """(kernels the `launch` call started, the innermost Python frame enclosing that call) by
    reading the JSON."""
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    (call,) = [e for e in events if e["name"] == launch]
    corr = call["args"]["correlation"]
    count = sum(1 for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") == corr)
    frames = [e for e in events if e.get("cat") == "python_function" and e["tid"] == call["tid"]
              and e["ts"] <= call["ts"] and call["ts"] + call["dur"] <= e["ts"] + e["dur"]]
    return count, max(frames, key=lambda e: (e["ts"], -e["dur"]))["name"]


def by_op(path) -> dict:
    ledger = kernels(tracekit.load(path), by="op", scope="trace")["kernels"][0]
    return {g["op"]: g for g in ledger}


def test_by_op_names_the_frame_of_a_cuda_graph_replay():
    """TraceLens' SGLang decode trace: 544 of its kernels are one `hipGraphLaunch`'s replay, under
    `torch/cuda/graphs.py(139): replay` (named `cuda/graphs.py(139): replay`), 98.8 % of the GPU
    time; before, `--by op` left their op blank with no word why."""
    path = TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz"
    count, innermost = replayed(path, "hipGraphLaunch")
    ops = by_op(path)
    assert innermost == "torch/cuda/graphs.py(139): replay"
    assert ops["python: cuda/graphs.py(139): replay"]["count"] == count == 544
    assert None not in ops


def test_by_op_shortens_a_bound_builtin_frame_and_says_why_none():
    """vLLM's full-graph decode: the replay's innermost frame is `<built-in method replay of
    pybind11_builtins.… object at 0x…>`, named `<built-in method replay>`. The Qwen trace's 509
    kernels launched before profiling began have no call to look from: said so."""
    path = TRACELENS / "inference" / "vllm_decode_full" / "graph_execution.json.gz"
    count, innermost = replayed(path, "hipGraphLaunch")
    assert innermost.startswith("<built-in method replay of pybind11_builtins.") and " at 0x" in innermost
    assert by_op(path)["python: <built-in method replay>"]["count"] == count == 421
    orphans = by_op(TRACELENS / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    assert orphans[NO_CALL]["count"] == 509 and None not in orphans
