"""The whole-trace scopes against a plain sweep over every device activity (tests/oracle.py:
`whole_trace`), on every real trace the repository holds: `--scope trace` counts all device
work, launch record or not; `--scope launched` leaves out work launched before profiling."""

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import DATA
from oracle import whole_trace

import synth
import tracekit
from tracekit.analyses.overlap import overlap
from tracekit.analyses.summary import summary
from tracekit.analyses.syncs import host_syncs
from tracekit.front.cli import main

TRACES = sorted(p for p in DATA.rglob("*.json*") if p.name.endswith((".json", ".json.gz"))
                and p.name not in ("manifest.json", "published.json"))
US = 1000


def ids(path):
    return "/".join(path.relative_to(DATA).parts[-3:])


@pytest.mark.parametrize("path", TRACES, ids=ids)
def test_trace_scope_counts_every_device_activity(path):
    try:
        traces = tracekit.load(path).traces if path.is_dir() else [tracekit.load(path)]
    except tracekit.TraceError:  # not a trace (tests/data holds a few other JSON files)
        return
    for trace in traces:
        truth = whole_trace(trace)
        rows = {r["device"]: r for r in summary(trace, "trace").to_dicts() if r["device"] is not None}
        lapped = {r["device"]: r for r in overlap(trace, "trace").to_dicts() if r["device"] is not None}
        assert set(rows) == set(truth) == set(lapped)
        for device, want in truth.items():
            assert rows[device]["gpu_busy_ns"] == want["busy"], device
            got = lapped[device]
            assert (got["comm_ns"], got["compute_ns"], got["overlap_ns"]) == \
                (want["comm"], want["compute"], want["overlap"]), device
            pct = round(want["overlap"] / want["comm"] * 100, 2) if want["comm"] else None
            assert got["overlap_pct"] == pct


def unlaunched_gather(tmp_path):
    """A launched GEMM [100, 200) µs and an all-gather [150, 250) µs whose launch is not in the
    trace (it began before profiling), and a cudaStreamSynchronize [210, 240) µs."""
    gather = synth.nccl("all_gather", 1.0, 150.0, 100.0, corr=7)[1]
    events = [synth.step(1, 0.0, 300.0), *synth.launched("gemm", 2.0, 100.0, 100.0, corr=1), gather,
              synth.call("cudaStreamSynchronize", 210.0, 30.0, corr=2)]
    return tracekit.load(synth.write(tmp_path, "t.json", synth.doc(events)))


def test_work_launched_before_profiling_is_in_the_trace_scope_only(tmp_path):
    """By hand: trace scope busy [100, 250) = 150 µs, comm 100, overlap [150, 200) = 50 (50 %);
    launched scope: the GEMM alone (busy 100, no comm), as TraceLens' default."""
    trace = unlaunched_gather(tmp_path)
    whole = overlap(trace, "trace").row(0, named=True)
    assert (whole["comm_ns"], whole["overlap_ns"], whole["overlap_pct"], whole["exposed_comm_ns"]) == \
        (100 * US, 50 * US, 50.0, 50 * US)
    assert summary(trace, "trace")["gpu_busy_ns"].to_list() == [150 * US]
    launched = summary(trace, "launched").row(0, named=True)
    assert (launched["gpu_busy_ns"], launched["comm_ns"]) == (100 * US, 0)


def test_a_sync_during_launchless_work_is_not_gpu_idle(tmp_path):
    """The sync [210, 240) µs runs under the unlaunched all-gather: no GPU idle."""
    (row,) = host_syncs(unlaunched_gather(tmp_path)).to_dicts()
    assert (row["blocked_ns"], row["gpu_idle_ns"]) == (30 * US, 0)


def test_a_file_of_launchless_collectives_reports_them(tmp_path):
    events = [synth.nccl("all_reduce", 1.0, 10.0 + 100 * i, 50.0, corr=i)[1] for i in range(3)]
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    result = CliRunner().invoke(main, ["overlap", "--scope", "trace", "--format", "json", str(path)])
    assert result.exit_code == 0, result.output
    trace = tracekit.load(path)
    assert overlap(trace, "trace")["comm_ns"].to_list() == [150 * US]
    assert summary(trace, "trace").filter(pl.col("device").is_not_null())["gpu_busy_ns"].to_list() == [150 * US]
