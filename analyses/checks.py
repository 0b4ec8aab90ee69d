"""Checking a profile output's traces and variants against the runtime (docs/profile.md).

- `count_check`: each recorded step's trace-derived counts against the runtime's own counts of
  that step, for each recording (the attributed one, and the `full` step naming a `lean`
  one). Compared: `Event.synchronize` ↔ host `cudaEventSynchronize` (GPU traces that hold
  host calls: not a `cupti` recording, whose `full` naming step is compared instead), and
  each collective kind ↔ the Python collective calls of that kind, for all_gather and
  reduce_scatter always and for other kinds when the runtime saw any. Kinds issued from C++
  (DDP's reducer all-reduces) are invisible to the runtime counters: a kind the trace has that
  the runtime did not count is listed with runtime and match null, "not recorded" — as is
  every count of a step whose runtime record is empty (the runtime saw no call at all: it
  recorded nothing to compare, not zeros). Collectives of a one-rank GPU run are not compared:
  NCCL runs a one-rank collective as a device copy, with no collective kernel to count (FSDP1
  at world size 1 still calls `all_reduce`).
- `parity_check`: each variant's first-step loss and grad norm against the first variant's
  (the same weights and data: they must agree within `PARITY`), and the parameter checksums
  after the timed steps (`param_parity_rows`).
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.summary import summary
from tracekit.core.model import Run


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


BF16_ELEMENT_TOLERANCE = 1e-2  # one AdamW step (lr 1e-4) taken in one variant only, over rms θ ~ 0.02: 5e-3


def step_rows(run: Run) -> dict[int, list[dict]]:
    """rank → the summary rows of its profiled steps (device rows summed), in step order."""
    out = {}
    for t in run.traces:
        table = summary(t).filter(pl.col("step").is_not_null()).sort("step")
        out[t.rank] = table.to_dicts()
    return out


def count_check(manifest: dict, runs: dict[str, Run], names: dict[str, Run] | None = None) -> pl.DataFrame:
    """One row per (variant, recording, rank, recorded step, counted thing): runtime, trace,
    match (runtime and match null where the runtime recorded no count of it: "not recorded"). `runs` are the attributed recordings, `names` the `full` steps that name `lean`
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
                if recording["mode"] in ("cupti", "device", "lean") and not gpu:
                    continue
                per_step = recording["runtime_counts_per_step"]
                for step, counted in zip(traced[r["rank"]][-len(per_step):], per_step):
                    runtime: dict[str, int] = {}
                    for key, n in counted.items():
                        if key in RUNTIME_KEYS:
                            col = ".".join(RUNTIME_KEYS[key])
                            runtime[col] = runtime.get(col, 0) + n
                    recorded = set(runtime) | (set(ALWAYS_COMPARED) if counted else set())
                    listed = recorded | set(ALWAYS_COMPARED) | {c for c, n in step.items()
                                                                 if c.startswith("collectives.") and n}
                    if not gpu or recording["mode"] == "cupti":  # a cupti recording holds no host calls
                        listed.discard("syncs.cudaEventSynchronize")
                    if one_rank_gpu:
                        listed = {c for c in listed if not c.startswith("collectives.")}
                    for col in sorted(listed):
                        trace_n, runtime_n = step.get(col) or 0, runtime.get(col, 0) if col in recorded else None
                        rows.append({"variant": variant, "recording": recording["mode"], "rank": r["rank"],
                                     "step": step["step"], "count": col, "runtime": runtime_n, "trace": trace_n,
                                     "match": trace_n == runtime_n if runtime_n is not None else None})
    return pl.DataFrame(rows, schema={"variant": pl.String, "recording": pl.String, "rank": pl.Int64,
                                      "step": pl.Int64, "count": pl.String, "runtime": pl.Int64, "trace": pl.Int64,
                                      "match": pl.Boolean})


def parity_check(manifest: dict) -> pl.DataFrame:
    """One row per (variant, rank, figure) of every variant after the first (the base, not
    compared with itself): the base's value, this one's, the
    relative difference, the tolerance and whether it holds. Figures: the first step's `loss`
    and `grad_norm` (tolerance `PARITY`), and where the manifest has them the parameter
    checksums after the timed steps (`param_parity_rows`)."""
    ok = {v: e for v, e in manifest["variants"].items() if e.get("status") == "ok"}
    rows = []
    if ok:
        base_name, base = next(iter(ok.items()))
        base_by_rank = {r["rank"]: r for r in base["ranks"]}
        for variant, entry in list(ok.items())[1:]:
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
