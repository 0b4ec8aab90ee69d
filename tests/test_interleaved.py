"""The interleaved comparison of issue 63 (analyses/timed.py, variants.py, fidelity.py): manifests
made to the runner's contract (docs/json.md, `comparison` and each rank's `rounds`) from the
per-round means a one-process experiment measured on an H100 (large preset, batch 16, blocks of
5 steps, 10 rounds: `fsdp1`, `fsdp2` and a second `fsdp1` as the A/A control), whose own t
intervals over rounds are the oracle."""

import numpy as np
import pytest

from tracekit.analyses.fidelity import comparison_warnings
from tracekit.analyses.variants import comparison_summary, phase_table, variant_table

# per round, each variant's mean step (ms), as measured (fsdp1#0, fsdp2#1, fsdp1#2 of inter-2.json)
MEASURED = [(196.464306640625, 205.17494201660156, 200.42023010253905),
            (190.2114044189453, 195.31673126220704, 191.1321594238281),
            (191.22274627685547, 200.3287612915039, 193.37326049804688),
            (191.85211334228515, 198.97134857177736, 191.91498565673828),
            (180.3488342285156, 188.2957534790039, 183.46734466552735),
            (190.2628631591797, 200.26109466552734, 191.82428436279298),
            (197.748828125, 190.7675552368164, 184.58834075927734),
            (180.44192199707032, 191.01094970703124, 194.77177734375),
            (184.2919494628906, 196.0424591064453, 183.5138137817383),
            (183.9553482055664, 190.1517074584961, 189.96634674072266)]
# the experiment's own figures: mean Δ and Student's t interval over the 10 rounds' Δs
FSDP2 = (6.952, [3.165, 10.739])
CONTROL = (1.817, [-3.043, 6.678])
VARIANTS = ("fsdp1", "fsdp2", "fsdp1-control")
SHARES = {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}  # of each step, device clock
K = 5


def block(round_mean: float, position: int, number: int, extra: float = 0.0) -> dict:
    """A block of K steps whose mean is `round_mean` (+ `extra` ms on its third step ÷ 1), the
    phases their shares of each step."""
    steps = [round_mean + d for d in (-2.0, -1.0, 0.0, 1.0, 2.0)]
    steps[2] += extra
    phases = {p: [share * t for t in steps] for p, share in SHARES.items()} | {"step": steps}
    return {"round": number, "position": position, "step_ms": steps, "phase_ms": {"device": phases, "host": phases}}


def rank_entry(rank: int, rounds: list[dict]) -> dict:
    steps = [t for b in rounds for t in b["step_ms"]]
    phases = {p: [t for b in rounds for t in b["phase_ms"]["device"][p]] for p in (*SHARES, "step")}
    return {"rank": rank, "step_ms": {"median": float(np.median(steps)), "all": steps},
            "phase_ms": {"device": phases, "host": phases}, "rounds": rounds, "saved_steps": [],
            "peak_allocated_bytes": 10, "first_step": {"loss": 2.0, "grad_norm": 1.0}}


def interleaved(measured=MEASURED, extra=None, ranks: int = 1) -> dict:
    """The manifest of the measured rounds: blocks in mirrored order (A B C C B A, then C B A A B
    C), two blocks of K steps a variant a round, each block's mean the variant's round mean;
    `extra[(variant, round)]` ms added to one step of that variant's first block of the round.
    Rank r > 0 runs 1 ms faster on every step (the slowest rank, 0, is the step)."""
    extra = extra or {}
    orders = [list(VARIANTS) + list(reversed(VARIANTS)) if r % 2 == 0 else list(reversed(VARIANTS)) + list(VARIANTS)
              for r in range(len(measured))]
    blocks = {v: [] for v in VARIANTS}
    for number, (order, means) in enumerate(zip(orders, measured)):
        for position, v in enumerate(order):
            first = order.index(v) == position
            blocks[v].append(block(means[VARIANTS.index(v)], position, number,
                                   K * extra.get((v, number), 0.0) if first else 0.0))

    def slower(b, by):
        return {**b, "step_ms": [t - by for t in b["step_ms"]]}

    def rounds(v: str) -> list[dict]:
        """The variant's two blocks of each round as the runner keeps them: one entry a round,
        its steps and phases those of both blocks, `positions` theirs in the round's order."""
        pairs = [[b for b in blocks[v] if b["round"] == number] for number in range(len(measured))]
        return [{"round": number, "positions": [b["position"] for b in pair],
                 "step_ms": [t for b in pair for t in b["step_ms"]],
                 "phase_ms": {clock: {p: [t for b in pair for t in b["phase_ms"][clock][p]] for p in (*SHARES, "step")}
                              for clock in ("device", "host")}}
                for number, pair in enumerate(pairs)]

    variants = {v: {"status": "ok", "message": "",
                    "ranks": [rank_entry(r, [slower(b, r) for b in rounds(v)]) for r in range(ranks)]}
                for v in VARIANTS}
    variants["fsdp1-control"]["control_of"] = "fsdp1"
    return {"config": {"run_id": "x", "repeats": 1, "profile_mode": "cupti"}, "variants": variants,
            "comparison": {"design": "interleaved", "note": "", "block_steps": K, "rounds": len(measured),
                           "order": orders, "control": "fsdp1-control"}}


def rows(manifest):
    return {r["variant"]: r for r in variant_table(manifest, {}).iter_rows(named=True)}


def test_the_step_delta_is_the_mean_of_the_per_round_deltas_with_the_experiments_interval():
    """fsdp2 − fsdp1 and the control − fsdp1 over the 10 rounds: the experiment's means and t
    intervals (its Δs have a negative lag-1 autocorrelation, −0.33 and −0.56, so the cautious
    ρ is 0 and the interval Student's over 9 df); fsdp2's decides, the control's does not."""
    got = rows(interleaved())
    assert got["fsdp2"]["d_step_ms"] == pytest.approx(FSDP2[0], abs=1e-3)
    assert got["fsdp2"]["d_step_ms_ci"] == pytest.approx(FSDP2[1], abs=2e-3)
    assert got["fsdp2"]["verdict"] == "slower in 10 rounds" and got["fsdp2"]["rounds"] == 10
    assert got["fsdp1-control"]["d_step_ms_ci"] == pytest.approx(CONTROL[1], abs=2e-3)
    assert got["fsdp1-control"]["verdict"] == "inconclusive" and got["fsdp1"]["verdict"] == "base"


def test_each_phase_is_compared_over_the_same_rounds():
    """Every step's phases are 0.3, 0.6 and 0.1 of it: each phase's Δ is that share of the step's
    (6.952 ms), its interval the same share of the step's."""
    table = {(r["variant"], r["phase"]): r for r in phase_table(interleaved()).iter_rows(named=True)}
    for phase, share in SHARES.items():
        got = table[("fsdp2", phase)]
        assert got["d_ms"] == pytest.approx(share * FSDP2[0], abs=2e-3)
        assert got["d_ms_ci"] == pytest.approx([share * x for x in FSDP2[1]], abs=2e-3)
        assert got["verdict"] == "slower in 10 rounds"


def test_the_slowest_rank_makes_each_step_before_the_round_means():
    """Two ranks, rank 1 faster by 1 ms on every step but 40 ms slower than rank 0 on one step of
    fsdp2's round 3: that step is rank 1's, every other rank 0's: round 3's mean (10 steps) grows
    by 4 ms, the mean Δ over 10 rounds by 0.4."""
    manifest = interleaved(ranks=2)
    fsdp2 = manifest["variants"]["fsdp2"]["ranks"][1]
    next(b for b in fsdp2["rounds"] if b["round"] == 3)["step_ms"][0] += 41.0
    assert rows(manifest)["fsdp2"]["d_step_ms"] == pytest.approx(FSDP2[0] + 0.4, abs=1e-3)


def test_the_report_says_how_it_compared_and_the_controls_delta():
    summary = comparison_summary(interleaved())
    assert (summary["design"], summary["block_steps"], summary["rounds"], summary["control"]) == \
        ("interleaved", 5, 10, "fsdp1-control")
    assert summary["control_of"] == "fsdp1" and summary["control_d_ms_ci"] == pytest.approx(CONTROL[1], abs=2e-3)
    manifest = interleaved()
    # the measured round 7: fsdp1, the base, ran slow there, so both its Δs are off
    fsdp2, control = comparison_warnings(summary, variant_table(manifest, {}))
    assert fsdp2.startswith("fsdp2: the Δ of round 7 of 10 lies more than 5 robust σ from the other rounds'")
    assert control.startswith("fsdp1-control: the Δ of round 7 of 10 lies")


def test_a_control_whose_interval_excludes_zero_is_a_warning():
    """The control 8 ms slower in every round: its interval, 8 ms above the measured one, lies above 0."""
    slower = [(a, b, c + 8.0) for a, b, c in MEASURED]
    manifest = interleaved(slower)
    summary = comparison_summary(manifest)
    assert summary["control_d_ms"] == pytest.approx(CONTROL[0] + 8, abs=1e-3)
    warning = comparison_warnings(summary, variant_table(manifest, {}))[0]
    assert warning.startswith("the A/A control fsdp1-control − fsdp1 = +9.817 ms [+4.956, +14.678] excludes 0")


def test_an_outlying_round_is_warned_about_and_kept():
    """One step of fsdp2's round 2 (1-based 3) 300 ms slow: that round's Δ grows by 30 ms, far
    from the others; it is named (round 7, which was, is now within 5 robust σ: the spread
    grew), and it stays in the mean (+3 ms), widening the interval."""
    manifest = interleaved(extra={("fsdp2", 2): 300.0 / K})
    row = rows(manifest)["fsdp2"]
    assert row["d_step_ms"] == pytest.approx(FSDP2[0] + 3.0, abs=1e-3) and row["outlying_rounds"] == [3]
    assert row["d_step_ms_ci"][1] - row["d_step_ms_ci"][0] > FSDP2[1][1] - FSDP2[1][0]
    warnings = comparison_warnings(comparison_summary(manifest), variant_table(manifest, {}))
    assert any(w.startswith("fsdp2: the Δ of round 3 of 10 lies more than 5 robust σ") for w in warnings)


def test_a_sequential_run_of_one_repeat_gives_no_verdict_and_says_how_many_would():
    """The same steps without `comparison` and `rounds` (a sequential manifest, one repeat): Δ
    and an interval over the steps, no verdict, and a warning naming --repeats 3."""
    manifest = interleaved()
    del manifest["comparison"]
    for entry in manifest["variants"].values():
        for r in entry["ranks"]:
            del r["rounds"]
    got = rows(manifest)
    assert got["fsdp2"]["verdict"] == "no verdict: 1 repeat" and got["fsdp2"]["rounds"] is None
    summary = comparison_summary(manifest)
    assert summary["design"] == "sequential" and summary["control"] is None
    (warning,) = comparison_warnings(summary, variant_table(manifest, {}))
    assert warning.startswith("one sequential repeat: ") and "--repeats 3 or more decide" in warning


def test_recorded_steps_pair_as_rounds_only_within_one_interleaved_launch():
    """`diff` pairs round i of A with round i of B (s recorded steps a round) only where both are
    variants of one interleaved launch (the same run id); two launches, or a sequential one,
    pair their steps by number (None)."""
    from tracekit.analyses.timed import steps_per_round

    manifest = interleaved()
    for entry in manifest["variants"].values():
        entry["ranks"][0]["recorded"] = [{"mode": "cupti", "rounds": 5, "steps_per_round": 2}]
    other = {**manifest, "config": {**manifest["config"], "run_id": "y"}}
    sequential = {k: v for k, v in manifest.items() if k != "comparison"}
    assert steps_per_round(manifest, "fsdp1", manifest, "fsdp2") == 2
    assert steps_per_round(manifest, "fsdp1", other, "fsdp2") is None
    assert steps_per_round(sequential, "fsdp1", sequential, "fsdp2") is None
    assert steps_per_round(None, None, manifest, "fsdp2") is None
