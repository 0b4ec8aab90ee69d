"""Comparing the variants of one `tracekit profile` output (docs/metrics.md, docs/profile.md).

- `variant_table`: one row per variant and rank: the timed step pooled over ranks with its
  95 % interval, its delta against the baseline with an interval and a verdict (over one
  run's steps, or across repeats: `timed.py`, `noise.py`), drift, the recorded steps' time and
  the profiler's overhead (`fidelity.py`), memory against the model-state estimate,
  recompiles, throughput, the recorded step's figures, precision path and first loss.
- `phase_table`: the same per phase (the runner's phase timers), beside the recorded steps'.
- `step_split`, `timed_steps`: each variant's recorded step split beside its timed step.
- `critical_split`: each variant's recorded step split along its critical path.
- `variant_diffs`: each variant's exact diff against the baseline.
"""

from __future__ import annotations

import statistics

import numpy as np
import polars as pl

from tracekit.analyses.diff import RunDiff, combine, material, median_step, step_times
from tracekit.analyses.noise import drift, effective_steps, median_ci, repeats_delta_ci
from tracekit.analyses.breakdown import breakdown
from tracekit.analyses.critical_path import run_critical_paths
from tracekit.analyses.summary import summary
from tracekit.core.model import Run
from tracekit.core.timing import training_steps
from tracekit.analyses.timed import (PHASE_ORDER, compare, comparison, phase_clock, recorded_phases, repeat_series,
                                    timed)
from tracekit.analyses.fidelity import profiler_overhead, profiler_slowed, recorded_to_timed


def prepared(run: Run, variants: list[str]) -> None:
    """What a report reads of each trace of one of `variants`, made ahead (and kept on the
    traces): the summary, the critical paths with the run's collective arrivals and, where
    there are other variants to diff it with, the diff material — for `loading.load_profile`
    to make where it loads the variant, beside the others."""
    for t in run.traces:
        summary(t)
        if len(variants) > 1:
            material(t)
    run_critical_paths(run.traces)


def recorded_step(run: Run) -> dict[int, dict]:
    """rank → the summary row of its median profiled step (by time; the only one with one)."""
    rows = {}
    for t in run.traces:
        times = step_times(t)
        table = summary(t).filter(pl.col("step").is_not_null())
        chosen = median_step(times) if times else table["step"].max()
        rows[t.rank] = table.filter(pl.col("step") == chosen).row(0, named=True)
    return rows


def traced_step_ms(row: dict) -> float | None:
    """The recorded step's time read from its trace (ms: the device span of the median step,
    `recorded_step`), for manifests that predate `profiled_step_ms`; None without device work."""
    span = row.get("gpu_span_ns")
    return round(span / 1e6, 3) if span else None


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
    base = timed(manifest, base_name) if base_name else None
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok":
            rows.append({"variant": variant, "status": entry.get("status"), "verdict": entry.get("status"),
                         "message": entry.get("message")})
            continue
        series = repeat_series(entry)
        steps = np.concatenate([s["step"] for s in series])
        medians = [float(np.median(s["step"])) for s in series]
        _, lo, hi = median_ci(series[0]["step"]) if len(series) == 1 else repeats_delta_ci(medians)
        lo, hi = float(lo), float(hi)
        delta = compare(base, timed(manifest, variant), "step")
        recorded = recorded_step(runs[variant]) if variant in runs else {}
        for r in entry["ranks"]:
            s = recorded.get(r["rank"], {})
            profiled = r.get("profiled_step_ms") or []
            rank_ms = statistics.median(training_steps(r))
            traced = traced_step_ms(s) if not profiled else None
            state = (r.get("model_state_bytes") or {}).get("total")
            peak = r["peak_allocated_bytes"]
            rows.append({
                "variant": variant, "rank": r["rank"], "status": "ok", "precision": r.get("precision_path"),
                "step_ms": round(float(np.median(steps)), 3), "step_ms_ci": [round(max(lo, 0.0), 3), round(hi, 3)],
                "d_step_ms": delta["d_ms"],
                "d_step_ms_ci": delta["d_ms_ci"] if variant != base_name else None,
                "verdict": delta["verdict"] if variant != base_name else "base",
                "repeats": len(series), "rounds": delta.get("rounds"),
                "outlying_rounds": delta.get("outlying_rounds") if variant != base_name else None,
                "n_steps": len(series[-1]["step"]),
                "effective_steps": round(effective_steps(series[-1]["step"]), 1),
                "drift": round(drift(series[-1]["step"]), 3),
                "rank_step_ms": round(rank_ms, 3),
                "profile_mode": r.get("profile_mode", manifest["config"].get("profile_mode")) if profiled else None,
                "profiled_step_ms": round(statistics.median(profiled), 3) if profiled else traced,
                "profiler_overhead": profiler_overhead(r),
                "recorded_to_timed": recorded_to_timed(r) if profiled else
                (round(traced / rank_ms, 3) if traced is not None else None),
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


def comparison_summary(manifest: dict, baseline: str | None = None) -> dict:
    """How the variants were compared (`timed.comparison`: design, note, block_steps, rounds,
    order, control), `repeats` (sequential), and with an A/A control its step Δ against the
    variant it copies (`control_of`, else the baseline): `control_d_ms`, `control_d_ms_ci`,
    `control_verdict` — true Δ 0, so an interval without 0 says the comparison is unsound here."""
    out = {**comparison(manifest), "repeats": manifest.get("config", {}).get("repeats") or 1}
    entry = manifest["variants"].get(out["control"] or "")
    if entry and entry.get("status") == "ok":
        of = entry.get("control_of") or base_variant(manifest, baseline)
        c = compare(timed(manifest, of), timed(manifest, out["control"]), "step")
        out |= {"control_of": of, "control_d_ms": c.get("d_ms"), "control_d_ms_ci": c.get("d_ms_ci"),
                "control_verdict": c.get("verdict")}
    return out


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


def critical_split(runs: dict[str, Run]) -> pl.DataFrame:
    """Per variant, its recorded step's critical path (each rank's median step, collective
    arrivals across its ranks; `critical_path.py`) split into host, runtime, compute, comm,
    copy and waiting, and span_ms: ms, mean over ranks."""
    columns = ("span", "host", "runtime", "compute", "comm", "copy", "waiting")
    rows = []
    for variant, run in runs.items():
        for t, path in zip(run.traces, run_critical_paths(run.traces)):
            times = step_times(t)
            if not times:
                continue
            row = path.filter(pl.col("step") == median_step(times))
            rows.append(row.select(pl.lit(variant).alias("variant"), *[pl.col(f"{c}_ns") for c in columns]))
    if not rows:
        return pl.DataFrame(schema={"variant": pl.String, **{f"{c}_ms": pl.Float64 for c in columns}})
    return (pl.concat(rows).group_by("variant", maintain_order=True)
            .agg(*[(pl.col(f"{c}_ns").mean() / 1e6).round(3).alias(f"{c}_ms") for c in columns]))


def phase_table(manifest: dict, baseline: str | None = None) -> pl.DataFrame:
    """One row per (variant, phase): the phase's median time in the timed steps (device time
    on CUDA, host time otherwise), its share of the step, B − A against the base with its
    interval and verdict, and the same phase in the recorded steps (`recorded_ms`) with its
    Δ — where the recorded steps' time went against where the timed steps' did."""
    base_name = base_variant(manifest, baseline)
    if not base_name:
        return pl.DataFrame()
    base, base_recorded = timed(manifest, base_name), recorded_phases(manifest["variants"][base_name])
    rows = []
    for variant, entry in manifest["variants"].items():
        if entry.get("status") != "ok" or not phase_clock(entry["ranks"]):
            continue
        series, recorded = repeat_series(entry), recorded_phases(entry)
        step = float(np.median(np.concatenate([s["step"] for s in series])))
        side = timed(manifest, variant)
        for phase in [p for p in (*PHASE_ORDER, "step") if p in series[0]]:
            c = compare(base, side, phase)
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


def variant_diffs(runs: dict[str, Run], top: int, base: str | None = None,
                  per_round: int | None = None) -> dict[tuple[str, str], RunDiff]:
    """Each variant against `base` (default: the first that ran; `diff.combine` of the traces'
    materials over every recorded step, in rounds of `per_round` steps where the recording was
    interleaved, as `tracekit diff` does: without each side's per-activity items); a run
    without device work (CPU) is diffed over its host ops."""
    names = list(runs)
    base = base if base in names else (names[0] if names else None)
    return {(base, other): combine(*[[material(t) for t in runs[v].traces] for v in (base, other)], "all", top,
                                   per_round=per_round)
            for other in names if other != base}
