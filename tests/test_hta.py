"""Cross-check against Holistic Trace Analysis itself (HTA is in the test extra: this runs in CI)."""

import gzip
import logging
import warnings

import pytest
from conftest import DATA
from hta import trace_analysis

import tracekit
from tracekit.analyses.overlap import overlap

VARIANTS = ["ddp", "fsdp1", "fsdp1_nolimit", "fsdp2", "fsdp2_root"]
# docs/metrics.md: HTA shrinks every kernel to whole µs; DDP's many short kernels lose enough
# that HTA's figure is about 2 points under the ns figure there.
KNOWN_APART = {"ddp"}


def hta_overlap(variant, tmp_path):
    """HTA's own comp_comm_overlap_pctg per rank, for one variant's two traces."""
    for rank in (0, 1):
        data = gzip.open(DATA / "h200x2-small" / variant / f"rank{rank}.trace.json.gz").read()
        (tmp_path / f"rank{rank}.json").write_bytes(data)
    logging.disable(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hta = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    logging.disable(logging.NOTSET)
    return {int(r): float(p) for r, p in zip(hta["rank"], hta["comp_comm_overlap_pctg"])}


@pytest.mark.parametrize("variant", VARIANTS)
def test_hta_scope_is_exactly_htas_figure(variant, tmp_path):
    theirs = hta_overlap(variant, tmp_path)
    for trace in tracekit.load(DATA / "h200x2-small" / variant).traces:
        assert overlap(trace, "hta")["overlap_pct"][0] == theirs[trace.rank]


@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.xfail(strict=True, reason="HTA's whole-µs rounding, docs/metrics.md"))
    if v in KNOWN_APART else v for v in VARIANTS])
def test_trace_scope_overlap_within_one_point_of_hta(variant, tmp_path):
    theirs = hta_overlap(variant, tmp_path)
    for trace in tracekit.load(DATA / "h200x2-small" / variant).traces:
        ours = overlap(trace, "trace")["overlap_pct"][0]
        assert abs(ours - theirs[trace.rank]) <= 1.0, (trace.rank, ours, theirs[trace.rank])


def test_launch_delays_are_htas(tmp_path):
    """HTA's `get_cuda_kernel_launch_stats` on the H200 DDP rank 0: the launches it lists are
    ours of its APIs (cudaLaunchKernel, cudaMemcpyAsync, cudaMemsetAsync — not the NCCL
    kernels' cuLaunchKernelEx, which HTA leaves out), one by one. HTA rounds every event to
    whole µs, its start up and its end down (`trace_parser.round_down_time_stamps`): its
    cpu_duration and gpu_duration are ours less [0, 2) µs, its launch_delay (a rounded-up
    start less a rounded-down end) ours plus [0, 2) µs, and each is so here."""
    import polars as pl

    from tracekit.analyses.launches import launch_rows

    path = DATA / "h200x2-small" / "ddp" / "rank0.trace.json.gz"
    (tmp_path / "rank0.json").write_bytes(gzip.open(path).read())
    logging.disable(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path)).get_cuda_kernel_launch_stats(
            ranks=[0], visualize=False)[0]
    logging.disable(logging.NOTSET)
    theirs = pl.from_pandas(theirs.reset_index(drop=True))
    ours = launch_rows(tracekit.load(path))
    assert set(ours["api"]) == {"cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync", "cudaMemsetAsync"}
    mine = ours.filter(pl.col("api") != "cuLaunchKernelEx")
    assert (mine["activities"] == 1).all()
    assert sorted(mine["correlation"]) == sorted(theirs["correlation"]) and theirs.height == 1127
    both = mine.join(theirs, on="correlation")
    for ns, us, sign in (("call_ns", "cpu_duration", 1), ("device_ns", "gpu_duration", 1),
                         ("delay_ns", "launch_delay", -1)):
        lost = sign * (both[ns] / 1000 - both[us])  # what HTA's rounding took (µs)
        assert lost.min() >= 0 and lost.max() < 2, (ns, lost.min(), lost.max())
