"""Analyses on the real H200 traces: what the runtime and the FSDP implementations say."""

import pytest
from conftest import DATA

import tracekit
from tracekit.analyses.comms import comms
from tracekit.analyses.syncs import sync_ledger

H200 = DATA / "h200x2-small"
VARIANTS = ["ddp", "fsdp1", "fsdp1_nolimit", "fsdp2", "fsdp2_root"]


def run(variant):
    return tracekit.load(H200 / variant)


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp1_event_syncs_are_all_the_rate_limiter(rank):
    calls = sync_ledger(run("fsdp1").traces[rank])["calls"][0]
    (event_syncs,) = [c for c in calls if c["api"] == "cudaEventSynchronize"]
    assert event_syncs["count"] == 25 and event_syncs["blame"][0] == "FullyShardedDataParallel.rate_limiter"
    assert sum(chain["count"] for chain in event_syncs["chains"]) == 25
    assert sum(chain["blocked_ns"] for chain in event_syncs["chains"]) == event_syncs["blocked_ns"]
    # The rate limiter runs inside _pre_forward in the forward, the backward prefetch/hook in the backward.
    callers = {chain["blame"][1] for chain in event_syncs["chains"]}
    assert callers <= {"FullyShardedDataParallel._pre_forward", "FullyShardedDataParallel._pre_backward_prefetch",
                       "FullyShardedDataParallel._pre_backward_hook"}
    assert "FullyShardedDataParallel._pre_forward" in callers
    assert any("_pre_backward" in caller for caller in callers)


def test_fsdp2_has_no_event_syncs():
    for trace in run("fsdp2").traces:
        assert not [c for c in sync_ledger(trace)["calls"][0] if c["api"] == "cudaEventSynchronize"]


@pytest.mark.parametrize("variant,all_gathers,reduce_scatters", [("fsdp1", 25, 13), ("fsdp2", 25, 13), ("fsdp2_root", 1, 1)])
def test_collective_census(variant, all_gathers, reduce_scatters):
    r = run(variant)
    for frame in comms(r.traces):
        rows = {c["kind"]: c for c in frame["collectives"][0]}
        assert rows["all_gather"]["count"] == all_gathers and rows["reduce_scatter"]["count"] == reduce_scatters
        for c in rows.values():
            assert c["bytes"] > 0 and c["busbw_gbps"] > 0 and c["transfer_ns"] + c["wait_ns"] == c["kernel_ns"]


def test_one_rank_waits_for_the_other_in_fsdp2():
    waits = [sum(c["wait_ns"] for c in f["collectives"][0]) for f in comms(run("fsdp2").traces)]
    kernel = [sum(c["kernel_ns"] for c in f["collectives"][0]) for f in comms(run("fsdp2").traces)]
    assert min(waits) == 0 and max(w / k for w, k in zip(waits, kernel)) > 0.5
