"""Comparing the variants of one `tracekit profile` output, and checking the traces against
what the runtime counted (docs/metrics.md, docs/profile.md).

- `variant_table`: one row per variant and rank: the timed step pooled over ranks with its
  95 % interval, its delta against the baseline with an interval and a verdict (over one
  run's steps, or across repeats: `repeat_series`, `compare`, `noise.py`), drift, the
  recorded steps' time and the profiler's overhead, memory against the model-state estimate,
  recompiles, throughput, the recorded step's figures, precision path and first loss.
  `report_warnings` says what the reader must know before trusting the comparison.
- `phase_table`: the same per phase (the runner's phase timers), beside the recorded steps'.
- `real_delta`, `reconciliation`, `fidelity_warnings`: what the timed steps say of B − A per
  phase, set beside what the recorded steps' timers and the trace's diff say.
- `count_check`: each recorded step's trace-derived counts against the runtime's own counts of
  that step, for each recording (the attributed one, and the `full` step naming a `lean`
  one). Compared: `Event.synchronize` ↔ host `cudaEventSynchronize` (GPU traces), and
  each collective kind ↔ the Python collective calls of that kind, for all_gather and
  reduce_scatter always and for other kinds when the runtime saw any. Kinds issued from C++
  (DDP's reducer all-reduces) are invisible to the runtime counters and not compared. Nor are
  collectives of a one-rank GPU run: NCCL runs a one-rank collective as a device copy, with
  no collective kernel to count (FSDP1 at world size 1 still calls `all_reduce`).
- `parity_check`: each variant's first-step loss and grad norm against the first variant's
  (the same weights and data: they must agree within `PARITY`), and the parameter checksums
  after the timed steps (`param_parity_rows`).
"""

from __future__ import annotations

import statistics

import numpy as np
import polars as pl

from tracekit.analyses.diff import RunDiff, diff_runs, median_step, phase_attribution, step_times
from tracekit.analyses.noise import (DRIFT_WARN, delta_ci, drift_pct, effective_steps, median_ci, pooled,
                                     repeats_delta_ci, unpaired_repeats_ci, verdict)
from tracekit.analyses.breakdown import breakdown
from tracekit.analyses.summary import summary
from tracekit.model import Run

# runtime counter → (summary column prefix, field)
RUNTIME_KEYS = {
    "Event.synchronize": ("syncs", "cudaEventSynchronize"),
    "all_gather_into_tensor": ("collectives", "all_gather"), "all_gather_single": ("collectives", "all_gather"),
    "all_gather": ("collectives", "all_gather"),
    "reduce_scatter_tensor": ("collectives", "reduce_scatter"), "reduce_scatter_single": ("collectives", "reduce_scatter"),
    "reduce_scatter": ("collectives", "reduce_scatter"),
    "all_reduce": ("collectives", "all_reduce"), "broadcast": ("collectives", "broadcast"),
    "reduce": ("collectives", "reduce"), "all_to_all_single": ("collectives", "all_to_all"),
    "all_to_all": ("collectives", "all_to_all"),
}
ALWAYS_COMPARED = ("syncs.cudaEventSynchronize", "collectives.all_gather", "collectives.reduce_scatter")
PARITY = {"loss": 1e-3, "grad_norm": 1e-2}  # relative tolerance of the first step's figures
OVERHEAD_WARN = 1.10  # recorded ÷ control median step: the profiler's own cost
SHIFT_WARN = 0.10  # |machine_shift − 1| beyond which the machine's speed moved between timed and recorded steps


def step_rows(run: Run) -> dict[int, list[dict]]:
    """rank → the summary rows of its profiled steps (device rows summed), in step order."""
    out = {}
    for t in run.traces:
        table = summary(t).filter(pl.col("step").is_not_null()).sort("step")
        out[t.rank] = table.to_dicts()
    return out


def recorded_step(run: Run) -> dict[int, dict]:
    """rank → the summary row of its median profiled step (by time; the only one with one)."""
    rows = {}
    for t in run.traces:
        times = step_times(t)
        table = summary(t).filter(pl.col("step").is_not_null())
        chosen = median_step(times) if times else table["step"].max()
        rows[t.rank] = table.filter(pl.col("step") == chosen).row(0, named=True)
    return rows


def training_steps(r: dict) -> list[float]:
    """A rank's timed steps (ms) that did not save a checkpoint: what training alone costs
    (`r` a rank's measurements, or one repeat's record of them)."""
    steps = r["step_ms"]["all"] if isinstance(r["step_ms"], dict) else r["step_ms"]
    ckpt = r.get("checkpoint")
    if ckpt and "saved_steps" not in r:
        return ckpt["step_ms_without_save"]
    return kept(r, steps)


def pooled_steps(entry: dict) -> np.ndarray:
    return pooled([training_steps(r) for r in entry["ranks"]])


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


def recorded_to_timed(r: dict) -> float | None:
    """A rank's median recorded step ÷ its median timed step: the profiler's cost and whatever
    changed on the machine between the timed and the recorded steps. None without recorded steps."""
    profiled = r.get("profiled_step_ms")
    if not profiled:
        return None
    return r.get("recorded_to_timed") or round(statistics.median(profiled) / r["step_ms"]["median"], 3)


def phase_clock(ranks: list[dict]) -> str | None:
    """`device` where the phase timers have CUDA events, else `host`; None without timers."""
    timers = ranks[0].get("phase_ms") if ranks else None
    if not timers:
        return None
    return "device" if timers.get("device") else "host"


def repeat_series(entry: dict) -> list[dict[str, np.ndarray]]:
    """Per repeat that ran: `step` (the training steps pooled over ranks) and, where the phase
    timers ran, each phase's time in those steps pooled over ranks (the slowest rank's per
    step) — device time on CUDA, host time otherwise (`runners/clock.py`)."""
    out = []
    for record in [x for x in entry.get("repeats") or [entry] if x.get("status", "ok") == "ok"]:
        ranks = record["ranks"]
        series = {"step": pooled([training_steps(r) for r in ranks])}
        clock = phase_clock(ranks)
        if clock:
            for phase in ranks[0]["phase_ms"][clock]:
                if phase not in ("step", "checkpoint"):
                    series[phase] = pooled([kept(r, r["phase_ms"][clock][phase]) for r in ranks])
        out.append(series)
    return out


def kept(r: dict, values: list[float]) -> list[float]:
    """`values` (one per timed step) of the steps that did not save a checkpoint."""
    saved = set(r.get("saved_steps", []))
    return [v for i, v in enumerate(values) if i not in saved]


def compare(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]], key: str) -> dict:
    """B − A of `key` (`step` or a phase), ms: both medians, Δ with its 95 % interval and the
    verdict — across repeats (paired by repeat) when both sides have the same number, two or
    more; unpaired across repeats (Welch) when both have two or more but not as many; else over
    the steps, each side's repeats pooled (docs/metrics.md, "Noise and verdicts")."""
    a, b = [x[key] for x in a if key in x], [y[key] for y in b if key in y]
    if not a or not b:
        return {}
    a_all, b_all = np.concatenate(a), np.concatenate(b)
    n_steps, repeats = min(len(x) for x in a + b), min(len(a), len(b))
    if len(a) == len(b) >= 2:  # paired by repeat
        d, lo, hi = repeats_delta_ci([float(np.median(y) - np.median(x)) for x, y in zip(a, b)])
        effective = float(repeats)
    elif repeats >= 2:  # two launches with different numbers of repeats: nothing pairs
        d, lo, hi = unpaired_repeats_ci([float(np.median(x)) for x in a], [float(np.median(y)) for y in b])
        effective = float(repeats)
    else:  # one run on a side: the steps, each side's repeats pooled
        (d, lo, hi, effective), repeats = delta_ci(a_all, b_all), 1
    d, lo, hi = float(d), float(lo), float(hi)
    return {"a_ms": round(float(np.median(a_all)), 3), "b_ms": round(float(np.median(b_all)), 3),
            "d_ms": round(d, 3), "d_ms_ci": [round(lo, 3), round(hi, 3)], "repeats": repeats,
            "verdict": verdict(lo, hi, n_steps, effective, repeats)}


def recompile_ms(r: dict) -> float:
    """Σ over the warm-up and timed steps that recompiled of (its time − the median of the
    timed steps that did not), in ms: what recompiling cost. The first step, which compiles
    from nothing, is not counted."""
    times, hit = r["step_ms"]["all"], set(r.get("recompiled_steps", []))
    rest = statistics.median([t for i, t in enumerate(times) if i not in hit] or times)
    warmup = r.get("warmup_step_ms", [])
    slow = [times[i] for i in hit] + [warmup[i] for i in r.get("recompiled_warmup_steps", [])]
    return round(sum(t - rest for t in slow), 3)


def checkpoint_columns(r: dict) -> dict:
    """Per save (medians, ms): how long the loop was blocked, how long until the save was
    complete; the size of one save; and `ckpt_cost_ms`, what saving cost the loop per save in
    all: (Σ timed steps − their count × the median step without a save) ÷ saves — the stall
    plus any slowing of the steps around it (an async save's writing competes for the host)."""
    ckpt = r.get("checkpoint")
    if not ckpt or not ckpt["stall_ms"]:
        return {}
    times = r["step_ms"]["all"]
    extra = sum(times) - len(times) * statistics.median(ckpt["step_ms_without_save"])
    return {"ckpt_mode": ckpt["mode"], "ckpt_stall_ms": round(statistics.median(ckpt["stall_ms"]), 3),
            "ckpt_total_ms": round(statistics.median(ckpt["total_ms"]), 3), "ckpt_bytes": ckpt["bytes"],
            "ckpt_cost_ms": round(extra / len(ckpt["stall_ms"]), 3)}


def base_variant(manifest: dict, baseline: str | None = None) -> str | None:
    """The variant others are compared with: `baseline`, else the first that ran."""
    ok = [v for v, e in manifest["variants"].items() if e.get("status") == "ok"]
    if baseline is None:
        return ok[0] if ok else None
    if baseline not in ok:
        raise ValueError(f"--baseline {baseline}: not a variant that ran (ran: {', '.join(ok) or 'none'})")
    return baseline


def variant_table(manifest: dict, runs: dict[str, Run], baseline: str | None = None) -> pl.DataFrame:
    rows = []
    base_name = base_variant(manifest, baseline)
    base = repeat_series(manifest["variants"][base_name]) if base_name else None
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok":
            rows.append({"variant": variant, "status": entry.get("status"), "message": entry.get("message")})
            continue
        series = repeat_series(entry)
        steps = np.concatenate([s["step"] for s in series])
        medians = [float(np.median(s["step"])) for s in series]
        _, lo, hi = median_ci(series[0]["step"]) if len(series) == 1 else repeats_delta_ci(medians)
        lo, hi = float(lo), float(hi)
        delta = compare(base, series, "step")
        recorded = recorded_step(runs[variant]) if variant in runs else {}
        for r in entry["ranks"]:
            s = recorded.get(r["rank"], {})
            profiled = r.get("profiled_step_ms") or []
            state = (r.get("model_state_bytes") or {}).get("total")
            peak = r["peak_allocated_bytes"]
            rows.append({
                "variant": variant, "rank": r["rank"], "status": "ok", "precision": r.get("precision_path"),
                "step_ms": round(float(np.median(steps)), 3), "step_ms_ci": [round(lo, 3), round(hi, 3)],
                "d_step_ms": delta["d_ms"],
                "d_step_ms_ci": delta["d_ms_ci"] if variant != base_name else None,
                "verdict": delta["verdict"] if variant != base_name else "base",
                "repeats": len(series), "n_steps": len(series[-1]["step"]),
                "effective_steps": round(effective_steps(series[-1]["step"]), 1),
                "drift_pct": round(drift_pct(series[-1]["step"]), 1),
                "rank_step_ms": round(statistics.median(training_steps(r)), 3),
                "profile_mode": r.get("profile_mode", manifest["config"].get("profile_mode")) if profiled else None,
                "profiled_step_ms": round(statistics.median(profiled), 3) if profiled else None,
                "profiler_overhead": profiler_overhead(r), "recorded_to_timed": recorded_to_timed(r),
                "profiler_slowed": profiler_slowed(r) if profiled else None,
                "tokens_per_s": entry.get("tokens_per_s"),
                "peak_allocated_bytes": peak, "model_state_bytes": state,
                "other_bytes": peak - state if peak is not None and state is not None else None,
                "recompiles": r.get("recompiles"), "recompile_ms": recompile_ms(r) if r.get("recompiles") else 0.0,
                **checkpoint_columns(r),
                "cpu_ns": s.get("cpu_ns"), "gpu_span_ns": s.get("gpu_span_ns"), "gpu_busy_ns": s.get("gpu_busy_ns"),
                "exposed_comm_ns": s.get("exposed_comm_ns"), "idle_ns": s.get("idle_ns"),
                "host_bound": s.get("host_bound"),
                "syncs": sum(v for k, v in s.items() if k.startswith("syncs.")),
                "collectives": sum(v for k, v in s.items() if k.startswith("collectives.")),
                "loss": r["first_step"]["loss"], "grad_norm": r["first_step"]["grad_norm"],
            })
    return pl.DataFrame(rows, infer_schema_length=None)


PHASE_ORDER = ("forward", "backward", "optimizer")
IDLE_CAUSES = 5  # idle causes named in `step_split`; the rest is `idle: other`


def timed_steps(table: pl.DataFrame) -> pl.DataFrame:
    """variant, step_ms, step_ms_ci: one row per variant that ran (of `variant_table`)."""
    if "step_ms" not in table.columns:
        return pl.DataFrame(schema={"variant": pl.String, "step_ms": pl.Float64, "step_ms_ci": pl.List(pl.Float64)})
    return (table.filter(pl.col("status") == "ok").unique("variant", maintain_order=True)
            .select("variant", "step_ms", "step_ms_ci"))


def step_split(runs: dict[str, Run]) -> pl.DataFrame:
    """Per variant, its recorded step (each rank's median step, `diff.median_step`) split into
    compute, exposed comm, memcpy (with memset) and idle by cause, ms, mean over ranks
    (`breakdown`; devices summed). The `IDLE_CAUSES` largest idle causes over all variants
    are named, the rest is `idle: other`. Runs without device work give no rows."""
    frames = []
    for variant, run in runs.items():
        for t in [t for t in run.traces if t.has_gpu]:
            step = median_step(step_times(t))
            frames.append(breakdown(t).filter(pl.col("step") == step).explode("parts").unnest("parts")
                          .select(pl.lit(variant).alias("variant"), pl.lit(t.rank).alias("rank"), "category",
                                  "cause", "ns"))
    if not frames:
        return pl.DataFrame(schema={"variant": pl.String, "part": pl.String, "ms": pl.Float64})
    parts = pl.concat(frames).with_columns(part=pl.when(pl.col("category") == "idle")
                                           .then(pl.concat_str(pl.lit("idle: "), pl.col("cause").fill_null("?")))
                                           .when(pl.col("category") == "comm").then(pl.lit("exposed comm"))
                                           .when(pl.col("category") == "memset").then(pl.lit("memcpy"))
                                           .otherwise(pl.col("category")))
    named = (parts.filter(pl.col("category") == "idle").group_by("part").agg(pl.col("ns").sum())
             .sort("ns", "part", descending=[True, False]).head(IDLE_CAUSES)["part"])
    parts = parts.with_columns(part=pl.when((pl.col("category") == "idle") & ~pl.col("part").is_in(named.implode()))
                               .then(pl.lit("idle: other")).otherwise(pl.col("part")))
    ranks = parts.group_by("variant").agg(n=pl.col("rank").n_unique())
    order = {v: i for i, v in enumerate(runs)}
    return (parts.group_by("variant", "part").agg(pl.col("ns").sum()).join(ranks, on="variant")
            .select("variant", "part", ms=(pl.col("ns") / pl.col("n") / 1e6).round(3))
            .sort(pl.col("variant").replace_strict(order, return_dtype=pl.Int64), "part"))


def recorded_phases(entry: dict) -> dict[str, float]:
    """Per phase, the median over the recorded steps (the ones `diff` attributes) of its time
    pooled over ranks, ms; `step` their span."""
    ranks = [r for r in entry.get("ranks", []) if r.get("recorded")]
    clock = phase_clock([r["recorded"][0] for r in ranks]) if ranks else None
    if not clock:
        return {}
    phases = ranks[0]["recorded"][0]["phase_ms"][clock]
    return {p: round(float(np.median(pooled([r["recorded"][0]["phase_ms"][clock][p] for r in ranks]))), 3)
            for p in phases}


def phase_table(manifest: dict, baseline: str | None = None) -> pl.DataFrame:
    """One row per (variant, phase): the phase's median time in the timed steps (device time
    on CUDA, host time otherwise), its share of the step, B − A against the base with its
    interval and verdict, and the same phase in the recorded steps (`recorded_ms`) with its
    Δ — where the recorded steps' time went against where the timed steps' did."""
    base_name = base_variant(manifest, baseline)
    if not base_name:
        return pl.DataFrame()
    base_entry = manifest["variants"][base_name]
    base, base_recorded = repeat_series(base_entry), recorded_phases(base_entry)
    rows = []
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok" or not phase_clock(entry["ranks"]):
            continue
        series, recorded = repeat_series(entry), recorded_phases(entry)
        step = float(np.median(np.concatenate([s["step"] for s in series])))
        for phase in [p for p in (*PHASE_ORDER, "step") if p in series[0]]:
            c = compare(base, series, phase)
            ms = float(np.median(np.concatenate([s[phase] for s in series])))
            rows.append({
                "variant": variant, "phase": phase, "clock": phase_clock(entry["ranks"]), "ms": round(ms, 3),
                "pct_of_step": round(100 * ms / step, 1) if step else None,
                "d_ms": c["d_ms"], "d_ms_ci": c["d_ms_ci"] if variant != base_name else None,
                "verdict": c["verdict"] if variant != base_name else "base",
                "recorded_ms": recorded.get(phase),
                "d_recorded_ms": round(recorded[phase] - base_recorded[phase], 3)
                if phase in recorded and phase in base_recorded else None})
    return pl.DataFrame(rows, schema={"variant": pl.String, "phase": pl.String, "clock": pl.String, "ms": pl.Float64,
                                      "pct_of_step": pl.Float64, "d_ms": pl.Float64, "d_ms_ci": pl.List(pl.Float64),
                                      "verdict": pl.String, "recorded_ms": pl.Float64, "d_recorded_ms": pl.Float64})


def report_warnings(table: pl.DataFrame, profile_mode: str = "full") -> list[str]:
    """What makes a comparison of these variants shaky: drift, profiler overhead (under
    `profile_mode`), host-bound steps (they measure Python, not kernels)."""
    if "rank" not in table.columns:
        return []
    out = []
    for (variant,), rows in table.filter(pl.col("status") == "ok").group_by("variant", maintain_order=True):
        drift = rows["drift_pct"][0]
        if abs(drift) > DRIFT_WARN:
            out.append(f"{variant}: step time drifted {drift:+.1f} % over the timed steps (warm-up not over?)")
        slowed = rows.filter(pl.col("profiler_slowed").fill_null(False))
        if slowed.height:
            if profile_mode not in ("device", "lean"):
                hint = "--profile-mode device (the default) records least"
            elif slowed["gpu_busy_ns"].is_null().all():
                hint = "a CPU run: the profiler's own cost and this machine's noise"
            else:
                busy = (slowed["gpu_busy_ns"] / slowed["gpu_span_ns"]).min()
                hint = (f"the GPU was busy {100 * busy:.0f} % of the recorded step or more; CUPTI's cost per CUDA "
                        "call, which every capture mode pays, is step time where the host sets the pace")
            on = ", ".join(f"{r['profiler_overhead']:.2f}× (rank {r['rank']})" for r in slowed.iter_rows(named=True))
            out.append(f"{variant}: the profiler slowed the recorded steps {on} (against unprofiled steps run right "
                       f"around them): the trace shows a slower step than the one timed ({hint})")
        moved = [(r["rank"], machine_shift(r["recorded_to_timed"], r["profiler_overhead"]))
                 for r in rows.filter(pl.col("recorded_to_timed").is_not_null()).iter_rows(named=True)]
        moved = [(rank, m) for rank, m in moved if abs(m - 1) > SHIFT_WARN]
        if moved:
            on = ", ".join(f"{m:.2f}× (rank {rank})" for rank, m in moved)
            out.append(f"{variant}: the unprofiled steps around the recording took {on} the timed ones: this "
                       "machine's speed changed between the timed loop and the recording")
        bound = rows.filter(pl.col("host_bound").fill_null(False))["rank"].to_list()
        if bound:
            out.append(f"{variant}: host-bound on rank(s) {bound}: the GPU idles for the host most of the "
                       "recorded step; a comparison measures Python and launch overhead, not kernels")
    return out


def real_delta(a: dict, a_variant: str, b: dict, b_variant: str) -> dict | None:
    """What the timed steps say of B − A, from two profile manifests: `step` and each phase
    (`compare`), each side's recorded phases (`recorded_phases`) and, of one rank per side
    (`<side>_rank`: the one whose recorded steps are farthest from its timed or control
    steps), `profiler_overhead`, `recorded_to_timed` and `profiler_slowed`. None when either has no timed steps."""
    ea, eb = a["variants"].get(a_variant), b["variants"].get(b_variant)
    if not ea or not eb or ea.get("status") != "ok" or eb.get("status") != "ok":
        return None
    sa, sb = repeat_series(ea), repeat_series(eb)

    def farthest(entry):
        """The rank whose recorded steps are farthest from its timed or control steps."""
        ranks = [r for r in entry["ranks"] if recorded_to_timed(r) is not None]
        if not ranks:
            return {}
        r = max(ranks, key=lambda r: max(abs(recorded_to_timed(r) - 1), abs(profiler_overhead(r) - 1)))
        return {"rank": r["rank"], "profiler_overhead": profiler_overhead(r), "recorded_to_timed": recorded_to_timed(r),
                "profiler_slowed": profiler_slowed(r)}

    return {"step": compare(sa, sb, "step"),
            "phases": {p: compare(sa, sb, p) for p in PHASE_ORDER if p in sa[0] and p in sb[0]},
            "a_recorded": recorded_phases(ea), "b_recorded": recorded_phases(eb),
            "a_profile_mode": ea["ranks"][0].get("profile_mode"), "b_profile_mode": eb["ranks"][0].get("profile_mode"),
            **{f"{side}_{k}": v for side, entry in (("a", ea), ("b", eb)) for k, v in farthest(entry).items()}}


def reconciliation(real: dict, attributed: pl.DataFrame) -> pl.DataFrame:
    """Per phase and for the whole step: the real Δ (timed steps, with interval and verdict)
    beside the Δ of the recorded steps' phase timers and the Δ the trace attributes
    (`attributed`: phase, device_delta_ns, idle_delta_ns per rank on average), split into
    device time and idle; `unexplained_ms` = real − attributed, and `within`, whether the
    attributed Δ lies inside the real Δ's interval."""
    rows = []
    by_phase = {r["phase"]: r for r in attributed.iter_rows(named=True)}
    whole = {"device_delta_ns": int(attributed["device_delta_ns"].sum()),
             "idle_delta_ns": int(attributed["idle_delta_ns"].sum())}
    for phase, c in [*real["phases"].items(), ("step", real["step"])]:
        if not c:
            continue
        got = whole if phase == "step" else by_phase.get(phase, {"device_delta_ns": 0, "idle_delta_ns": 0})
        traced = (got["device_delta_ns"] + got["idle_delta_ns"]) / 1e6
        recorded = (real["b_recorded"].get(phase, np.nan) - real["a_recorded"].get(phase, np.nan))
        lo, hi = c["d_ms_ci"]
        rows.append({"phase": phase, "real_d_ms": c["d_ms"], "real_d_ms_ci": c["d_ms_ci"], "verdict": c["verdict"],
                     "recorded_d_ms": None if np.isnan(recorded) else round(float(recorded), 3),
                     "attributed_d_ms": round(traced, 3), "device_d_ms": round(got["device_delta_ns"] / 1e6, 3),
                     "idle_d_ms": round(got["idle_delta_ns"] / 1e6, 3),
                     "unexplained_ms": round(c["d_ms"] - traced, 3), "within": bool(lo <= traced <= hi)})
    return pl.DataFrame(rows, schema={
        "phase": pl.String, "real_d_ms": pl.Float64, "real_d_ms_ci": pl.List(pl.Float64), "verdict": pl.String,
        "recorded_d_ms": pl.Float64, "attributed_d_ms": pl.Float64, "device_d_ms": pl.Float64,
        "idle_d_ms": pl.Float64, "unexplained_ms": pl.Float64, "within": pl.Boolean})


def fidelity_warnings(real: dict, table: pl.DataFrame, sides: bool = True) -> list[str]:
    """Where the attributed Δ falls outside the real Δ's interval (by phase and whole step),
    when the profiler clearly slowed a side's recorded steps (`profiler_slowed`), and when the
    machine's speed moved by more than `SHIFT_WARN` between a side's timed loop and its
    recording (`machine_shift`) — those two unless not `sides` (the report says them per
    variant)."""
    out = []
    for r in table.filter(~pl.col("within")).iter_rows(named=True):
        where = "the step" if r["phase"] == "step" else f"the {r['phase']} phase"
        out.append(f"{where}: the trace attributes {r['attributed_d_ms']:+.3f} ms but the timed steps say "
                   f"{r['real_d_ms']:+.3f} ms {r['real_d_ms_ci']}: {r['unexplained_ms']:+.3f} ms unexplained")
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


def with_real(result: RunDiff, a: dict | None, a_variant: str | None, b: dict | None,
              b_variant: str | None, sides: bool = True) -> list[str]:
    """Sets the diff's real Δ (`real_delta`) and its `reconciliation` with the trace's phase
    attribution, when both sides' manifests give timed steps; the warnings it raises (models
    that differ, attribution outside the real Δ's interval, and with `sides` each side's
    recording: `fidelity_warnings`)."""
    warnings = config_mismatch(a, b)
    if a and b:
        result.real = real_delta(a, a_variant, b, b_variant)
        if result.real:
            result.reconciled = reconciliation(result.real, phase_attribution(result.together, len(result.per_rank)))
            warnings += fidelity_warnings(result.real, result.reconciled, sides)
    return warnings


def variant_diffs(runs: dict[str, Run], top: int, base: str | None = None) -> dict[tuple[str, str], RunDiff]:
    """Each variant against `base` (default: the first that ran; `diff.diff_runs`); a run
    without device work (CPU) is diffed over its host ops, as `tracekit diff` does."""
    names = list(runs)
    base = base if base in names else (names[0] if names else None)
    return {(base, other): diff_runs(runs[base].traces, runs[other].traces, "all", top)
            for other in names if other != base}


MODEL_KEYS = ("preset", "overrides", "seed")


def config_mismatch(a: dict | None, b: dict | None) -> list[str]:
    """Warnings when two profile runs' manifests say they trained different models or data."""
    if not a or not b:
        return []
    return [f"A and B ran different {key}: {a['config'].get(key)} vs {b['config'].get(key)}"
            for key in MODEL_KEYS if a["config"].get(key) != b["config"].get(key)]


def count_check(manifest: dict, runs: dict[str, Run], names: dict[str, Run] | None = None) -> pl.DataFrame:
    """One row per (variant, recording, rank, recorded step, counted thing): runtime, trace,
    match. `runs` are the attributed recordings, `names` the `full` steps that name `lean`
    ones. A `lean` recording without device activity (CPU) holds no ops: nothing to count."""
    rows = []
    for variant, entry in manifest["variants"].items():
        recordings = [(0, runs.get(variant)), (1, (names or {}).get(variant))]
        for index, run in [(i, run) for i, run in recordings if run is not None]:
            traced = step_rows(run)
            gpu = run.traces[0].has_gpu
            one_rank_gpu = gpu and run.traces[0].world_size == 1
            for r in entry["ranks"]:
                recording = r["recorded"][index] if r.get("recorded") else \
                    {"mode": manifest.get("config", {}).get("profile_mode", "full"),
                     "runtime_counts_per_step": r.get("runtime_counts_per_step") or [r["runtime_counts"]]}
                if recording["mode"] in ("device", "lean") and not gpu:
                    continue
                per_step = recording["runtime_counts_per_step"]
                for step, counted in zip(traced[r["rank"]][-len(per_step):], per_step):
                    runtime: dict[str, int] = {}
                    for key, n in counted.items():
                        if key in RUNTIME_KEYS:
                            col = ".".join(RUNTIME_KEYS[key])
                            runtime[col] = runtime.get(col, 0) + n
                    compared = set(runtime) | set(ALWAYS_COMPARED)
                    if not gpu:
                        compared.discard("syncs.cudaEventSynchronize")
                    if one_rank_gpu:
                        compared = {c for c in compared if not c.startswith("collectives.")}
                    for col in sorted(compared):
                        trace_n, runtime_n = step.get(col) or 0, runtime.get(col, 0)
                        rows.append({"variant": variant, "recording": recording["mode"], "rank": r["rank"],
                                     "step": step["step"], "count": col, "runtime": runtime_n, "trace": trace_n,
                                     "match": trace_n == runtime_n})
    return pl.DataFrame(rows, schema={"variant": pl.String, "recording": pl.String, "rank": pl.Int64,
                                      "step": pl.Int64, "count": pl.String, "runtime": pl.Int64, "trace": pl.Int64,
                                      "match": pl.Boolean})


def parity_check(manifest: dict) -> pl.DataFrame:
    """One row per (variant, rank, figure): the first variant's value, this one's, the
    relative difference, the tolerance and whether it holds. Figures: the first step's `loss`
    and `grad_norm` (tolerance `PARITY`), and where the manifest has them the parameter
    checksums after the timed steps (`param_parity_rows`)."""
    ok = {v: e for v, e in manifest["variants"].items() if e.get("status") == "ok"}
    rows = []
    if ok:
        base_name, base = next(iter(ok.items()))
        base_by_rank = {r["rank"]: r for r in base["ranks"]}
        for variant, entry in ok.items():
            for r in entry["ranks"]:
                for figure, tolerance in PARITY.items():
                    want, got = base_by_rank[r["rank"]]["first_step"][figure], r["first_step"][figure]
                    rel = abs(got - want) / max(abs(want), 1e-12)
                    rows.append({"variant": variant, "rank": r["rank"], "figure": figure, "base": base_name,
                                 "base_value": want, "value": got, "rel_diff": rel, "tolerance": tolerance,
                                 "match": rel <= tolerance})
                rows += param_parity_rows(base_name, base_by_rank[r["rank"]], variant, r,
                                          manifest.get("config", {}).get("precision") == "bf16")
    return pl.DataFrame(rows, schema={"variant": pl.String, "rank": pl.Int64, "figure": pl.String, "base": pl.String,
                                      "base_value": pl.Float64, "value": pl.Float64, "rel_diff": pl.Float64,
                                      "tolerance": pl.Float64, "match": pl.Boolean})


def param_tolerance(*variants: str) -> float:
    """The tolerance of the parameter checksums between two variants: the looser of theirs —
    1e-1 for float8 variants (their matmuls round to float8), 1e-2 for compiled ones
    (inductor fuses and reorders reductions), else 1e-3 (docs/metrics.md)."""
    return max(1e-1 if "fp8" in v else 1e-2 if "compile" in v else 1e-3 for v in variants)


BF16_ELEMENT_TOLERANCE = 1e-2  # one AdamW step (lr 1e-4) taken in one variant only, over rms θ ~ 0.02: 5e-3


def param_parity_rows(base_name: str, base: dict, variant: str, rank: dict, bf16: bool = False) -> list[dict]:
    """Rows comparing `rank`'s parameter checksum with the base variant's on the same rank (none
    when either lacks one). Relative differences, each scaled so that changing every element
    by a fraction ε gives at most ε: `params.sum` |Δ Σθ| ÷ (‖θ‖₂·√n), `params.sum_sq`
    |Δ Σθ²| ÷ Σθ², and each sampled element `params.<name>[i]` |Δθᵢ| ÷ max(|θᵢ|, rms θ).
    In bf16 runs a sampled element's tolerance is at least `BF16_ELEMENT_TOLERANCE`: an element
    whose gradient is near zero can take AdamW's step in one variant and not in another."""
    want, got = base.get("param_checksum"), rank.get("param_checksum")
    if not want or not got:
        return []
    tolerance = param_tolerance(base_name, variant)
    norm = max(want["sum_sq"], 1e-300) ** 0.5
    rms = norm / max(want["numel"], 1) ** 0.5
    figures = [("params.sum", want["sum"], got["sum"], norm * want["numel"] ** 0.5),
               ("params.sum_sq", want["sum_sq"], got["sum_sq"], abs(want["sum_sq"]))]
    samples = dict(got["samples"])
    figures += [(f"params.{name}", value, samples.get(name, float("nan")), max(abs(value), rms))
                for name, value in want["samples"]]
    rows = []
    for figure, a, b, scale in figures:
        rel = abs(b - a) / max(scale, 1e-300)
        limit = max(tolerance, BF16_ELEMENT_TOLERANCE) if bf16 and figure not in ("params.sum", "params.sum_sq") \
            else tolerance
        rows.append({"variant": variant, "rank": rank["rank"], "figure": figure, "base": base_name, "base_value": a,
                     "value": b, "rel_diff": rel, "tolerance": limit, "match": bool(rel <= limit)})
    return rows


def capacity_table(result: dict) -> pl.DataFrame:
    """Per variant: the largest preset (in the order probed) and, within it, the largest batch
    that trained; then what stopped it (the first failing probe after it)."""
    probes = pl.DataFrame(result["probes"], schema={
        "preset": pl.String, "batch": pl.Int64, "variant": pl.String, "status": pl.String, "message": pl.String,
        "peak_allocated_bytes": pl.Int64, "manifest": pl.String})
    order = {p: i for i, p in enumerate(result["presets"])}
    probes = probes.with_columns(size=pl.col("preset").replace_strict(order, return_dtype=pl.Int64))
    rows = []
    for (variant,), tried in probes.sort("size", "batch").group_by("variant", maintain_order=True):
        tried = tried.with_row_index("order")
        ok = tried.filter(pl.col("status") == "ok")
        best = ok.row(-1, named=True) if ok.height else None
        failed = tried.filter((pl.col("status") != "ok") & (pl.col("order") > (best["order"] if best else -1)))
        stop = failed.row(0, named=True) if failed.height else None
        rows.append({"variant": variant, "largest_preset": best and best["preset"], "largest_batch": best and best["batch"],
                     "peak_allocated_bytes": best and best["peak_allocated_bytes"],
                     "stopped_by": stop and f"{stop['status']} at {stop['preset']} batch {stop['batch']}",
                     "probes": tried.height})
    return pl.DataFrame(rows, schema={"variant": pl.String, "largest_preset": pl.String, "largest_batch": pl.Int64,
                                      "peak_allocated_bytes": pl.Int64, "stopped_by": pl.String, "probes": pl.Int64})
