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
