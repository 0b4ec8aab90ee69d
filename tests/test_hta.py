"""Cross-check against Holistic Trace Analysis itself (skipped when HTA is not installed)."""

import gzip
import logging
import warnings

import pytest
from conftest import DATA

import tracekit
from tracekit.analyses.overlap import overlap_trace_scope

VARIANTS = ["ddp", "fsdp1", "fsdp1_nolimit", "fsdp2", "fsdp2_root"]
# docs/metrics.md: HTA truncates ts/dur to µs and counts CUPTI "Stream Wait Event" records as
# computation; on the DDP traces these move HTA's figure by about 2 points.
KNOWN_APART = {"ddp"}


@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.xfail(strict=True, reason="HTA µs truncation + cuda_sync rows, docs/metrics.md"))
    if v in KNOWN_APART else v for v in VARIANTS])
def test_trace_scope_overlap_within_one_point_of_hta(variant, tmp_path):
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    for rank in (0, 1):
        data = gzip.open(DATA / "h200x2-small" / variant / f"rank{rank}.trace.json.gz").read()
        (tmp_path / f"rank{rank}.json").write_bytes(data)
    logging.disable(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hta = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    logging.disable(logging.NOTSET)
    for trace in tracekit.load(DATA / "h200x2-small" / variant).traces:
        ours = overlap_trace_scope(trace)["overlap_pct"][0]
        theirs = float(hta.loc[hta["rank"] == trace.rank, "comp_comm_overlap_pctg"].iloc[0])
        assert abs(ours - theirs) <= 1.0, (trace.rank, ours, theirs)
