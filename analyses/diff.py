"""`tracekit diff A B`: the step-time difference attributed to kernels, collectives and idle
causes, exactly.

Each step's GPU span is partitioned (`breakdown.py`) and every activity gets its share of
the segments its category wins; idle parts are items of their own. The shares of a step sum
exactly to its span, so grouping both sides' items by identity — (kind, name, op, phase) —
and subtracting gives deltas whose sum is exactly B's span − A's span (integer ns).

- kind: compute | comm | memcpy (memcpy and memset) | idle.
- name: the kernel identity (`names.kernel_identity`), `<collective kind> <dtype>` for
  collectives, the cause for idle parts.
- op: the CPU op that launched it; phase: forward / backward / optimizer (`phases.py`), so
  that the same kernel pairs across FSDP1 and FSDP2.
- The FSDP-aware view (`by="fsdp"`) groups the same items by (kind, phase, FSDP label): FSDP1
  `FullyShardedDataParallel._pre_forward`, FSDP2 `FSDP::pre_forward`, `fsdp::all_gather_copy_in`…
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.breakdown import step_partition
from tracekit.analyses.comms import collective_kernels
from tracekit.analyses.phases import launch_context
from tracekit.analyses.syncs import host_syncs
from tracekit.errors import TraceError
from tracekit.model import Trace
from tracekit.names import kernel_identity

VIEWS = {"kernel": ["kind", "name", "op", "phase"], "fsdp": ["kind", "phase", "fsdp"]}


# An item in one side only was added (B only) or removed (A only).
CHANGE = (pl.when(pl.col("a_count") == 0).then(pl.lit("added"))
          .when(pl.col("b_count") == 0).then(pl.lit("removed")).otherwise(pl.lit("")))


def step_items(trace: Trace, step: int) -> pl.DataFrame:
    """The step's items with their identity: kind, name, op, phase, fsdp, unit, ns, and `row`
    (the index into trace.gpu; null for idle items)."""
    _, items = step_partition(trace, step)
    gpu = trace.gpu.with_row_index("row").select("row", "dtype", identity=kernel_identity(pl.col("name")))
    joined = items.join(gpu, on="row", how="left").join(launch_context(trace), on="row", how="left")
    columns = [
        pl.col("category").replace({"memset": "memcpy"}).alias("kind"),
        pl.when(pl.col("category") == "idle").then(pl.col("cause").str.replace(r" \(.*\)$", ""))
        .when(pl.col("category") == "comm").then(pl.concat_str(pl.col("cause").fill_null("comm"), pl.lit(" "),
                                                               pl.col("dtype").fill_null("?")))
        .otherwise(pl.col("identity")).alias("name"),
        "op", "phase", "fsdp", "unit", pl.col("share_ns").alias("ns"), "row",
    ]
    return joined.select(columns)


def diff_items(a: pl.DataFrame, b: pl.DataFrame, by: str = "kernel") -> pl.DataFrame:
    """Per identity (the columns of VIEWS[by]): a_ns, b_ns, delta_ns, a_count, b_count, largest
    |delta| first."""
    key = VIEWS[by]

    def grouped(items, side):
        return items.group_by(key).agg(pl.col("ns").sum().alias(f"{side}_ns"), pl.len().cast(pl.Int64).alias(f"{side}_count"))

    both = grouped(a, "a").join(grouped(b, "b"), on=key, how="full", coalesce=True, nulls_equal=True)
    return _by_delta(both.with_columns(pl.col("a_ns", "b_ns", "a_count", "b_count").fill_null(0))
                     .with_columns(delta_ns=pl.col("b_ns") - pl.col("a_ns")), key)


def _by_delta(items: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Items with `change`, largest |delta| first (then by key), in the documented column order."""
    return (items.with_columns(change=CHANGE)
            .sort(pl.col("delta_ns").abs(), *key, descending=[True] + [False] * len(key), nulls_last=True)
            .select(*key, "change", "a_ns", "b_ns", "delta_ns", "a_count", "b_count"))


def top_with_other(items: pl.DataFrame, top: int) -> pl.DataFrame:
    """The `top` items by |delta| and one `other` row holding the rest (sums unchanged)."""
    if items.height <= top:
        return items
    rest = items.slice(top)
    labels = {"kind": pl.lit("other"), "name": pl.lit(f"{rest.height} more items"), "change": pl.lit("")}
    other = rest.select(*[labels.get(c, pl.lit(None, pl.String)).alias(c) for c in items.columns[:-5]],
                        *[pl.col(c).sum() for c in ("a_ns", "b_ns", "delta_ns", "a_count", "b_count")])
    return pl.concat([items.head(top), other], how="vertical_relaxed")


def sync_diff(a: Trace, a_step: int, b: Trace, b_step: int) -> pl.DataFrame:
    def side(t, step, name):
        return host_syncs(t).filter(pl.col("step") == step).group_by("api").agg(
            pl.len().cast(pl.Int64).alias(f"{name}_count"), pl.col("blocked_ns").sum().alias(f"{name}_blocked_ns"))

    return (side(a, a_step, "a").join(side(b, b_step, "b"), on="api", how="full", coalesce=True)
            .with_columns(pl.exclude("api").fill_null(0)).sort("api"))


def collective_diff(a_items: pl.DataFrame, a: Trace, a_step: int, b_items: pl.DataFrame, b: Trace, b_step: int):
    """Per collective kind: count, bytes and exposed time (its comm parts) on each side."""
    def side(items, t, step, name):
        k = collective_kernels(t).filter(pl.col("step") == step).group_by(pl.col("coll_kind").alias("kind")).agg(
            pl.len().cast(pl.Int64).alias(f"{name}_count"), pl.col("bytes").sum().alias(f"{name}_bytes"))
        exposed = items.filter(pl.col("kind") == "comm").group_by(
            kind=pl.col("name").str.extract(r"^(\S+)", 1)).agg(pl.col("ns").sum().alias(f"{name}_exposed_ns"))
        return k.join(exposed, on="kind", how="left")
    return (side(a_items, a, a_step, "a").join(side(b_items, b, b_step, "b"), on="kind", how="full", coalesce=True)
            .with_columns(pl.exclude("kind").fill_null(0)).sort("kind"))


def diff_traces(a: Trace, b: Trace, a_step: int, b_step: int, top: int = 20, by: str = "kernel") -> dict:
    """The diff of one rank's step in A against B (the documented JSON object)."""
    a_items, b_items = step_items(a, a_step), step_items(b, b_step)
    a_ns, b_ns = int(a_items["ns"].sum()), int(b_items["ns"].sum())
    items = diff_items(a_items, b_items, by)
    return {
        "rank": a.rank, "a_step": a_step, "b_step": b_step, "a_step_ns": a_ns, "b_step_ns": b_ns,
        "step_delta_ns": b_ns - a_ns, "items": top_with_other(items, top),
        "all_items": items, "a_items": a_items, "b_items": b_items,
        "syncs": sync_diff(a, a_step, b, b_step),
        "collectives": collective_diff(a_items, a, a_step, b_items, b, b_step),
    }


def common_step(a: Trace, b: Trace, step: int | None) -> tuple[int, int, str | None]:
    """(a_step, b_step, warning): `step`, else the last step both have, else each one's last."""
    def gpu_steps(t):
        return set(t.gpu.filter(pl.col("step").is_not_null())["step"].unique().to_list())
    sa, sb = gpu_steps(a), gpu_steps(b)
    if step is not None:
        if step not in sa or step not in sb:
            raise TraceError(f"{a.path} / {b.path}",
                             f"step {step} has no GPU work in both traces (A: {sorted(sa)}, B: {sorted(sb)})")
        return step, step, None
    if not sa or not sb:
        raise TraceError(a.path if not sa else b.path, "no GPU work to compare")
    shared = sa & sb
    if shared:
        return max(shared), max(shared), None
    return max(sa), max(sb), f"no common step: comparing A step {max(sa)} with B step {max(sb)}"


def diff_runs(a_traces: list[Trace], b_traces: list[Trace], step: int | None, top: int, by: str):
    """(per-rank diffs, aggregate over ranks, warnings) for the ranks both sides have."""
    warnings = []
    a_ranks, b_ranks = {t.rank: t for t in a_traces}, {t.rank: t for t in b_traces}
    if len(a_ranks) != len(b_ranks) or {t.world_size for t in a_traces} != {t.world_size for t in b_traces}:
        warnings.append(f"A has {len(a_ranks)} rank(s) (world size {a_traces[0].world_size}), B has "
                        f"{len(b_ranks)} (world size {b_traces[0].world_size}): comparing the ranks both have")
    common = sorted(set(a_ranks) & set(b_ranks))
    if not common:
        raise TraceError(f"{a_traces[0].path} / {b_traces[0].path}",
                         f"no rank in common (A: {sorted(a_ranks)}, B: {sorted(b_ranks)})")
    diffs = []
    for rank in common:
        a_step, b_step, note = common_step(a_ranks[rank], b_ranks[rank], step)
        if note:
            warnings.append(f"rank {rank}: {note}")
        diffs.append(diff_traces(a_ranks[rank], b_ranks[rank], a_step, b_step, top, by))
    return diffs, aggregate(diffs, top), warnings


def aggregate(diffs: list[dict], top: int) -> dict:
    """All ranks together: step times and item times summed over ranks."""
    items = pl.concat([d["all_items"] for d in diffs])
    key = [c for c in items.columns if c not in ("change", "a_ns", "b_ns", "delta_ns", "a_count", "b_count")]
    summed = _by_delta(items.group_by(key).agg(pl.col("a_ns", "b_ns", "delta_ns", "a_count", "b_count").sum()), key)
    a_ns, b_ns = sum(d["a_step_ns"] for d in diffs), sum(d["b_step_ns"] for d in diffs)
    return {"rank": None, "a_step": diffs[0]["a_step"], "b_step": diffs[0]["b_step"], "a_step_ns": a_ns,
            "b_step_ns": b_ns, "step_delta_ns": b_ns - a_ns, "items": top_with_other(summed, top), "all_items": summed,
            "syncs": _summed([d["syncs"] for d in diffs], "api"),
            "collectives": _summed([d["collectives"] for d in diffs], "kind")}


def _summed(frames: list[pl.DataFrame], key: str) -> pl.DataFrame:
    return pl.concat(frames, how="diagonal_relaxed").group_by(key).agg(pl.all().sum()).sort(key)
