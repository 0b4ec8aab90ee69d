"""The committed real GPU run (tests/data/h200x2-blocks4): traces agree with the runtime's counts."""

import json

import polars as pl
from click.testing import CliRunner
from conftest import DATA

from tracekit.analyses.checks import count_check

from tracekit.analyses.variants import variant_table
from tracekit.front.cli import main
from tracekit.core.loading import load_profile

RUN = DATA / "h200x2-blocks4"


def test_check_passes_on_the_gpu_run():
    result = CliRunner().invoke(main, ["check", "--format", "json", str(RUN)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["counts"]
    assert {r["variant"] for r in rows} == {"ddp", "fsdp1", "fsdp2", "fsdp2-compile", "fsdp2-fp8"}
    fsdp1 = {r["count"]: r["trace"] for r in rows if r["variant"] == "fsdp1" and r["rank"] == 0}
    runtime = json.loads((RUN / "manifest.json").read_text())["variants"]["fsdp1"]["ranks"][0]["runtime_counts"]
    assert fsdp1["syncs.cudaEventSynchronize"] == runtime["Event.synchronize"] > 0


def test_every_variant_reports():
    manifest, runs = load_profile(RUN)
    assert count_check(manifest, runs)["match"].all()
    table = variant_table(manifest, runs)
    assert table.filter(pl.col("variant") == "ddp")["d_step_ms"].to_list() == [0.0, 0.0]
    assert table["gpu_span_ns"].null_count() == 0


def test_fp8_all_gathers_move_half_the_bytes_of_bf16():
    """torchao's float8 all-gather ships the blocks' weights as 1-byte elements (dtype Byte)
    where plain FSDP2 ships bf16; the root (embedding, head) stays bf16 in both."""
    from tracekit.analyses.comms import collective_kernels

    _, runs = load_profile(RUN)

    def gathered(variant):
        k = collective_kernels(runs[variant].traces[0]).filter(pl.col("coll_kind") == "all_gather")
        return dict(k.group_by("dtype").agg(pl.col("bytes").sum()).iter_rows())

    fp8, bf16 = gathered("fsdp2-fp8"), gathered("fsdp2")
    assert set(fp8) == {"Byte", "BFloat16"} and set(bf16) == {"BFloat16"}
    blocks_bf16 = bf16["BFloat16"] - fp8["BFloat16"]
    assert 1.9 < blocks_bf16 / fp8["Byte"] <= 2.0


def test_a_variant_whose_trace_of_a_rank_is_gone_names_that_rank(tmp_path):
    """The manifest lists ranks 0 and 1 for ddp; with rank 1's trace removed from a copy, the
    load says which rank is missing in words ("missing rank 1"), not as a Python list."""
    import shutil

    import pytest

    from tracekit.core.errors import TraceError

    copy = tmp_path / "run"
    shutil.copytree(RUN, copy)
    (copy / "ddp" / "rank1.pt.trace.json.gz").unlink()
    with pytest.raises(TraceError, match=r"missing rank 1$"):
        load_profile(copy)
