"""Traces from other setups (HTA's test data) all load and summarise, with what is known of them."""

import polars as pl
import pytest
from conftest import DATA

import tracekit
from tracekit.analyses.summary import summary

EXTERNAL = DATA / "external" / "hta-tests-data"
FILES = sorted(EXTERNAL.rglob("*.json.gz"))


def load_one(name):
    (path,) = [p for p in FILES if name in str(p)]
    return tracekit.load(path)


def totals(trace, prefix):
    frame = summary(trace)
    return {c.split(".", 1)[1]: frame[c].sum() for c in frame.columns if c.startswith(prefix + ".")}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name)
def test_every_external_trace_loads_and_summarises(path):
    trace = tracekit.load(path)
    frame = summary(trace)
    assert frame.height == trace.steps.height >= 1
    assert (frame["cpu_ns"] > 0).all()


def test_counts_stated_in_the_readme():
    assert totals(load_one("alexnet"), "syncs")["cudaStreamSynchronize"] == 16
    assert totals(load_one("alexnet"), "syncs")["cudaDeviceSynchronize"] == 5
    one_each = totals(load_one("critical_path/cuda_event_sync/"), "syncs")
    assert (one_each["cudaStreamSynchronize"], one_each["cudaEventSynchronize"],
            one_each["cudaDeviceSynchronize"]) == (1, 1, 1)
    nccl = load_one("nccl_parser_config")
    assert nccl.steps.height == 3 and totals(nccl, "syncs")["cudaEventSynchronize"] == 24
    assert set(totals(nccl, "collectives")) >= {"all_reduce", "broadcast"}
    pipeline = load_one("negative_queue_length")
    assert pipeline.steps.height == 5 and totals(pipeline, "syncs")["cudaStreamSynchronize"] == 75
    assert "send_recv" in totals(pipeline, "collectives")
    assert load_one("ns_resolution").steps.height == 5
    assert [t.steps.height for t in (load_one("trace_diff/control"), load_one("trace_diff/test"))] == [6, 6]


def test_amd_and_cpu_only_traces():
    amd = load_one("amd_trace")
    # ROCm: two blocking hipMemcpyWithStream in step 1; the hipDeviceSynchronize comes after the last step.
    assert amd.has_gpu and totals(amd, "syncs")["hipMemcpyWithStream"] == 2
    assert amd.calls.filter(pl.col("name") == "hipDeviceSynchronize")["step"].to_list() == [None]
    cpu = load_one("cpu_only")
    assert not cpu.has_gpu and summary(cpu)["gpu_span_ns"].null_count() == 1
    assert load_one("rank_non_gpu").rank == 0 and not load_one("rank_non_gpu").has_gpu


def test_two_rank_run_directory():
    run = tracekit.load(EXTERNAL / "trace_filter")
    assert [t.rank for t in run.traces] == [0, 1]
    assert all(t.steps.height == 2 for t in run.traces)
    assert all(t.gpu.filter(pl.col("category") == "comm").height > 0 for t in run.traces)


def test_collective_sizes_come_from_the_nccl_annotations_where_the_kernels_have_none():
    """HTA's TraceDiff pair (2022 schema): the NCCL kernels carry no sizes, their
    `record_param_comms` none either; each `nccl:all_reduce` annotation holds its tensor's
    `Input Dims` and `Input type`. `diff`'s collectives give each side's all-reduce bytes as
    the raw JSON's annotations in the compared step say (3 × float: 200,037,204 B; was 0 B)."""
    import gzip
    import json
    import math

    from click.testing import CliRunner

    from tracekit.front.cli import main

    a, b = (EXTERNAL / "trace_diff" / side / f"{side}.json.gz" for side in ("control", "test"))
    doc = json.loads(CliRunner().invoke(main, ["diff", "--format", "json", str(a), str(b)]).stdout)

    def annotated_bytes(path, step):
        events = json.loads(gzip.open(path).read())["traceEvents"]
        (window,) = [e for e in events if e.get("name") == f"ProfilerStep#{step}"]
        sizes = {"float": 4}
        return sum(math.prod(e["args"]["Input Dims"][0]) * sizes[e["args"]["Input type"][0]] for e in events
                   if e.get("name") == "nccl:all_reduce" and window["ts"] <= e["ts"] < window["ts"] + window["dur"])

    (all_reduce,) = [c for c in doc["collectives"] if c["kind"] == "all_reduce"]
    assert all_reduce["a_bytes"] == annotated_bytes(a, doc["step"]) > 0
    assert all_reduce["b_bytes"] == annotated_bytes(b, doc["b_step"]) > 0


def test_annotated_collective_sizes_agree_with_the_kernels_own():
    """The H200 DDP traces hold both: the args Kineto copies onto each NCCL kernel (and its
    `record_param_comms` op) and the `nccl:all_reduce` annotation around its launch. With the
    args taken away, every kernel's size and dtype from its annotation are those of its args."""
    import dataclasses

    from tracekit.analyses.comms import collective_kernels

    for trace in tracekit.load(DATA / "h200x2-small" / "ddp", cache=False).traces:
        own = collective_kernels(trace).select("row", "dtype", "bytes")
        sizeless = {"in_nelems": pl.lit(None, pl.Int64), "out_nelems": pl.lit(None, pl.Int64),
                    "dtype": pl.lit(None, pl.String)}  # on the kernels and their record_param_comms ops
        bare = dataclasses.replace(trace, gpu=trace.gpu.with_columns(**sizeless),
                                   ops=trace.ops.with_columns(**sizeless), derived={})
        annotated = collective_kernels(bare).select("row", "dtype", "bytes")
        assert own.height == 14 and own["bytes"].null_count() == 0
        assert annotated.sort("row").equals(own.sort("row"))


def test_syncs_outside_the_steps_are_in_the_trace_scope():
    """HTA's ns-resolution trace: its one `cudaDeviceSynchronize` comes after the last
    `ProfilerStep#N`. `syncs` says there is none *in these steps* (not "in these traces") and
    names `--scope trace`, which lists it: the raw JSON's count and duration."""
    import gzip
    import json

    from click.testing import CliRunner

    from tracekit.front.cli import main

    (path,) = [p for p in FILES if "ns_resolution_trace" in str(p)]
    events = json.loads(gzip.open(path).read())["traceEvents"]
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaDeviceSynchronize"]
    step_ends = max(e["ts"] + e["dur"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert len(syncs) == 1 and syncs[0]["ts"] > step_ends  # what the test is about

    stepped = " ".join(CliRunner().invoke(main, ["syncs", str(path)]).stdout.split())  # unwrapped
    assert "in these steps" in stepped and "--scope trace" in stepped and "in these traces" not in stepped
    doc = json.loads(CliRunner().invoke(main, ["syncs", "--scope", "trace", "--format", "json", str(path)]).stdout)
    ((whole,),) = [t["steps"] for t in doc["traces"]]
    ((call,),) = [whole["calls"]]
    assert whole["step"] is None
    assert (call["api"], call["count"], call["blocked_ns"]) == ("cudaDeviceSynchronize", 1, round(syncs[0]["dur"] * 1000))


def test_an_op_that_does_not_enclose_the_launch_is_not_its_launcher():
    """HTA's AlexNet trace gives every device activity its correlation id as External id; 17 of
    those ids are also unrelated CPU ops' (`aten::detach` 30 s before the copy, `aten::view`
    10.9 s after it). An op that does not enclose the launching call did not launch it: each
    activity's op is, by a brute force over the raw JSON, the op with its External id that
    encloses the call on the call's thread, else the innermost op that does — all 16
    `cudaMemcpyAsync` copies are `aten::copy_`'s."""
    import gzip
    import json
    from collections import Counter

    from tracekit.analyses.phases import launch_context

    (path,) = [p for p in FILES if "alexnet" in str(p)]
    events = json.loads(gzip.open(path).read())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}

    def around(op, call):
        return op["tid"] == call["tid"] and op["ts"] <= call["ts"] and op["ts"] + op["dur"] >= call["ts"] + call["dur"]

    expected, collided = Counter(), Counter()
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("correlation") in calls:
            call = calls[e["args"]["correlation"]]
            named = [o for o in ops if o["args"].get("External id") == e["args"].get("External id")]
            launcher = [o for o in named if around(o, call)] or [o for o in ops if around(o, call)]
            best = min(launcher, key=lambda o: (-o["ts"], o["ts"] + o["dur"]))
            expected[e["name"], best["name"]] += 1
            if named and not any(around(o, call) for o in named):
                collided[e["cat"], call["name"], best["name"]] += 1
    assert collided == {("gpu_memcpy", "cudaMemcpyAsync", "aten::copy_"): 16,
                        ("kernel", "cudaLaunchKernel", "aten::uniform_"): 1}

    trace = tracekit.load(path)
    context = launch_context(trace)
    got = Counter(zip(trace.gpu["name"], context["op"]))
    assert got == expected
