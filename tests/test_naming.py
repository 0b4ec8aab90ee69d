"""Lean items named from the full step beside them (analyses/naming.py)."""

import json
from pathlib import Path

import polars as pl
import synth
from click.testing import CliRunner

import tracekit
from tracekit.analyses.naming import lean_names, named
from tracekit.analyses.phases import launch_context
from tracekit.front.cli import main

DATA = Path(__file__).parent / "data"


def lean_events():
    """Two lean steps, each: k1, k2 on stream 7, an all-gather without dtype on stream 21, then
    kX on stream 7 — where the full step ran k3: no name agrees, so kX stays unnamed."""
    events = []
    for n, t0 in ((1, 0.0), (2, 500.0)):
        events += [synth.step(n, t0, 500.0), *synth.launched("k1", t0 + 1, t0 + 10, 5.0, corr=10 * n + 1),
                   *synth.launched("k2", t0 + 2, t0 + 30, 5.0, corr=10 * n + 2),
                   *synth.nccl("all_gather", t0 + 3, t0 + 50, 10.0, corr=10 * n + 3, dtype=None),
                   *synth.launched("kX", t0 + 4, t0 + 70, 5.0, corr=10 * n + 4)]
    return events


def full_events():
    """One full step (numbered 9) with the launching ops: aten::mm → k1, aten::add → k2,
    record_param_comms → the all-gather (BFloat16), aten::gelu → k3."""
    events = [synth.step(9, 0.0, 500.0)]
    for corr, (op, kernel, ts) in enumerate((("aten::mm", "k1", 10.0), ("aten::add", "k2", 30.0),
                                             ("record_param_comms", None, 50.0), ("aten::gelu", "k3", 70.0)), 1):
        events.append(synth.op(op, corr * 5.0, 3.0, **{"External id": corr}))
        events += (synth.nccl("all_gather", corr * 5.0 + 1, ts, 10.0, corr=corr, dtype="BFloat16") if kernel is None
                   else synth.launched(kernel, corr * 5.0 + 1, ts, 5.0, corr=corr))
    return events


def test_lean_kernels_take_the_full_steps_ops_and_dtypes(tmp_path):
    lean = tracekit.load(synth.write(tmp_path, "lean.json", synth.doc(lean_events())))
    full = tracekit.load(synth.write(tmp_path, "full.json", synth.doc(full_events())))
    assert launch_context(lean)["op"].null_count() == lean.gpu.height  # nothing named before
    table = lean.gpu.with_row_index("row").join(lean_names(lean, full), on="row").sort("start")
    expected = [("k1", "aten::mm", None), ("k2", "aten::add", None),
                ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "record_param_comms", "BFloat16"),
                ("kX", None, None)] * 2
    assert table.select("name", "op", pl.col("dtype_right")).rows() == expected
    assert named(lean, full) == (6, 8)
    ops = lean.gpu.with_row_index("row").join(launch_context(lean), on="row").sort("start")["op"].to_list()
    assert ops == [e[1] for e in expected]
    assert lean.gpu.filter(pl.col("category") == "comm")["dtype"].to_list() == ["BFloat16", "BFloat16"]


def test_diff_names_lean_items_and_counts_the_unnamed(tmp_path):
    for side in ("a", "b"):
        (tmp_path / side / "names").mkdir(parents=True)
        synth.write(tmp_path / side, "rank0.json", synth.doc(lean_events()))
        synth.write(tmp_path / side / "names", "rank0.json", synth.doc(full_events()))
    result = CliRunner().invoke(main, ["diff", "--format", "json", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    assert {(i["name"], i["op"]) for i in items if i["kind"] == "compute"} == \
        {("k1", "aten::mm"), ("k2", "aten::add"), ("kX", None)}
    assert {i["name"] for i in items if i["kind"] == "comm"} == {"all_gather BFloat16"}
    assert "A rank 0: 2 of 8 lean GPU activities not named from the full step" in result.stderr


def test_real_lean_recording_is_named_completely():
    """A real 2-rank GPU lean recording (tests/data/h200x2-lean): every lean activity of every
    rank finds its kernel in the full step; none is left without an op, no collective without
    a dtype."""
    folder = DATA / "h200x2-lean" / "fsdp2"
    for rank in (0, 1):
        lean = tracekit.load(folder / f"rank{rank}.pt.trace.json.gz")
        full = tracekit.load(folder / "names" / f"rank{rank}.pt.trace.json.gz")
        matched, total = named(lean, full)
        assert matched == total == lean.gpu["step"].is_not_null().sum() > 0
        assert launch_context(lean)["op"].null_count() == 0
        assert lean.gpu.filter(pl.col("category") == "comm")["dtype"].null_count() == 0
