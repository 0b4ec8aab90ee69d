"""The report's figures from a profile manifest (analyses/noise.py, analyses/variants.py),
on synthetic manifests whose right answers are stated here, and the bootstrap interval
against its statistical promise (coverage of a known distribution's median)."""

import numpy as np
import pytest

from tracekit.analyses.noise import delta_ci, drift_pct, median_ci, pooled, verdict
from tracekit.analyses.variants import capacity_table, checkpoint_columns, parity_check, recompile_ms, variant_table


def test_a_step_lasts_as_long_as_its_slowest_rank():
    assert pooled([[1.0, 5.0, 3.0], [2.0, 4.0, 3.0, 9.0]]).tolist() == [2.0, 5.0, 3.0]


def test_the_median_interval_covers_the_true_median_about_95_percent_of_the_time():
    """Lognormal step times (median e^0 · 100 = 100 ms), 20 steps a run, 300 runs: a 95 %
    interval must cover 100 in roughly 95 % of runs (the percentile bootstrap of a median
    with n = 20 runs a little under; 85 % is far below any sane interval's coverage)."""
    rng = np.random.default_rng(1)
    covered = 0
    for seed in range(300):
        x = 100 * np.exp(rng.normal(0, 0.2, 20))
        _, lo, hi = median_ci(x, seed=seed)
        covered += lo <= 100 <= hi
    assert 0.85 <= covered / 300 <= 0.995


def test_the_delta_verdict_sees_a_real_shift_and_not_noise():
    rng = np.random.default_rng(2)
    a = 100 + rng.normal(0, 2, 20)
    assert verdict(*delta_ci(a, a + 10)[1:]) == "slower"
    assert verdict(*delta_ci(a, a - 10)[1:]) == "faster"
    d, lo, hi = delta_ci(a, 100 + rng.normal(0, 2, 20))
    assert verdict(lo, hi) == "no change" and lo < d < hi


def test_drift_of_a_linear_ramp_is_its_rise_over_the_median():
    """Steps 100, 101, …, 119 ms: the run slowed by 19 ms over a median of 109.5 ms."""
    assert drift_pct(np.arange(100.0, 120.0)) == pytest.approx(19 / 109.5 * 100)
    assert drift_pct(np.full(10, 50.0)) == pytest.approx(0.0)


def rank(times, **extra):
    return {"rank": 0, "step_ms": {"median": float(np.median(times)), "all": times},
            "peak_allocated_bytes": 10, "first_step": {"loss": 2.0, "grad_norm": 1.0}, **extra}


def test_recompile_cost_counts_warm_up_and_timed_recompiles_against_the_other_steps():
    """Timed 10, 10, 30, 10 ms with step 2 recompiling; warm-up 50, 12 ms with warm-up step 0
    recompiling: (30 − 10) + (50 − 10) = 60 ms."""
    r = rank([10.0, 10.0, 30.0, 10.0], recompiled_steps=[2], warmup_step_ms=[50.0, 12.0],
             recompiled_warmup_steps=[0], recompiles=2)
    assert recompile_ms(r) == 60.0


def test_checkpoint_columns_and_training_steps():
    """Steps 10, 10, 110, 10, 10, 60 ms with saves at steps 2 and 5 (stalls 90 and 40 ms):
    training alone is the 10 ms steps; what saving cost per save is (210 − 6 × 10) ÷ 2."""
    times = [10.0, 10.0, 110.0, 10.0, 10.0, 60.0]
    ckpt = {"mode": "async", "every": 3, "stall_ms": [90.0, 40.0], "total_ms": [300.0, 200.0], "bytes": 1000,
            "step_ms_with_save": [110.0, 60.0], "step_ms_without_save": [10.0] * 4}
    r = rank(times, checkpoint=ckpt)
    assert checkpoint_columns(r) == {"ckpt_mode": "async", "ckpt_stall_ms": 65.0, "ckpt_total_ms": 250.0,
                                     "ckpt_bytes": 1000, "ckpt_cost_ms": 75.0}
    manifest = {"variants": {"fsdp2": {"status": "ok", "ranks": [r]}}}
    row = variant_table(manifest, {}).row(0, named=True)
    assert row["step_ms"] == row["rank_step_ms"] == 10.0 and row["n_steps"] == 4


def test_parity_flags_a_loss_beyond_its_tolerance():
    manifest = {"variants": {
        "a": {"status": "ok", "ranks": [rank([1.0])]},
        "b": {"status": "ok", "ranks": [{**rank([1.0]), "first_step": {"loss": 2.001, "grad_norm": 1.05}}]},
        "c": {"status": "ok", "ranks": [{**rank([1.0]), "first_step": {"loss": 2.01, "grad_norm": 1.0}}]}}}
    table = parity_check(manifest)
    match = {(v, f): m for v, f, m in table.select("variant", "figure", "match").iter_rows()}
    assert match[("b", "loss")] and not match[("b", "grad_norm")]  # 5e-4 ≤ 1e-3; 5e-2 > 1e-2
    assert not match[("c", "loss")] and match[("c", "grad_norm")]


def test_capacity_names_the_first_failure_past_the_largest_success():
    """small b1, b4 train; small b16, medium b1 and large b1 run out of memory: the largest is
    small batch 4, stopped by small batch 16 (the later failures only confirm it)."""
    probes = [{"preset": p, "batch": b, "variant": "ddp", "status": s, "message": "", "peak_allocated_bytes": m,
               "manifest": ""}
              for p, b, s, m in [("large", 1, "oom", None), ("small", 4, "ok", 40), ("small", 1, "ok", 10),
                                 ("medium", 1, "oom", None), ("small", 16, "oom", None)]]
    row = capacity_table({"presets": ["small", "medium", "large"], "probes": probes}).row(0, named=True)
    assert (row["largest_preset"], row["largest_batch"], row["peak_allocated_bytes"]) == ("small", 4, 40)
    assert row["stopped_by"] == "oom at small batch 16" and row["probes"] == 5


def test_check_does_not_count_collectives_of_a_one_rank_gpu_run(tmp_path):
    """One rank on a GPU: FSDP1 calls all_reduce 3 times (runtime), NCCL copies instead of
    launching collective kernels (trace: none). Syncs are still compared: 1 and 1."""
    from synth import call, doc, launched, step, write

    from tracekit.analyses.variants import count_check
    from tracekit.loading import load_run

    events = [step(1, 0, 100), *launched("k", 1, 10, 5, corr=1), call("cudaEventSynchronize", 20, 5, corr=2)]
    run = load_run(write(tmp_path, "rank0.json", doc(events, world_size=1)))
    manifest = {"variants": {"fsdp1": {"status": "ok", "ranks": [
        {"rank": 0, "runtime_counts": {"all_reduce": 3, "Event.synchronize": 1}}]}}}
    table = count_check(manifest, {"fsdp1": run})
    assert table.select("count", "runtime", "trace", "match").rows() == [("syncs.cudaEventSynchronize", 1, 1, True)]
