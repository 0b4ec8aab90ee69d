"""Comparing the variants of one `tracekit profile` output, and checking the traces against
what the runtime counted (docs/metrics.md, docs/profile.md).

- `variant_table`: one row per variant and rank: the unprofiled step time pooled over ranks
  with its 95 % CI, its delta against the first variant that ran with a CI and a verdict,
  drift, the profiled steps' time and the profiler's overhead, memory against the model-state
  estimate, recompiles, throughput, the recorded step's figures, precision path and first
  loss. `report_warnings` says what the reader must know before trusting the comparison.
- `count_check`: each profiled step's trace-derived counts against the runtime's own counts of
  that step. Compared: `Event.synchronize` ↔ host `cudaEventSynchronize` (GPU traces), and
  each collective kind ↔ the Python collective calls of that kind, for all_gather and
  reduce_scatter always and for other kinds when the runtime saw any. Kinds issued from C++
  (DDP's reducer all-reduces) are invisible to the runtime counters and not compared. Nor are
  collectives of a one-rank GPU run: NCCL runs a one-rank collective as a device copy, with
  no collective kernel to count (FSDP1 at world size 1 still calls `all_reduce`).
- `parity_check`: each variant's first-step loss and grad norm against the first variant's
  (the same weights and data: they must agree within `PARITY`).
"""

from __future__ import annotations

import statistics

import numpy as np
import polars as pl

from tracekit.analyses.diff import RunDiff, diff_runs, median_step, step_times
from tracekit.analyses.noise import DRIFT_WARN, delta_ci, drift_pct, median_ci, pooled, verdict
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
OVERHEAD_WARN = 1.25  # profiled ÷ unprofiled median step


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
    """A rank's timed steps (ms) that did not save a checkpoint: what training alone costs."""
    ckpt = r.get("checkpoint")
    return ckpt["step_ms_without_save"] if ckpt else r["step_ms"]["all"]


def pooled_steps(entry: dict) -> np.ndarray:
    return pooled([training_steps(r) for r in entry["ranks"]])


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


def variant_table(manifest: dict, runs: dict[str, Run]) -> pl.DataFrame:
    rows = []
    ok = [v for v, e in manifest["variants"].items() if e["status"] == "ok"]
    base = pooled_steps(manifest["variants"][ok[0]]) if ok else None
    for variant, entry in manifest["variants"].items():
        if entry["status"] != "ok":
            rows.append({"variant": variant, "status": entry["status"], "message": entry.get("message")})
            continue
        steps = pooled_steps(entry)
        median, lo, hi = median_ci(steps)
        d, d_lo, d_hi = delta_ci(base, steps)
        recorded = recorded_step(runs[variant]) if variant in runs else {}
        for r in entry["ranks"]:
            s = recorded.get(r["rank"], {})
            profiled = r.get("profiled_step_ms") or []
            state = (r.get("model_state_bytes") or {}).get("total")
            peak = r["peak_allocated_bytes"]
            rows.append({
                "variant": variant, "rank": r["rank"], "status": "ok", "precision": r.get("precision_path"),
                "step_ms": round(median, 3), "step_ms_ci": [round(lo, 3), round(hi, 3)],
                "d_step_ms": round(d, 3),
                "d_step_ms_ci": [round(d_lo, 3), round(d_hi, 3)] if variant != ok[0] else None,
                "verdict": verdict(d_lo, d_hi) if variant != ok[0] else "base",
                "drift_pct": round(drift_pct(steps), 1), "n_steps": len(steps),
                "rank_step_ms": round(statistics.median(training_steps(r)), 3),
                "profiled_step_ms": round(statistics.median(profiled), 3) if profiled else None,
                "profiler_overhead": round(statistics.median(profiled) / r["step_ms"]["median"], 3) if profiled else None,
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
        worst = rows["profiler_overhead"].drop_nulls().max()
        if worst is not None and worst > OVERHEAD_WARN:
            hint = "--profile-mode light records less" if profile_mode == "full" else \
                "already --profile-mode light: the profiler's per-op cost on a host-bound step"
            out.append(f"{variant}: profiled steps took {worst:.2f}× the unprofiled ones: the trace shows a "
                       f"slower step than the one timed ({hint})")
        bound = rows.filter(pl.col("host_bound").fill_null(False))["rank"].to_list()
        if bound:
            out.append(f"{variant}: host-bound on rank(s) {bound}: the GPU idles for the host most of the "
                       "recorded step; a comparison measures Python and launch overhead, not kernels")
    return out


def unprofiled_delta(a: dict, a_variant: str, b: dict, b_variant: str) -> dict | None:
    """B's unprofiled step time − A's (ms) with its CI and verdict, and each side's profiler
    overhead, from two profile manifests; None when either variant has no timed steps."""
    ea, eb = a["variants"].get(a_variant), b["variants"].get(b_variant)
    if not ea or not eb or ea.get("status") != "ok" or eb.get("status") != "ok":
        return None
    d, lo, hi = delta_ci(pooled_steps(ea), pooled_steps(eb))

    def overhead(entry):
        values = [statistics.median(r["profiled_step_ms"]) / r["step_ms"]["median"]
                  for r in entry["ranks"] if r.get("profiled_step_ms")]
        return round(max(values), 3) if values else None

    return {"d_step_ms": round(d, 3), "d_step_ms_ci": [round(lo, 3), round(hi, 3)], "verdict": verdict(lo, hi),
            "a_profiler_overhead": overhead(ea), "b_profiler_overhead": overhead(eb)}


def fidelity_warnings(profiled_ms: float, unprofiled: dict) -> list[str]:
    """When the profiled diff and the unprofiled timing disagree in sign, or the profiler
    slowed a side by more than 25 %."""
    out = []
    if unprofiled["verdict"] != "no change" and (profiled_ms > 0) != (unprofiled["d_step_ms"] > 0):
        out.append(f"the profiled steps say B − A = {profiled_ms:+.3f} ms but the unprofiled timed steps say "
                   f"{unprofiled['d_step_ms']:+.3f} ms {unprofiled['d_step_ms_ci']}: the diff explains steps that "
                   "are not the ones timed")
    for side in ("a", "b"):
        overhead = unprofiled[f"{side}_profiler_overhead"]
        if overhead is not None and overhead > OVERHEAD_WARN:
            out.append(f"{side.upper()}'s profiled steps took {overhead:.2f}× its unprofiled ones")
    return out


def variant_diffs(runs: dict[str, Run], top: int) -> dict[tuple[str, str], RunDiff]:
    """Each variant against the first one that ran (`diff.diff_runs`); CPU-only runs have no
    GPU span to attribute and give none."""
    names = [n for n, run in runs.items() if run.traces[0].has_gpu]
    return {(names[0], other): diff_runs(runs[names[0]].traces, runs[other].traces, "all", top)
            for other in names[1:]}


MODEL_KEYS = ("preset", "overrides", "seed")


def config_mismatch(a: dict | None, b: dict | None) -> list[str]:
    """Warnings when two profile runs' manifests say they trained different models or data."""
    if not a or not b:
        return []
    return [f"A and B ran different {key}: {a['config'].get(key)} vs {b['config'].get(key)}"
            for key in MODEL_KEYS if a["config"].get(key) != b["config"].get(key)]


def count_check(manifest: dict, runs: dict[str, Run]) -> pl.DataFrame:
    """One row per (variant, rank, profiled step, counted thing): runtime, trace, match."""
    rows = []
    for variant, run in runs.items():
        traced = step_rows(run)
        gpu = run.traces[0].has_gpu
        one_rank_gpu = gpu and run.traces[0].world_size == 1
        for r in manifest["variants"][variant]["ranks"]:
            per_step = r.get("runtime_counts_per_step") or [r["runtime_counts"]]
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
                    rows.append({"variant": variant, "rank": r["rank"], "step": step["step"], "count": col,
                                 "runtime": runtime_n, "trace": trace_n, "match": trace_n == runtime_n})
    return pl.DataFrame(rows, schema={"variant": pl.String, "rank": pl.Int64, "step": pl.Int64, "count": pl.String,
                                      "runtime": pl.Int64, "trace": pl.Int64, "match": pl.Boolean})


def parity_check(manifest: dict) -> pl.DataFrame:
    """One row per (variant, rank, figure): the first variant's value, this one's, the
    relative difference, the tolerance and whether it holds."""
    ok = {v: e for v, e in manifest["variants"].items() if e.get("status") == "ok"}
    rows = []
    if ok:
        base_name, base = next(iter(ok.items()))
        base_by_rank = {r["rank"]: r["first_step"] for r in base["ranks"]}
        for variant, entry in ok.items():
            for r in entry["ranks"]:
                for figure, tolerance in PARITY.items():
                    want, got = base_by_rank[r["rank"]][figure], r["first_step"][figure]
                    rel = abs(got - want) / max(abs(want), 1e-12)
                    rows.append({"variant": variant, "rank": r["rank"], "figure": figure, "base": base_name,
                                 "base_value": want, "value": got, "rel_diff": rel, "tolerance": tolerance,
                                 "match": rel <= tolerance})
    return pl.DataFrame(rows, schema={"variant": pl.String, "rank": pl.Int64, "figure": pl.String, "base": pl.String,
                                      "base_value": pl.Float64, "value": pl.Float64, "rel_diff": pl.Float64,
                                      "tolerance": pl.Float64, "match": pl.Boolean})


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
