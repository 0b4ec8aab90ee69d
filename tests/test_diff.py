"""`tracekit diff`: hand-computed waterfalls, and the exact-sum property on every real pair."""

import json

import numpy as np

import pytest
import synth
from click.testing import CliRunner
from conftest import DATA

import tracekit
from tracekit.analyses.diff import diff_runs, diff_traces
from tracekit.front.cli import main

US = 1000


def pair(tmp_path):
    """A: k1 [0,100) and an all-gather [50,150) µs → span 150 = compute 100 + exposed comm 50.
    B: k1 [0,100), the all-gather [100,130), a new kernel k2 [130,140) → span 140 =
    compute 110 + comm 30. So B − A = −10 = k1 0 + all-gather −20 + k2 +10."""
    a = [synth.step(1, 0.0, 500.0), *synth.launched("k1", 1.0, 0.0, 100.0, corr=1),
         *synth.nccl("all_gather", 2.0, 50.0, 100.0, corr=2)]
    b = [synth.step(1, 0.0, 500.0), *synth.launched("k1", 1.0, 0.0, 100.0, corr=1),
         *synth.nccl("all_gather", 2.0, 100.0, 30.0, corr=2), *synth.launched("k2", 3.0, 130.0, 10.0, corr=3)]
    return (tracekit.load(synth.write(tmp_path, "a.json", synth.doc(a))),
            tracekit.load(synth.write(tmp_path, "b.json", synth.doc(b))))


def test_hand_computed_waterfall(tmp_path):
    a, b = pair(tmp_path)
    d = diff_traces(a, b, 1, 1)
    assert (d.a_step_ns, d.b_step_ns, d.step_delta_ns) == (150 * US, 140 * US, -10 * US)
    items = {(r["kind"], r["name"]): (r["delta_ns"], r["change"]) for r in d.items.to_dicts()}
    assert items == {("comm", "all_gather Float"): (-20 * US, ""), ("compute", "k2"): (10 * US, "added"),
                     ("compute", "k1"): (0, "")}
    (coll,) = d.collectives.to_dicts()
    assert (coll["a_exposed_ns"], coll["b_exposed_ns"]) == (50 * US, 30 * US)


def test_top_and_other_keep_the_sum(tmp_path):
    a, b = pair(tmp_path)
    d = diff_traces(a, b, 1, 1, top=1)
    assert d.items.height == 2 and d.items["kind"].to_list()[-1] == "other"
    assert (d.items["delta_ns"].to_list()[-1], d.items["a_count"].to_list()[-1]) == (10 * US, 1)


def test_all_steps_attribute_the_mean_of_every_step_with_each_items_interval(tmp_path):
    """Three steps on each side; k's duration (µs) per step: A 10, 30, 21 and B 12, 36, 21.
    With every step (the default), each side's figures are the means over the steps both have:
    A 20.333… µs (20 333 ns, whole ns), B 23 µs, Δ 2 667 ns; the per-step Δs 2, 6, 0 µs give
    the interval by hand: mean 2.667, s² = 9.333, lag-1 r = −0.643 → cautious ρ 0 (clipped),
    df = 3 − 1, t(0.975, 2) = 4.303, half-width 4.303 · √(9.333 / 3) = 7.590 µs: the interval
    holds 0, so k is within noise. The median step (by time) is still each side's listed step:
    3 in A (21), 1 in B (12, 21, 36 → 21 is step 3)."""
    def side(name, durations):
        events = []
        for i, dur in enumerate(durations):
            events += [synth.step(i + 1, 100.0 * i, 100.0), *synth.launched("k", 100.0 * i + 1, 100.0 * i + 10, dur, corr=i)]
        return tracekit.load(synth.write(tmp_path, f"{name}.json", synth.doc(events)))

    result = diff_runs([side("a", [10.0, 30.0, 21.0])], [side("b", [12.0, 36.0, 21.0])])
    (d,) = result.per_rank
    assert (d.a_step, d.b_step, d.steps, d.rounds) == (3, 3, 3, 3) and result.pairing == "steps"
    assert (d.a_step_ns, d.b_step_ns, d.step_delta_ns) == (20_333, 23_000, 2_667)
    (k,) = d.all_items.to_dicts()
    h = 4.302653 * (28 / 3 / 3) ** 0.5 * US
    assert (k["a_ns"], k["b_ns"], k["delta_ns"]) == (20_333, 23_000, 2_667)
    assert (k["delta_lo_ns"], k["delta_hi_ns"]) == pytest.approx((8 / 3 * US - h, 8 / 3 * US + h), abs=1)
    assert k["within_noise"] and d.step_delta_ci_ns == [k["delta_lo_ns"], k["delta_hi_ns"]]


def test_the_mean_items_sum_exactly_to_the_mean_step(tmp_path):
    """Three steps, two kernels whose means are thirds of a ns (k: 10, 10, 11 ns → 10.33; j: 7,
    7, 8 ns → 7.33, spans 17, 17, 19 → 17.67): each item's mean rounded down and the ns left
    over (18 − 17) given to the item with the larger remainder (a tie: the first by key) — the
    items sum to the step's mean rounded, exactly."""
    def side(name, k, j):
        events = []
        for i, (dk, dj) in enumerate(zip(k, j)):
            t = 100.0 * i
            events += [synth.step(i + 1, t, 100.0), *synth.launched("k", t + 1, t + 10, dk / 1000, corr=2 * i),
                       *synth.launched("j", t + 2, t + 10 + dk / 1000, dj / 1000, corr=2 * i + 1)]
        return tracekit.load(synth.write(tmp_path, f"{name}.json", synth.doc(events)))

    result = diff_runs([side("a", [10, 10, 11], [7, 7, 8])], [side("b", [10, 10, 10], [7, 7, 7])])
    (d,) = result.per_rank
    items = {r["name"]: r for r in d.all_items.to_dicts()}
    assert d.a_step_ns == round((17 + 17 + 19) / 3) == 18
    assert (items["j"]["a_ns"], items["k"]["a_ns"]) == (8, 10)  # remainders 1 and 1: the first by name, j
    assert d.all_items["delta_ns"].sum() == d.step_delta_ns == d.b_step_ns - d.a_step_ns


def test_no_common_step_and_world_size_mismatch_warn(tmp_path):
    a = [synth.step(3, 0.0, 50.0), *synth.launched("k", 1.0, 2.0, 5.0, corr=1)]
    b = [synth.step(7, 0.0, 50.0), *synth.launched("k", 1.0, 2.0, 6.0, corr=1)]
    ta = tracekit.load(synth.write(tmp_path, "a.json", synth.doc(a, world_size=2)))
    tb = tracekit.load(synth.write(tmp_path, "b.json", synth.doc(b, world_size=4)))
    result = diff_runs([ta], [tb], "all", 10, "kernel")
    assert any("no common step" in w for w in result.warnings) and any("world size" in w for w in result.warnings)
    assert result.per_rank[0].step_delta_ns == 1 * US


def test_fsdp1_vs_fsdp2_names_what_changed():
    result = CliRunner().invoke(main, ["diff", "--format", "json", "--top", "400", "--rank", "0",
                                       str(DATA / "h200x2-small" / "fsdp1"), str(DATA / "h200x2-small" / "fsdp2")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["rank"] == 0 and sum(i["delta_ns"] for i in doc["items"]) == doc["step_delta_ns"]
    added = {i["name"] for i in doc["items"] if i["change"] == "added" and i["kind"] == "compute"}
    removed = {i["name"] for i in doc["items"] if i["change"] == "removed" and i["kind"] == "compute"}
    assert {"detail::chunk_cat_cuda_kernel", "detail::split_with_sizes_copy_out_contiguous_no_cast_kernel",
            "multi_tensor_apply_kernel<CopyFunctor>"} <= added
    assert {"CatArrayBatchedCopy_vectorized", "unrolled_elementwise_kernel<direct_copy_kernel_cuda>"} <= removed
    syncs = {s["api"]: s for s in doc["syncs"]}
    assert (syncs["cudaEventSynchronize"]["a_count"], syncs["cudaEventSynchronize"]["b_count"]) == (25, 0)


def test_plot_and_fsdp_view(tmp_path):
    out = tmp_path / "w.png"
    result = CliRunner().invoke(main, ["diff", "--by", "fsdp", "--plot", str(out), "--format", "csv",
                                       str(DATA / "h200x2-small" / "fsdp1"), str(DATA / "h200x2-small" / "fsdp2")])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = result.stdout.splitlines()[0]
    assert header == ("rank,kind,phase,fsdp,change,a_ns,b_ns,delta_ns,a_count,b_count,critical,why,a_cp_ns,b_cp_ns,"
                      "a_flops,b_flops,a_busy_ns,b_busy_ns,d_flops_ns,d_efficiency_ns")
    assert "post-backward reduce-scatter" in result.stdout and "FSDP::post_backward_reduce" not in result.stdout


def test_fsdp_view_pairs_fsdp1_with_fsdp2():
    """Acceptance (issue 18): no FSDP phase is both added and removed; the FSDP1 and FSDP2
    reduce-scatters share one row."""
    result = CliRunner().invoke(main, ["diff", "--by", "fsdp", "--format", "json", "--top", "100",
                                       str(DATA / "h200x2-blocks4"), "fsdp1", "fsdp2"])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)["items"]
    for phase in {i["fsdp"] for i in items}:
        changes = {i["change"] for i in items if i["fsdp"] == phase}
        assert not {"added", "removed"} <= changes, phase
    (rs,) = [i for i in items if (i["kind"], i["fsdp"]) == ("comm", "post-backward reduce-scatter")]
    assert rs["a_count"] > 0 and rs["b_count"] > 0


def test_fsdp_view_as_a_table_for_each_way_of_combining_ranks():
    """`--by fsdp` has no kernel names to shorten in the lead: its table (the default format)
    shows the FSDP phases, per rank, mean or sum, as the JSON view does."""
    for ranks in ("each", "mean", "sum"):
        result = CliRunner().invoke(main, ["diff", "--by", "fsdp", "--ranks", ranks, str(DATA / "h200x2-small" / "fsdp1"),
                                           str(DATA / "h200x2-small" / "fsdp2")])
        assert result.exit_code == 0, (ranks, result.output)
        assert "post-backward reduce-scatter" in result.stdout, ranks


def test_fsdp_phase_table():
    """Each label of both implementations (as the traces spell them) → the documented phase."""
    import polars as pl

    from tracekit.analyses.phases import fsdp_phase

    expected = [
        ("forward", "FullyShardedDataParallel._pre_forward", "pre-forward all-gather"),
        ("forward", "FullyShardedDataParallel.rate_limiter", "pre-forward all-gather"),
        ("forward", "FSDP::all_gather", "pre-forward all-gather"),
        ("forward", "fsdp::all_gather_copy_in", "pre-forward all-gather"),
        ("forward", "fsdp::split_with_sizes_copy", "pre-forward all-gather"),
        ("forward", "FSDP::post_forward", "forward"),
        ("forward", None, "forward"),
        ("backward", "FullyShardedDataParallel._pre_backward_prefetch", "pre-backward"),
        ("backward", "FullyShardedDataParallel._post_backward_prefetch", "pre-backward"),
        ("backward", "FSDP::all_gather", "pre-backward"),
        ("backward", "FSDP::backward_prefetch for blocks.2", "pre-backward"),
        ("backward", None, "backward"),
        ("backward", "FullyShardedDataParallel._post_backward_hook", "post-backward reduce-scatter"),
        ("backward", "FSDP::post_backward_reduce", "post-backward reduce-scatter"),
        ("backward", "fsdp::chunk_cat", "post-backward reduce-scatter"),
        ("optimizer", None, "optimizer"),
        ("backward", "FSDP::something_new", "FSDP::something_new"),
    ]
    frame = pl.DataFrame({"phase": [e[0] for e in expected], "label": [e[1] for e in expected]},
                         schema={"phase": pl.String, "label": pl.String})
    got = frame.select(fsdp_phase(pl.col("phase"), pl.col("label")))["phase"].to_list()
    assert got == [e[2] for e in expected]


def test_different_models_are_warned_about(tmp_path):
    """Two profile outputs whose manifests name different model shapes: a warning, still a diff."""
    import shutil

    for name, blocks in (("a", 4), ("b", 6)):
        out = tmp_path / name
        shutil.copytree(DATA / "h200x2-blocks4", out)
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["config"]["overrides"]["blocks"] = blocks
        (out / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, ["diff", "--format", "csv", str(tmp_path / "a" / "fsdp1"),
                                       str(tmp_path / "b" / "fsdp2")])
    assert result.exit_code == 0
    assert "warning: A and B ran different overrides" in result.stderr
    same = CliRunner().invoke(main, ["diff", "--format", "csv", str(DATA / "h200x2-blocks4" / "fsdp1"),
                                     str(DATA / "h200x2-blocks4" / "fsdp2")])
    assert same.exit_code == 0 and "ran different" not in same.stderr


def two_ranks(tmp_path):
    """k's duration (µs): A 100 on both ranks; B 80 on rank 0 (step 1) and 110 on rank 1
    (recorded as step 2). So rank 0 Δ −20, rank 1 Δ +10: sum −10, mean −5, and the ranks
    disagree in sign; B's rank 1 used step 2."""
    for side, durations, steps in (("a", (100.0, 100.0), (1, 1)), ("b", (80.0, 110.0), (1, 2))):
        (tmp_path / side).mkdir()
        for rank, (dur, step) in enumerate(zip(durations, steps)):
            events = [synth.step(step, 0.0, 500.0), *synth.launched("k", 1.0, 0.0, dur, corr=1)]
            synth.write(tmp_path / side, f"rank{rank}.json", synth.doc(events, rank=rank))
    return str(tmp_path / "a"), str(tmp_path / "b")


def test_ranks_each_sum_mean(tmp_path):
    a, b = two_ranks(tmp_path)
    each = CliRunner().invoke(main, ["diff", a, b])
    assert each.exit_code == 0, each.output
    assert "step 1 (rank 0), 2 (rank 1)" not in each.stdout  # each: one header per rank
    assert each.stdout.count("B − A: ") == 2 and "B − A: -0.020 ms" in each.stdout and "B − A: +0.010 ms" in each.stdout
    total = CliRunner().invoke(main, ["diff", "--ranks", "sum", a, b])
    assert "B − A: -0.010 ms" in total.stdout and "step 1 (rank 0), 2 (rank 1)" in total.stdout
    assert "None" not in total.stdout
    assert "ranks disagree on the step's Δ: rank 0 −0.020 ms, rank 1 +0.010 ms" in total.stderr
    assert "ranks disagree on compute k" in total.stderr
    mean = json.loads(CliRunner().invoke(main, ["diff", "--ranks", "mean", "--format", "json", a, b]).stdout)
    assert (mean["rank_agg"], mean["step_delta_ns"], mean["b_step"]) == ("mean", -5 * US, None)
    assert [(r["rank"], r["step_delta_ns"], r["b_step"]) for r in mean["ranks"]] == [(0, -20 * US, 1), (1, 10 * US, 2)]
    summed = json.loads(CliRunner().invoke(main, ["diff", "--format", "json", a, b]).stdout)
    assert (summed["rank_agg"], summed["step_delta_ns"]) == ("sum", -10 * US)


def test_lead_says_the_step_and_the_largest_item(tmp_path):
    """The pair of `pair`: B − A = −10 µs on rank 0; the all-gather's exposed time −20 µs, k2
    added +10 µs; no manifest, so the recorded step is the one compared."""
    from tracekit.analyses.lead import diff_lead

    a, b = pair(tmp_path)
    lead = diff_lead(diff_runs([a], [b]), "A", "B")
    assert lead[0] == "In the recorded step, B takes 0.010 ms less than A (on rank 0)."  # never tracekit's: no timed steps to miss
    # the pair holds no sign of its phases (no backward or optimizer op, no runner marks): no phase sentence
    assert lead[1] == "In the recorded step, exposed all-gather Float time is 0.020 ms less."
    assert lead[2] == "In the recorded step, B adds compute k2, 0.010 ms."
    assert len(lead) == 3


def test_no_timed_steps_is_said_only_of_traces_from_tracekits_runner(tmp_path):
    """Timed steps come from tracekit's runner (its manifest); a trace it made (its
    `tracekit#<phase>` marks) without one has none to compare — said —, any other trace never
    had them — not said."""
    from tracekit.analyses.lead import diff_lead

    events = [synth.step(1, 0.0, 500.0), synth.op("tracekit#forward", 0.5, 200.0),
              *synth.launched("k1", 1.0, 0.0, 100.0, corr=1)]
    later = [*events[:2], *synth.launched("k1", 1.0, 0.0, 90.0, corr=1)]  # B: k1 10 µs shorter (not the same trace)
    runner = tracekit.load(synth.write(tmp_path, "runner.json", synth.doc(events)))
    runner_b = tracekit.load(synth.write(tmp_path, "runner_b.json", synth.doc(later)))
    plain = tracekit.load(synth.write(tmp_path, "plain.json", synth.doc(events[:1] + events[2:])))
    plain_b = tracekit.load(synth.write(tmp_path, "plain_b.json", synth.doc(later[:1] + later[2:])))
    assert diff_lead(diff_runs([runner], [runner_b]), "A", "B")[0].endswith("(on rank 0; no timed steps to compare).")
    assert diff_lead(diff_runs([plain], [plain_b]), "A", "B")[0].endswith("(on rank 0).")


def test_a_trace_without_a_world_size_is_rank_n_alone_and_a_plain_trace_has_no_timed_steps_note():
    """A rank of a 2-GPU torchrun job against TraceLens' single-GPU trace, which records no
    `distributedInfo`: `B rank 0`, never `rank 0 of None`; neither trace is from tracekit's
    runner, so the lead says nothing of timed steps."""
    import gzip

    a = DATA / "h200x2-small" / "ddp" / "rank0.trace.json.gz"
    b = DATA / "wild" / "tracelens" / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    raw = [json.loads(gzip.decompress(p.read_bytes())) for p in (a, b)]
    assert raw[0]["distributedInfo"]["world_size"] == 2 and "distributedInfo" not in raw[1]
    assert not [e for r in raw for e in r["traceEvents"] if str(e.get("name", "")).startswith("tracekit#")]
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["diff", str(a), str(b)])
    assert result.exit_code == 0, result.output
    note = " ".join(line.strip() for line in result.stderr.splitlines())
    assert "A is rank 0 of world size 2, B rank 0: the one trace" in note and "None" not in note
    assert "timed steps" not in result.stdout


def test_data_loading_is_its_own_phase_not_the_next_kernels():
    """The TensorBoard plugin's ResNet-50 runs (PyTorch 1.8): the GPU idles while the host runs
    `enumerate(DataLoader)#…__next__`; that idle time is of the phase `data loading`, not of
    the work that follows it (it was put in `optimizer` and `backward`)."""
    import csv
    import io

    root = DATA / "wild" / "tensorboard-plugin"
    a = root / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
    b = root / "resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz"
    result = CliRunner().invoke(main, ["diff", "--format", "csv", "--top", "100000", str(a), str(b)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    loading = [r for r in rows if "DataLoader" in r["name"]]
    assert loading and {r["phase"] for r in loading} == {"data loading"}
    assert {r["phase"] for r in rows if "DataLoader" not in r["name"] and r["kind"] != "other"} <= {
        "forward", "backward", "optimizer", "unknown", ""}


def test_a_side_without_a_world_size_says_so_in_words():
    """TraceLens' H100 folder (no `distributedInfo`) against a 2-rank run: the ranks-and-world
    warning says the world size is not recorded, never `world size None` (issue 27)."""
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["diff", str(DATA / "wild" / "tracelens" / "h100"),
                                                             str(DATA / "h200x2-small" / "ddp")])
    assert result.exit_code == 0, result.output
    note = " ".join(line.strip() for line in result.stderr.splitlines())
    assert "(world size not recorded), B has 2 (world size 2)" in note and "None" not in result.output


def test_a_folder_of_traces_claiming_one_rank_says_which_one_it_compares():
    """TraceLens' H100 and MI300 folders each hold three single-GPU traces, all rank 0: the diff
    compares one pair, and says which file of each side that is (issue 27, D2)."""
    tracelens = DATA / "wild" / "tracelens"
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["diff", str(tracelens / "h100"), str(tracelens / "mi300")])
    assert result.exit_code == 0, result.output
    note = " ".join(line.strip() for line in result.stderr.splitlines())
    for side in "AB":
        assert (f"warning: {side}: 3 traces claim rank 0 (Falconsai_nsfw_image_detection__1016002.json.gz, "
                "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz, gaunernst_bert-small-uncased__1016001.json.gz): rank 0 "
                "is compared as Falconsai_nsfw_image_detection__1016002.json.gz") in note
    falconsai = [tracekit.load(tracelens / side / "Falconsai_nsfw_image_detection__1016002.json.gz")
                 for side in ("h100", "mi300")]
    alone = diff_runs(falconsai[:1], falconsai[1:])
    shown = json.loads(CliRunner().invoke(main, ["diff", "--format", "json", str(tracelens / "h100"),
                                                 str(tracelens / "mi300")]).stdout)
    assert shown["step_delta_ns"] == alone.per_rank[0].step_delta_ns


def test_lead_counts_a_single_host_sync_in_the_singular(tmp_path):
    """A calls cudaDeviceSynchronize once (40 µs) in its one step, B twice cudaStreamSynchronize
    (15 µs each) instead: the sync sentence reads `1 … is gone`, `adds 2 …` (it read `1 … are gone`)."""
    from tracekit.analyses.lead import sync_sentence

    base = [synth.step(1, 0.0, 200.0), *synth.launched("k1", 1.0, 5.0, 100.0, corr=1)]
    a = tracekit.load(synth.write(tmp_path, "a.json", synth.doc(
        base + [synth.call("cudaDeviceSynchronize", 10.0, 40.0, corr=9)], world_size=1)))
    b = tracekit.load(synth.write(tmp_path, "b.json", synth.doc(
        base + [synth.call("cudaStreamSynchronize", 10.0, 15.0, corr=9),
                synth.call("cudaStreamSynchronize", 30.0, 15.0, corr=10)], world_size=1)))
    assert sync_sentence(diff_runs([a], [b]), "A", "B") == (
        "A's 1 cudaDeviceSynchronize per rank (blocking the host 0.040 ms) is gone in B; "
        "B adds 2 cudaStreamSynchronize per rank (blocking the host 0.030 ms).")
    assert sync_sentence(diff_runs([b], [a]), "B", "A") == (
        "B's 2 cudaStreamSynchronize per rank (blocking the host 0.030 ms) are gone in A; "
        "A adds 1 cudaDeviceSynchronize per rank (blocking the host 0.040 ms).")


def test_both_sides_read_together_are_each_their_own_run(tmp_path):
    """`diff A B` reads both sides' ranks in one pool: each side is still its own traces — the
    CLI's per-rank steps equal `diff_runs` of each side loaded alone — and where B lies inside
    A (A's folder holds B's), A is what A alone gives and B what B alone gives."""
    import shutil

    blocks = DATA / "h200x2-blocks4"
    ddp, fsdp1 = blocks / "ddp", blocks / "fsdp1"

    def cli(a, b):
        result = CliRunner().invoke(main, ["diff", "--format", "json", str(a), str(b)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def alone(a, b):
        return diff_runs(tracekit.load(a).traces, tracekit.load(b).traces, 1)

    def steps(found):
        return [(r["rank"], r["a_step_ns"], r["b_step_ns"]) for r in found["ranks"]]

    together, expected = cli(ddp, fsdp1), alone(ddp, fsdp1)
    assert steps(together) == [(d.rank, d.a_step_ns, d.b_step_ns) for d in expected.per_rank]
    assert len({s for _, a, b in steps(together) for s in (a, b)}) == 4  # four traces, four steps
    outer = tmp_path / "outer"
    shutil.copytree(ddp, outer)
    shutil.copytree(fsdp1, outer / "inner")
    nested = cli(outer / "inner", outer)  # B holds A: A is fsdp1's ranks, B both folders'
    assert [(r["rank"], r["a_step_ns"]) for r in nested["ranks"]] == [
        (d.rank, d.a_step_ns) for d in alone(fsdp1, ddp).per_rank]


def test_a_collective_of_unknown_size_is_null_not_zero(tmp_path):
    """A's all-reduce kernel carries no size and nothing around its launch states one: its
    bytes are unknown (null in JSON), never 0 B; B's, with its args, is
    1024 floats; a kind a side does not have is 0 collectives of 0 B."""
    bare = synth.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 10.0, 20.0, 2,
                        stream=21)
    a = [synth.step(1, 0.0, 500.0), synth.call("cuLaunchKernelEx", 2.0, 1, 2, cat="cuda_driver"), bare]
    b = [synth.step(1, 0.0, 500.0), *synth.nccl("all_reduce", 2.0, 10.0, 20.0, corr=2, nelems=1024)]
    paths = [synth.write(tmp_path, f"{n}.json", synth.doc(e)) for n, e in (("a", a), ("b", b))]
    result = CliRunner().invoke(main, ["diff", "--format", "json", *map(str, paths)])
    (coll,) = json.loads(result.stdout)["collectives"]
    assert (coll["kind"], coll["a_count"], coll["a_bytes"], coll["b_count"], coll["b_bytes"]) == \
        ("all_reduce", 1, None, 1, 4096)
    result = CliRunner().invoke(main, ["diff", "--format", "json", *map(str, reversed(paths))])
    (coll,) = json.loads(result.stdout)["collectives"]
    assert (coll["a_bytes"], coll["b_bytes"]) == (4096, None)
    empty = [synth.step(1, 0.0, 500.0), *synth.launched("k", 1.0, 10.0, 20.0, corr=1)]
    c = synth.write(tmp_path, "c.json", synth.doc(empty))
    doc = json.loads(CliRunner().invoke(main, ["diff", "--format", "json", str(paths[0]), str(c)]).stdout)
    (coll,) = doc["collectives"]
    assert (coll["a_bytes"], coll["b_count"], coll["b_bytes"]) == (None, 0, 0)

def oracle_interval(deltas: np.ndarray) -> tuple[float, float, float]:
    """mean ± t(0.975, df) · √(s²/R · (1 + ρ)/(1 − ρ)) of per-round Δs, written out again from
    docs/metrics.md ("Noise and verdicts"): r the lag-1 autocorrelation, ρ = r' + √((1 − r'²)/R)
    with r' = r + (1 + 3r)/R, clipped to [0, 0.95]; df = ⌊R (1 − ρ²)/(1 + ρ²)⌋ − 1, at least 1."""
    from scipy import stats

    n, mean = len(deltas), float(np.mean(deltas))
    c = deltas - mean
    r = float(np.sum(c[1:] * c[:-1]) / np.sum(c * c)) if np.sum(c * c) > 0 else 0.0
    r += (1 + 3 * r) / n
    rho = min(0.95, max(0.0, r + np.sqrt(max(0.0, 1 - min(1.0, r) ** 2) / n)))
    df = max(1.0, np.floor(n * (1 - rho ** 2) / (1 + rho ** 2)) - 1)
    h = stats.t.ppf(0.975, df) * np.sqrt(np.var(deltas, ddof=1) / n * (1 + rho) / (1 - rho))
    return mean, mean - h, mean + h


@pytest.mark.parametrize("per_round", [None, 2])
def test_every_items_interval_over_the_recorded_steps_of_a_real_run(per_round):
    """tests/data/h200x1-cupti (H200, fsdp1 against fsdp2): 10 recorded cupti steps a variant,
    5 rounds of 2. Paired by step number (10 rounds of one step) and as an interleaved
    recording's rounds of 2 steps: each item's mean Δ and interval recomputed here with numpy
    from the per-step item tables (per round, the mean over its steps of B − A, a step without
    the item counting 0; `oracle_interval`), the step's likewise from the steps' times; the
    items' Δs sum exactly to the step's; the items within noise come after all the others."""
    from tracekit.analyses.diff import VIEWS, combine, material
    from tracekit.core.loading import load_profile

    _, runs = load_profile(DATA / "h200x1-cupti")
    a, b = (material(runs[v].traces[0]) for v in ("fsdp1", "fsdp2"))
    result = combine([a], [b], "all", 10, per_round=per_round)
    d = result.together
    assert result.pairing == ("rounds" if per_round else "steps") and d.rounds == (5 if per_round else 10)
    steps, size = sorted(set(a.times) & set(b.times)), per_round or 1
    assert steps == list(range(1, 11))
    key = VIEWS["kernel"]

    def table(m):
        return {(s, tuple(r[k] for k in key)): r["ns"] for s, r in ((r["step"], r) for r in m.items.to_dicts())}

    ta, tb = table(a), table(b)
    names = {k for _, k in ta} | {k for _, k in tb}
    rounds = [steps[i:i + size] for i in range(0, len(steps), size)]
    checked = 0
    for row in d.all_items.to_dicts():
        item = tuple(row[k] for k in key)
        assert item in names
        deltas = np.array([np.mean([tb.get((s, item), 0) - ta.get((s, item), 0) for s in r]) for r in rounds])
        mean, lo, hi = oracle_interval(deltas)
        assert abs(row["delta_ns"] - mean) <= 1  # whole ns, apportioned
        assert (row["delta_lo_ns"], row["delta_hi_ns"]) == pytest.approx((lo, hi), abs=1)
        assert row["within_noise"] == (lo <= 0 <= hi)
        checked += 1
    assert checked == len(names) == d.all_items.height
    step_deltas = np.array([np.mean([b.times[s] - a.times[s] for s in r]) for r in rounds])
    _, lo, hi = oracle_interval(step_deltas)
    assert d.step_delta_ci_ns == pytest.approx([lo, hi], abs=1)
    assert d.all_items["delta_ns"].sum() == d.step_delta_ns == d.b_step_ns - d.a_step_ns
    assert d.a_step_ns == round(np.mean([a.times[s] for s in steps]))
    noise = d.all_items["within_noise"].to_list()
    assert noise == sorted(noise) and 0 < sum(noise) < len(noise)
