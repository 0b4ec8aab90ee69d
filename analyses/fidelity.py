"""How far the recorded step can be trusted about the timed ones (docs/metrics.md).

- `profiler_overhead` (recorded ÷ the control steps beside the recording: the profiler's cost),
  `recorded_to_timed` (that and the machine's drift), `machine_shift`, `profiler_slowed`;
- `report_warnings`: what the reader must know before trusting the comparison;
- `real_delta`, `reconciliation`, `fidelity_warnings`, `with_real`: what the timed steps say of
  B − A per phase, set beside what the recorded steps' timers and the trace's diff say.
"""

from __future__ import annotations

import statistics

import numpy as np
import polars as pl

from tracekit.analyses.diff import RunDiff, phase_attribution
from tracekit.analyses.noise import DRIFT_WARN, FEW_REPEATS, OUTLIER_MADS, REPEATS_TO_DECIDE, drift_words
from tracekit.analyses.timed import PHASE_ORDER, compare, recorded_phases, timed
from tracekit.core.words import listed


OVERHEAD_WARN = 1.10  # recorded ÷ control median step: the profiler's own cost
SHIFT_WARN = 0.10  # |machine_shift − 1| beyond which the machine's speed moved between timed and recorded steps


def recorded_to_timed(r: dict) -> float | None:
    """A rank's median recorded step ÷ its median timed step: the profiler's cost and whatever
    changed on the machine between the timed and the recorded steps. None without recorded steps."""
    profiled = r.get("profiled_step_ms")
    if not profiled:
        return None
    return r.get("recorded_to_timed") or round(statistics.median(profiled) / r["step_ms"]["median"], 3)


def profiler_overhead(r: dict) -> float | None:
    """What the profiler cost a rank's steps: its median recorded step ÷ its median control
    step (the recording's procedure without the profiler, run right before and after it);
    manifests without control steps: ÷ its median timed step. None without recorded steps."""
    profiled = r.get("profiled_step_ms")
    if not profiled:
        return None
    return r.get("profiler_overhead") or recorded_to_timed(r)


def machine_shift(recorded_to_timed: float, profiler_overhead: float | None) -> float:
    """How much the machine's speed changed between the timed loop and the recording: the
    control step ÷ the timed step (= recorded ÷ timed over recorded ÷ control)."""
    return recorded_to_timed / (profiler_overhead or 1.0)


def profiler_slowed(r: dict) -> bool:
    """Whether the profiler clearly slowed a rank's recorded steps: `profiler_overhead` above
    `OVERHEAD_WARN` and every recorded step slower than every control step (with one recorded
    step and two control steps, noise alone often gives a ratio past 1.10)."""
    overhead = profiler_overhead(r)
    if overhead is None or overhead <= OVERHEAD_WARN:
        return False
    control = r.get("control_step_ms")
    return not control or min(r["profiled_step_ms"]) > max(control)


def report_warnings(table: pl.DataFrame, profile_mode: str = "full") -> list[str]:
    """What makes a comparison of these variants shaky, each with the figures it is about:
    two repeats (`FEW_REPEATS`); drift; a recorded step off the timed one — the profiler's cost (`profiler_slowed`), a
    recording faster than the unprofiled steps around it, the machine's speed moving between
    the timed loop and the recording (`machine_shift`), or, without control steps, the
    recorded step itself off the timed one (`recorded_to_timed`); host-bound steps (they
    measure Python, not kernels)."""
    if "rank" not in table.columns:
        return []
    out = [FEW_REPEATS] if "repeats" in table.columns and (table["repeats"] == 2).any() else []
    for (variant,), rows in table.filter(pl.col("status") == "ok").group_by("variant", maintain_order=True):
        drift = rows["drift"][0]
        if not 1 / DRIFT_WARN <= drift <= DRIFT_WARN:
            out.append(f"{variant}: the timed steps ran {drift_words(drift)} (median of the last third ÷ the "
                       f"first third: {drift:.2f}); warm-up not over, or the machine's speed changed")
        recorded = rows.filter(pl.col("profiled_step_ms").is_not_null())
        slowed = recorded.filter(pl.col("profiler_slowed").fill_null(False))
        if slowed.height:
            out.append(f"{variant}: the profiler slowed the recorded steps {around(slowed)} ({slowing_hint(slowed, profile_mode)})")
        sped = recorded.filter(pl.col("profiler_overhead") < 1 / OVERHEAD_WARN)
        if sped.height:
            out.append(f"{variant}: the recorded steps ran faster than the unprofiled steps around them, "
                       f"{around(sped)}: noise or the machine's speed moving, not the profiler")
        moved = recorded.filter(pl.col("profiler_overhead").is_not_null()).with_columns(
            control=pl.col("profiled_step_ms") / pl.col("profiler_overhead"))
        moved = moved.filter((pl.col("control") / pl.col("rank_step_ms") - 1).abs() > SHIFT_WARN)
        if moved.height:
            on = ", ".join(f"{r['control'] / r['rank_step_ms']:.2f}× (rank {r['rank']}: {r['control']:.1f} ms against "
                           f"{r['rank_step_ms']:.1f} ms)" for r in moved.iter_rows(named=True))
            out.append(f"{variant}: the unprofiled steps around the recording took {on} the timed ones: this "
                       "machine's speed changed between the timed loop and the recording")
        bare = recorded.filter(pl.col("profiler_overhead").is_null()
                               & ((pl.col("recorded_to_timed") - 1).abs() > SHIFT_WARN))
        if bare.height:
            on = ", ".join(f"{r['recorded_to_timed']:.2f}× (rank {r['rank']}: {r['profiled_step_ms']:.1f} ms recorded "
                           f"against {r['rank_step_ms']:.1f} ms timed)" for r in bare.iter_rows(named=True))
            out.append(f"{variant}: the recorded step took {on} the timed one: the trace's figures are of another "
                       "step than the one timed (no unprofiled steps ran around the recording to say why)")
        bound = rows.filter(pl.col("host_bound").fill_null(False))["rank"].to_list()
        if bound:
            out.append(f"{variant}: host-bound on {listed('rank', bound)}: the GPU idles for the host most of the "
                       "recorded step; a comparison measures Python and launch overhead, not kernels")
    return out


def comparison_warnings(summary: dict, table: pl.DataFrame) -> list[str]:
    """What the design says about the verdicts (`variants.comparison_summary`): an A/A control
    whose interval excludes 0; one sequential repeat (no verdict, and how many repeats would
    give one); interleaved rounds whose Δ lies far from the others' (`noise.outlying_rounds`)."""
    out = []
    lo, hi = summary.get("control_d_ms_ci") or (None, None)
    if lo is not None and not lo <= 0 <= hi:
        out.append(f"the A/A control {summary['control']} − {summary['control_of']} = {summary['control_d_ms']:+.3f} ms "
                   f"[{lo:+.3f}, {hi:+.3f}] excludes 0: two copies of one variant differ on this machine, so the "
                   "comparison is unsound here (the other Δs may be off by as much)")
    compared = table.filter((pl.col("status") == "ok") & (pl.col("verdict") != "base")) if "rank" in table.columns \
        else table.clear()
    if summary["design"] == "sequential" and summary["repeats"] == 1 and compared.height:
        why = f" ({summary['note']})" if summary.get("note") else ""
        out.append(f"one sequential repeat{why}: each variant ran in its own workers, one after the other, so a Δ "
                   "holds the two processes' levels and the machine's drift as well as the variants' difference: "
                   f"no verdict; --repeats {REPEATS_TO_DECIDE} or more decide (2 hold but rarely decide), or the "
                   "interleaved comparison")
    if "outlying_rounds" in compared.columns:
        for (variant,), rows in compared.group_by("variant", maintain_order=True):
            far = rows["outlying_rounds"][0]
            if far is not None and len(far):
                out.append(f"{variant}: the Δ of {listed('round', list(far))} of {rows['rounds'][0]} "
                           f"{'lies' if len(far) == 1 else 'lie'} more than {OUTLIER_MADS:g} robust σ from the "
                           "other rounds': a disturbance of a block or two; kept in the mean, it widens the interval")
    return out


def around(rows: pl.DataFrame) -> str:
    """Each rank's recorded ÷ control step with both figures: "1.30× (rank 0: 13.0 ms against 10.0 ms)"."""
    return ", ".join(f"{r['profiler_overhead']:.2f}× (rank {r['rank']}: {r['profiled_step_ms']:.1f} ms recorded "
                     f"against {r['profiled_step_ms'] / r['profiler_overhead']:.1f} ms unprofiled right around them)"
                     for r in rows.iter_rows(named=True))


def slowing_hint(slowed: pl.DataFrame, profile_mode: str) -> str:
    """Why the profiler may have cost that much, and what records less."""
    if profile_mode not in ("cupti", "device", "lean"):
        return "--profile-mode cupti (the default) records least"
    if slowed["gpu_busy_ns"].is_null().all():
        return "a CPU run: the profiler's own cost and this machine's noise"
    busy = (slowed["gpu_busy_ns"] / slowed["gpu_span_ns"]).min()
    if profile_mode == "cupti":
        return (f"the GPU was busy {100 * busy:.0f} % of the recorded step or more; where the host sets the pace "
                "a few recorded steps move with the machine (cupti cost 1.07× in a paired benchmark)")
    return (f"the GPU was busy {100 * busy:.0f} % of the recorded step or more; torch.profiler's CUDA capture "
            "pays CUPTI's cost per CUDA call, step time where the host sets the pace; --profile-mode cupti does not")


def real_delta(a: dict, a_variant: str, b: dict, b_variant: str) -> dict | None:
    """What the timed steps say of B − A, from two profile manifests: `step` and each phase
    (`compare`), each side's recorded phases (`recorded_phases`) and, of one rank per side
    (`<side>_rank`: the one whose recorded steps are farthest from its timed or control
    steps), `profiler_overhead`, `recorded_to_timed` and `profiler_slowed`. None when either has no timed steps."""
    ea, eb = a["variants"].get(a_variant), b["variants"].get(b_variant)
    if not ea or not eb or ea.get("status") != "ok" or eb.get("status") != "ok":
        return None
    sa, sb = timed(a, a_variant), timed(b, b_variant)

    def farthest(entry):
        """The rank whose recorded steps are farthest from its timed or control steps."""
        ranks = [r for r in entry["ranks"] if recorded_to_timed(r) is not None]
        if not ranks:
            return {}
        r = max(ranks, key=lambda r: max(abs(recorded_to_timed(r) - 1), abs(profiler_overhead(r) - 1)))
        return {"rank": r["rank"], "profiler_overhead": profiler_overhead(r), "recorded_to_timed": recorded_to_timed(r),
                "profiler_slowed": profiler_slowed(r)}

    return {"step": compare(sa, sb, "step"),
            "phases": {p: compare(sa, sb, p) for p in PHASE_ORDER if p in sa["repeats"][0] and p in sb["repeats"][0]},
            "a_recorded": recorded_phases(ea), "b_recorded": recorded_phases(eb),
            "a_profile_mode": ea["ranks"][0].get("profile_mode"), "b_profile_mode": eb["ranks"][0].get("profile_mode"),
            **{f"{side}_{k}": v for side, entry in (("a", ea), ("b", eb)) for k, v in farthest(entry).items()}}


def reconciliation(real: dict, attributed: pl.DataFrame) -> pl.DataFrame:
    """Per phase and for the whole step: the real Δ (timed steps, with interval and verdict)
    beside the Δ of the recorded steps' phase timers and the Δ the trace attributes
    (`attributed`: phase, device_delta_ns, idle_delta_ns per rank on average), split into
    device time and idle; `unexplained_ms` = real − attributed, and `within`, whether the
    attributed Δ lies inside the real Δ's interval. A phase the trace attributes but no timed
    timer measured has its row with the real Δ empty. The step's row sums every item, those in
    no phase (`other`: host work outside the runner's phases) included."""
    rows = []
    by_phase = {r["phase"]: r for r in attributed.iter_rows(named=True)}
    whole = {"device_delta_ns": int(attributed["device_delta_ns"].sum()),
             "idle_delta_ns": int(attributed["idle_delta_ns"].sum())}
    phases = [p for p in PHASE_ORDER if real["phases"].get(p) or p in by_phase]
    for phase, c in [*((p, real["phases"].get(p)) for p in phases), ("step", real["step"])]:
        if phase == "step" and not c:
            continue
        got = whole if phase == "step" else by_phase.get(phase, {"device_delta_ns": 0, "idle_delta_ns": 0})
        traced = (got["device_delta_ns"] + got["idle_delta_ns"]) / 1e6
        recorded = (real["b_recorded"].get(phase, np.nan) - real["a_recorded"].get(phase, np.nan))
        lo, hi = c["d_ms_ci"] if c else (None, None)
        rows.append({"phase": phase, "real_d_ms": c and c["d_ms"], "real_d_ms_ci": c and c["d_ms_ci"],
                     "verdict": c and c["verdict"],
                     "recorded_d_ms": None if np.isnan(recorded) else round(float(recorded), 3),
                     "attributed_d_ms": round(traced, 3), "device_d_ms": round(got["device_delta_ns"] / 1e6, 3),
                     "idle_d_ms": round(got["idle_delta_ns"] / 1e6, 3),
                     "unexplained_ms": round(c["d_ms"] - traced, 3) if c else None,
                     "within": bool(lo <= traced <= hi) if c else None})
    return pl.DataFrame(rows, schema=RECONCILIATION)


RECONCILIATION = {"phase": pl.String, "real_d_ms": pl.Float64, "real_d_ms_ci": pl.List(pl.Float64),
                  "verdict": pl.String, "recorded_d_ms": pl.Float64, "attributed_d_ms": pl.Float64,
                  "device_d_ms": pl.Float64, "idle_d_ms": pl.Float64, "unexplained_ms": pl.Float64,
                  "within": pl.Boolean}


def fidelity_warnings(real: dict, table: pl.DataFrame, sides: bool = True) -> list[str]:
    """Where the attributed Δ falls outside the real Δ's interval (by phase and whole step;
    not where too few steps make the interval no evidence),
    when the profiler clearly slowed a side's recorded steps (`profiler_slowed`), and when the
    machine's speed moved by more than `SHIFT_WARN` between a side's timed loop and its
    recording (`machine_shift`) — those two unless not `sides` (the report says them per
    variant)."""
    out = []
    for r in table.filter(~pl.col("within") & ~pl.col("verdict").str.starts_with("too few")).iter_rows(named=True):
        where = "the step" if r["phase"] == "step" else f"the {r['phase']} phase"
        out.append(f"{where}: the trace attributes {r['attributed_d_ms']:+.3f} ms but the timed steps say "
                   f"{r['real_d_ms']:+.3f} ms [{r['real_d_ms_ci'][0]:+.3f}, {r['real_d_ms_ci'][1]:+.3f}]: "
                   f"{r['unexplained_ms']:+.3f} ms unexplained")
    for side in ("a", "b") if sides else ():
        overhead, shift = real.get(f"{side}_profiler_overhead"), real.get(f"{side}_recorded_to_timed")
        who = f"{side.upper()} rank {real.get(f'{side}_rank')}"
        if real.get(f"{side}_profiler_slowed"):
            out.append(f"{who}: the profiler ({real[f'{side}_profile_mode']} mode) slowed the recorded steps "
                       f"{overhead:.2f}× (against unprofiled steps right around them)")
        if shift is not None and abs(machine_shift(shift, overhead) - 1) > SHIFT_WARN:
            out.append(f"{who}: the unprofiled steps around the recording ran {machine_shift(shift, overhead):.2f}× "
                       "the timed ones: the machine's speed changed between the timed loop and the recording")
    return out


MODEL_KEYS = ("preset", "overrides", "seed")


def config_mismatch(a: dict | None, b: dict | None) -> list[str]:
    """Warnings when two profile runs' manifests say they trained different models or data."""
    if not a or not b:
        return []
    return [f"A and B ran different {key}: {a['config'].get(key)} vs {b['config'].get(key)}"
            for key in MODEL_KEYS if a["config"].get(key) != b["config"].get(key)]


def with_real(result: RunDiff, a: dict | None, a_variant: str | None, b: dict | None,
              b_variant: str | None, sides: bool = True) -> list[str]:
    """Sets the diff's real Δ (`real_delta`) and its `reconciliation` with the trace's phase
    attribution, when both sides' manifests give timed steps; the warnings it raises (models
    that differ, attribution outside the real Δ's interval, and with `sides` each side's
    recording: `fidelity_warnings`). Not where A and B are the same traces (`RunDiff.same`):
    their timed steps are one run's, no difference to weigh against noise."""
    warnings = config_mismatch(a, b)
    if a and b and result.same is None:
        result.real = real_delta(a, a_variant, b, b_variant)
        if result.real:
            result.reconciled = reconciliation(result.real, phase_attribution(result.together, len(result.per_rank)))
            warnings += fidelity_warnings(result.real, result.reconciled, sides)
    return warnings
