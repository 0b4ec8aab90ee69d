"""`tracekit diff A B`: the step-time difference attributed to kernels, collectives and idle
causes, exactly.

A step's time is its span (summed over the devices of the process). The timeline gives every
activity its share of the segments its category wins, and the idle segments their causes;
the shares and idle parts of a step sum exactly to its time, so grouping both sides' items by
identity — (kind, name, op, phase) — and subtracting gives deltas whose sum is exactly B's
time − A's (integer ns).

- kind: compute | comm | memcpy (memcpy and memset) | idle.
- name: the kernel identity (`item_identity`), `<collective kind> <dtype>` for
  collectives, the cause for idle parts.
- op: the CPU op that launched it; phase: forward / backward / optimizer (`phases.py`), so
  that the same kernel pairs across FSDP1 and FSDP2; an idle part takes the phase of the
  device's next activity (`idle_items`).
- The FSDP-aware view (`by="fsdp"`) groups the same items by (kind, phase, FSDP phase): the
  FSDP label mapped onto one vocabulary for FSDP1 and FSDP2 (`phases.fsdp_phase`), so that
  their rows pair.
- A trace without device activity (CPU-only, gloo): a step's time is its CPU window, split
  among the outermost CPU ops of the step's thread (kind `cpu`), the rest `host: other`.
- critical: whether the item's device work lies on the critical path of A's step, B's, both
  (`critical_path.py`; per rank, collective arrivals left out); for items whose FLOPs both sides
  know (`flops.py`), the Δ of their device time split into more FLOPs and lower efficiency
  (`work_or_efficiency`).
- Steps: one (`step`), or — `steps="all"` — every step both sides have, paired by number and
  grouped into rounds (`per_round` steps a round: an interleaved recording's, else 1): each
  item's figures are its mean over those steps (ns apportioned to whole ns, `apportioned`, so
  that they still sum exactly to the mean step), and its Δ per round gives a 95 % interval
  (`item_intervals`, `noise.rounds_delta_ci`); items whose interval holds 0 are `within_noise`
  and ranked after the others. The median step of each side (by time; the lower median for an
  even count) stays the one whose activities are listed (export) and whose syncs, collectives
  and launches are shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analyses.aggregate import is_count
from tracekit.analyses.align import named_gaps
from tracekit.analyses.comms import collective_kernels
from tracekit.analyses.critical_path import on_path
from tracekit.analyses.flops import kernel_work
from tracekit.analyses.launches import launch_rows
from tracekit.analyses.noise import rounds_delta_ci
from tracekit.analyses.phases import (DATA_LOADING, DATA_PHASE, FSDP_LABEL, MODULE_FORWARD, RUNNER_PHASE, fsdp_phase,
                                      launch_context)
from tracekit.analyses.syncs import host_syncs
from tracekit.analyses.timeline import kept, outermost_ops, timeline, unshared
from tracekit.core.errors import TraceError
from tracekit.core.files import name
from tracekit.core.model import ENGINE, Trace
from tracekit.core.names import kernel_identity

VIEWS = {"kernel": ["kind", "name", "op", "phase"], "fsdp": ["kind", "phase", "fsdp"]}
SUMS = ("a_ns", "b_ns", "delta_ns", "a_count", "b_count")
PER_SIDE = ("a_cp_ns", "b_cp_ns", "a_flops", "b_flops", "a_busy_ns", "b_busy_ns")  # summed over ranks too
PATH_COLUMNS = ("critical", "why", *PER_SIDE, "d_flops_ns", "d_efficiency_ns")

# CUTLASS and CK launchers: the kernel they run is their first template argument.
LAUNCHED = (r"^(?:void )?(?:cutlass\w*::Kernel\d*|cutlass::device_kernel|ck_tile::kentry)"
            r"<\s*(?:\d+\s*,\s*)*([A-Za-z_][A-Za-z0-9_:]*)")


def item_identity(name: pl.Expr) -> pl.Expr:
    """`names.kernel_identity`, where a generic CUTLASS or CK launcher keeps the head of its
    first template argument (`cutlass::Kernel2<cutlass_80_wmma_tensorop_…_align8>`), so that
    two kernels it launches stay two items."""
    identity = kernel_identity(name)
    return pl.when(name.str.contains(LAUNCHED)).then(
        pl.format("{}<{}>", identity, name.str.extract(LAUNCHED, 1))).otherwise(identity)


# An item in one side only was added (B only) or removed (A only).
CHANGE = (pl.when(pl.col("a_count") == 0).then(pl.lit("added"))
          .when(pl.col("b_count") == 0).then(pl.lit("removed")).otherwise(pl.lit("")))


@dataclass
class Diff:
    """One rank's diff (rank None: all ranks summed). `items`: the top items and one `other`
    row; `all_items`: every item; `a_items`/`b_items`: each side's per-activity items (with
    `row` into trace.gpu; per rank only)."""

    rank: int | None
    a_step: int | None  # None: the ranks of a sum or mean used different steps
    b_step: int | None
    a_step_ns: int | float
    b_step_ns: int | float
    items: pl.DataFrame
    all_items: pl.DataFrame
    syncs: pl.DataFrame
    collectives: pl.DataFrame
    launches: pl.DataFrame  # per launching API: a_/b_ count and call_ns (`launches.py`)
    a_items: pl.DataFrame | None = None
    b_items: pl.DataFrame | None = None
    steps: int = 1  # paired steps the items' figures are the mean of
    rounds: int | None = None  # rounds the intervals are over (None: one step, no interval)
    step_delta_ci_ns: list[int] | None = None  # the step's Δ interval over those rounds

    @property
    def step_delta_ns(self) -> int:
        return self.b_step_ns - self.a_step_ns


@dataclass
class RunDiff:
    """Per-rank diffs, their sum over ranks, and what the reader should be warned about."""

    per_rank: list[Diff]
    together: Diff
    warnings: list[str]
    real: dict | None = None  # `fidelity.real_delta`, when both sides come with a profile manifest
    reconciled: pl.DataFrame | None = None  # `fidelity.reconciliation` of `real` with `phase_attribution`
    from_runner: bool = False  # a side's traces carry the marks of tracekit's runner (`tracekit#<phase>`)
    same: str | None = None  # what makes A and B the same traces (`same_traces`), None where they are not
    pairing: str = "steps"  # what the per-step items pair as: `rounds` of one interleaved launch, or `steps` by number

    def shown(self, ranks: str = "sum") -> Diff:
        """What a one-object report shows: the rank's diff, or over ranks their sum (`ranks`
        "sum") or mean ("mean", "each": a picture of one rank's scale)."""
        if len(self.per_rank) == 1:
            return self.per_rank[0]
        return self.together if ranks == "sum" else rank_mean(self.together, len(self.per_rank))

    def steps_used(self, side: str) -> dict[int, int]:
        """rank → the step of `side` ("a" or "b") that was attributed."""
        return {d.rank: d.a_step if side == "a" else d.b_step for d in self.per_rank}


def step_items(trace: Trace, step: int) -> pl.DataFrame:
    """The step's items with their identity: kind, name, op, phase, fsdp, unit, ns, and `row`
    (the index into trace.gpu; null for idle items)."""
    return all_items(trace).filter(pl.col("step") == step).drop("step")


def all_items(trace: Trace) -> pl.DataFrame:
    """Every step's items (`step_items`, with their step), made once and kept on the trace."""
    if "diff-items" not in trace.derived and not trace.has_gpu:
        trace.derived["diff-items"] = host_items(trace)
    if "diff-items" not in trace.derived:
        line, context = timeline(trace), launch_context(trace)
        items = pl.concat([line.shares.select("step", "row", "category", "cause", "share_ns"), idle_items(trace)],
                          how="diagonal_relaxed")
        # lazy: the identity's expression repeats its parts, which a query works out once (2x faster)
        names = trace.gpu.select("name").unique().lazy().with_columns(identity=item_identity(pl.col("name"))).collect(engine=ENGINE)
        dtypes = collective_kernels(trace).select("row", "dtype")  # a collective's, where its annotation says it
        gpu = (trace.gpu.with_row_index("row").select("row", "name").join(names, on="name", how="left")
               .join(dtypes, on="row", how="left"))
        joined = (items.join(gpu, on="row", how="left").join(context, on="row", how="left")
                  .with_columns(phase=pl.coalesce("phase", "idle_phase"), op=pl.coalesce("op", "idle_op"),
                                unit=pl.coalesce("unit", "idle_unit"), fsdp=pl.coalesce("fsdp", "idle_fsdp")))
        trace.derived["diff-items"] = joined.select(
            "step", pl.col("category").replace({"memset": "memcpy"}).alias("kind"),
            pl.when(pl.col("row").is_null()).then(pl.col("cause").str.replace(r" \(.*\)$", ""))
            .when(pl.col("category") == "comm").then(pl.concat_str(pl.col("cause").fill_null("other"), pl.lit(" "),
                                                                   pl.col("dtype").fill_null("?")))
            .otherwise(pl.col("identity")).alias("name"),
            "op", "phase", "fsdp", "unit", pl.col("share_ns").alias("ns"), "row")
    return trace.derived["diff-items"]


def idle_items(trace: Trace) -> pl.DataFrame:
    """The step's time no activity of it has a share of (`timeline.unshared`: idle, and comm
    hidden by another step's compute) per (category, cause, phase): a segment belongs to the
    phase of the device's next activity — the work the device was waiting for (`idle_phase`;
    null when nothing follows on the device) —, but time the host spends loading data (a cause
    naming a DataLoader) is of the phase `data loading`, whatever runs next. In a recording
    named from its full step (`cupti`), an idle segment's cause is the host work that separated
    the launches around it there, split among its names (`align.named_gaps`: `idle_op`,
    `idle_unit`, and `idle_fsdp`: its annotation where that is an FSDP label); a segment that
    cannot be named keeps its cause."""
    segments = unshared(timeline(trace).segments).select(
        "step", "device", "start", "end", "category", "cause").with_row_index("gap")
    named = named_gaps(trace, segments.filter(pl.col("category") == "idle").select("gap", "step", "device", "start", "end"))
    following = trace.gpu.with_row_index("next_row").select("next_row", "device", next_start="start").sort("next_start")
    phases = launch_context(trace).select(next_row="row", idle_phase="phase")
    return (segments.sort("end").join_asof(following, left_on="end", right_on="next_start", by="device",
                                           strategy="forward", check_sortedness=False)
            .join(phases, on="next_row", how="left")
            .join(named.rename({"cause": "named_cause"}), on="gap", how="left")
            .with_columns(cause=pl.coalesce("named_cause", "cause"), ns=pl.coalesce("ns", pl.col("end") - pl.col("start")))
            .with_columns(idle_phase=pl.when(pl.col("cause").str.contains(DATA_LOADING)).then(pl.lit(DATA_PHASE))
                          .otherwise("idle_phase"))
            .with_columns(idle_fsdp=pl.when(pl.col("label").str.contains(FSDP_LABEL)
                                            & (pl.col("label") != MODULE_FORWARD)).then("label"))
            .group_by("step", "category", "cause", "idle_phase", "idle_fsdp", idle_op="op", idle_unit="unit")
            .agg(share_ns=pl.col("ns").sum()))


def host_items(trace: Trace) -> pl.DataFrame:
    """A trace without device activity (CPU-only, gloo): each step's CPU window split among the
    outermost CPU ops of the step's thread (kind `cpu`, name the op; the runner's
    `tracekit#<phase>` annotations give their phase), the rest `host: other`."""
    steps = trace.ops.filter(pl.col("name").str.starts_with("ProfilerStep#")).select(
        "tid", pl.col("name").str.extract(r"#(\d+)", 1).cast(pl.Int64).alias("step"), "start", "end")
    if steps.height == 0:  # one whole-trace step 0
        steps = trace.steps.select(pl.lit(None, pl.Int64).alias("tid"), "step", start="cpu_start", end="cpu_end")
    ops = outermost_ops(trace)
    inside = steps.join(ops, on="tid", how="left" if steps["tid"].null_count() else "inner", suffix="_op").filter(
        (pl.col("start_op") >= pl.col("start")) & (pl.col("end_op") <= pl.col("end")))
    busy = inside.select("step", "name", ns=pl.col("end_op") - pl.col("start_op"))
    rest = steps.join(busy.group_by("step").agg(pl.col("ns").sum().alias("busy")), on="step", how="left").select(
        "step", name=pl.lit("host: other"), ns=pl.col("end") - pl.col("start") - pl.col("busy").fill_null(0))
    return pl.concat([busy, rest], how="vertical_relaxed").select(
        "step", kind=pl.lit("cpu"), name="name", op=pl.lit(None, pl.String),
        phase=pl.col("name").str.extract(RUNNER_PHASE, 1),
        fsdp=pl.lit(None, pl.String), unit=pl.lit(None, pl.String), ns="ns", row=pl.lit(None, pl.UInt32))


def by_delta(items: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Items with `change`, those not within noise first, each part by largest |delta| (then by
    key), in the documented column order."""
    path = [c for c in PATH_COLUMNS if c in items.columns]
    extra = [c for c in items.columns if c not in (*key, *SUMS, "change", *path)]
    noise = [pl.col("within_noise").fill_null(False)] if "within_noise" in items.columns else []
    return (items.with_columns(change=CHANGE)
            .sort(*noise, pl.col("delta_ns").abs(), *key, descending=[False] * len(noise) + [True] + [False] * len(key),
                  nulls_last=True)
            .select(*key, "change", *SUMS, *path, *extra))


def top_with_other(items: pl.DataFrame, top: int, key: list[str]) -> pl.DataFrame:
    """The `top` items by |delta| and one `other` row holding the rest (sums unchanged)."""
    if items.height <= top:
        return items
    rest = items.slice(top)
    labels = {"kind": pl.lit("other"), "name": pl.lit(f"{rest.height} more items"), "change": pl.lit("")}
    other = rest.select(*[labels.get(c, pl.lit(None, pl.String)).alias(c) for c in [*key, "change"]],
                        *[pl.col(c).sum() for c in SUMS])
    return pl.concat([items.head(top), other], how="diagonal_relaxed")


@dataclass
class Material:
    """What the diff needs of one trace, small enough to travel from a worker: per step, its
    time, items grouped by the view's key (ns, count), host syncs per API (count, blocked_ns),
    collectives per kind (count, bytes, exposed_ns) and launches per API (count, call_ns)."""

    path: str
    rank: int
    world_size: int | None
    times: dict[int, int]
    items: pl.DataFrame
    syncs: pl.DataFrame
    collectives: pl.DataFrame
    launches: pl.DataFrame  # per step and launching API: count, call_ns (`launches.launch_rows`)
    named: tuple[int, int] | None = None  # a lean trace named from its full step: (matched, activities)
    device: str = ""  # what the trace ran on (`device_of`)
    from_runner: bool = False  # the trace carries the marks of tracekit's runner (`tracekit#<phase>`)
    events: int = 0  # a fingerprint of the trace's events (`events_fingerprint`): equal for identical events


def device_of(trace: Trace) -> str:
    """The trace's device, for the reader: its GPUs' names (deviceProperties), `a GPU` when it
    has device activity but names none, else `the CPU only`."""
    names = sorted({str(d.get("name")) for d in trace.meta.get("device_properties") or [] if d.get("name")})
    return " / ".join(names) if names and trace.has_gpu else "a GPU" if trace.has_gpu else "the CPU only"


def material(trace: Trace, by: str = "kernel") -> Material:
    """The trace's side of a diff in view `by`: its step times and its items, syncs and
    collectives per step. Made once per trace and view, its tables kept with the trace
    (`timeline.kept`: a later command reads them from the trace cache); a report diffs its
    base against every other variant."""
    return kept(trace, ("diff-material", by), lambda: made_material(trace, by))


def made_material(trace: Trace, by: str) -> Material:
    items = kept(trace, f"diff-material-{by}", lambda: grouped_items(trace, by))
    syncs = kept(trace, "diff-material-syncs", lambda: host_syncs(trace).group_by("step", "api").agg(
        count=pl.len().cast(pl.Int64), blocked_ns=pl.col("blocked_ns").sum()))
    colls = kept(trace, "diff-material-collectives", lambda: collective_kernels(trace).group_by(
        "step", pl.col("coll_kind").alias("kind")).agg(
        count=pl.len().cast(pl.Int64), bytes=sum_if_known("bytes"), exposed_ns=pl.col("exposed_ns").sum()))
    launches = kept(trace, "diff-material-launches", lambda: launch_rows(trace).filter(
        pl.col("step").is_not_null()).group_by("step", "api").agg(
        count=pl.len().cast(pl.Int64), call_ns=pl.col("call_ns").sum()))
    return Material(trace.path, trace.rank, trace.world_size, step_times(trace), items, syncs, colls, launches,
                    device=device_of(trace), from_runner=from_runner(trace), events=events_fingerprint(trace))


def grouped_items(trace: Trace, by: str) -> pl.DataFrame:
    """The trace's items (`all_items`) per step and key of view `by`: ns, count, cp_ns, flops
    (null where an item's FLOPs are unknown) and busy_ns, summed."""
    items = all_items(trace)
    if by == "fsdp":
        items = items.with_columns(fsdp=fsdp_phase(pl.col("phase"), pl.col("fsdp")))
    return items.join(path_and_work(trace), on="row", how="left").group_by("step", *VIEWS[by]).agg(
        ns=pl.col("ns").sum(), count=pl.len().cast(pl.Int64), cp_ns=pl.col("cp_ns").sum(),
        flops=pl.when(pl.col("flops").null_count() == 0).then(pl.col("flops").sum()),
        busy_ns=pl.col("busy_ns").sum())


def from_runner(trace: Trace) -> bool:
    """Whether the trace carries the marks of tracekit's runner (an op `tracekit#<phase>`);
    kept with the trace, so that a later command need not read its ops."""
    marks = kept(trace, "runner-marks", lambda: pl.DataFrame(
        {"from_runner": [bool(trace.ops["name"].str.contains(RUNNER_PHASE).any())]}))
    return bool(marks["from_runner"][0])


def events_fingerprint(trace: Trace) -> int:
    """One number for the trace's events as loaded (device activities, runtime calls, CPU ops,
    marks, steps and their origin): two traces with identical events — a file and its copy
    elsewhere — have the same one. Kept with the trace, so that a later command need not
    read its tables."""
    def made() -> pl.DataFrame:
        tables = (trace.gpu, trace.calls, trace.ops, trace.marks, trace.steps)
        parts = (trace.origin_us, *((t.height, int(t.hash_rows(seed=0).sum())) for t in tables))
        return pl.DataFrame({"events": [hash(parts) & (2**63 - 1)]})
    return int(kept(trace, "events-fingerprint", made)["events"][0])


def path_and_work(trace: Trace) -> pl.DataFrame:
    """row (into trace.gpu), cp_ns (its time on its step's critical path, `critical_path.py`),
    flops (`flops.py`; null: unknown or no formula) and busy_ns (its duration). Kept with the
    trace (`timeline.kept`)."""
    if not trace.has_gpu:
        return pl.DataFrame(schema={"row": pl.UInt32, "cp_ns": pl.Int64, "flops": pl.Float64, "busy_ns": pl.Int64})
    return kept(trace, "diff-path-work", lambda: made_path_and_work(trace))


def made_path_and_work(trace: Trace) -> pl.DataFrame:
    gpu = trace.gpu.with_row_index("row").select("row", busy_ns=pl.col("end") - pl.col("start"))
    return (gpu.join(on_path(trace).select(pl.col("row").cast(pl.UInt32), "cp_ns"), on="row", how="left")
            .join(kernel_work(trace).select("row", "flops"), on="row", how="left")
            .with_columns(pl.col("cp_ns").fill_null(0)))


def work_or_efficiency(items: pl.DataFrame) -> pl.DataFrame:
    """Items with `critical` (on the critical path of `A`, `B`, `both`, or empty) and, where
    both sides' FLOPs are known, the Δ of device time split in two that add up to it:
    d_flops_ns = (F_B − F_A) / rate_A (B's extra work at A's rate) and d_efficiency_ns =
    F_B / rate_B − F_B / rate_A (B's work at its own rate instead of A's), rate = FLOPs per
    busy ns; `why` names the larger (`FLOPs` | `efficiency`). FLOPs not known: null."""
    rate_a = pl.col("a_flops") / pl.col("a_busy_ns")
    known = (pl.col("a_flops") > 0) & (pl.col("b_flops") > 0) & (pl.col("a_busy_ns") > 0) & (pl.col("b_busy_ns") > 0)
    d_flops = pl.when(known).then((pl.col("b_flops") - pl.col("a_flops")) / rate_a)
    d_eff = pl.when(known).then(pl.col("b_busy_ns") - pl.col("b_flops") / rate_a)
    a_cp, b_cp = pl.col("a_cp_ns") > 0, pl.col("b_cp_ns") > 0
    items = items.with_columns(pl.when(pl.col(c) > 0).then(pl.col(c)).alias(c) for c in ("a_flops", "b_flops"))
    return items.with_columns(
        critical=pl.when(a_cp & b_cp).then(pl.lit("both")).when(a_cp).then(pl.lit("A")).when(b_cp).then(pl.lit("B"))
        .otherwise(pl.lit("")),
        d_flops_ns=d_flops.round().cast(pl.Int64), d_efficiency_ns=d_eff.round().cast(pl.Int64),
    ).with_columns(why=pl.when(pl.col("d_flops_ns").is_null()).then(pl.lit(None, pl.String))
                   .when(pl.col("d_flops_ns").abs() >= pl.col("d_efficiency_ns").abs()).then(pl.lit("FLOPs"))
                   .otherwise(pl.lit("efficiency")))


def side_by_side(a: pl.DataFrame, a_step: int, b: pl.DataFrame, b_step: int, key: list[str]) -> pl.DataFrame:
    """A's and B's per-step rows of one step each, their other columns prefixed a_/b_, joined
    on `key` (absent: 0)."""
    def side(frame, step, prefix):  # one lazy query for both: a report makes ~100 of them
        picked = frame.lazy().filter(pl.col("step") == step).drop("step")
        return picked.rename({c: f"{prefix}_{c}" for c in frame.columns if c not in (*key, "step")})
    both = side(a, a_step, "a").join(side(b, b_step, "b"), on=key, how="full", coalesce=True, nulls_equal=True)
    sizes = [c for c in both.collect_schema().names() if c in ("a_bytes", "b_bytes")]  # unknown stays null
    absent = [pl.when(pl.col(f"{c[0]}_count").is_null()).then(0).otherwise(pl.col(c)).alias(c) for c in sizes]
    return (both.with_columns(absent).with_columns(pl.exclude(*key, *sizes).fill_null(0))
            .sort(key, nulls_last=True).collect(engine=ENGINE))


def diff_pair(a: Material, b: Material, a_step: int, b_step: int, top: int, by: str,
              steps: list[int] | None = None, per_round: int = 1) -> Diff:
    """The diff of one rank's step in A against B — or, given `steps` (two or more both sides
    have), of each side's mean over them, each item with its interval over rounds of
    `per_round` steps (`item_intervals`). Syncs, collectives and launches: of `a_step` and
    `b_step`."""
    key = VIEWS[by]
    if steps:
        both = side_by_side(step_mean(a.items, steps, key), 0, step_mean(b.items, steps, key), 0, key)
    else:
        both = side_by_side(a.items, a_step, b.items, b_step, key)
    items = work_or_efficiency(both.with_columns(delta_ns=pl.col("b_ns") - pl.col("a_ns")))
    step_ci, rounds = None, None
    if steps:
        intervals, step_ci, rounds = item_intervals([(a, b)], steps, by, per_round)
        items = items.join(intervals, on=key, how="left", nulls_equal=True)
    items = by_delta(items, key)
    a_ns, b_ns = (int(both["a_ns"].sum()), int(both["b_ns"].sum())) if steps else (a.times[a_step], b.times[b_step])
    return Diff(a.rank, a_step, b_step, a_ns, b_ns, top_with_other(items, top, key), items,
                side_by_side(a.syncs, a_step, b.syncs, b_step, ["api"]),
                side_by_side(a.collectives, a_step, b.collectives, b_step, ["kind"]),
                side_by_side(a.launches, a_step, b.launches, b_step, ["api"]),
                steps=len(steps) if steps else 1, rounds=rounds, step_delta_ci_ns=step_ci)


def step_mean(items: pl.DataFrame, steps: list[int], key: list[str]) -> pl.DataFrame:
    """`items` (per step, `Material.items`) of `steps` as one step 0: each item's mean over
    them, a step without it counting 0 — `ns` apportioned to whole ns (`apportioned`: the items
    still sum exactly to the steps' mean time, rounded), counts as fractions, other times to
    the whole ns, FLOPs where every step that has the item knows them."""
    n = len(steps)
    picked = items.filter(pl.col("step").is_in(steps)).drop("step")
    means = [pl.when(pl.col(c).null_count() == 0).then(pl.col(c).sum() / n).alias(c) if t.is_float()
             else (pl.col(c).sum() / n).alias(c) if c.endswith("count")
             else (pl.col(c).sum() / n).round().cast(t).alias(c)
             for c, t in picked.schema.items() if c not in (*key, "ns") and t.is_numeric()]
    summed = picked.group_by(key).agg(pl.col("ns").sum(), *means).sort(key, nulls_last=True)
    return apportioned(summed, "ns", n).with_columns(step=pl.lit(0, pl.Int64))


def apportioned(frame: pl.DataFrame, column: str, n: int) -> pl.DataFrame:
    """`column` (whole ns summed over n steps) ÷ n in whole ns by largest remainder: each row's
    quotient rounded down, and one ns more to the rows with the largest remainders (first rows
    first on ties) until the column sums to its total ÷ n rounded half up."""
    total = int(frame[column].sum())
    missing = (2 * total + n) // (2 * n) - int((frame[column] // n).sum())
    order = (pl.col(column) % n).rank("ordinal", descending=True)
    return frame.with_columns(pl.when(order <= missing).then(pl.col(column) // n + 1)
                              .otherwise(pl.col(column) // n).alias(column))


def diff_traces(a: Trace, b: Trace, a_step: int, b_step: int, top: int = 20, by: str = "kernel") -> Diff:
    """One rank's step in A against B, with each side's per-activity items (`step_items`)."""
    d = diff_pair(material(a, by), material(b, by), a_step, b_step, top, by, None)
    d.a_items, d.b_items = step_items(a, a_step), step_items(b, b_step)
    return d


def step_times(trace: Trace) -> dict[int, int]:
    """Each step with device work → its time (ns): the span, summed over devices; without any
    device activity, each step's CPU window."""
    if not trace.has_gpu:
        return dict(trace.steps.select("step", pl.col("cpu_end") - pl.col("cpu_start")).iter_rows())
    return dict(kept(trace, "step-times", lambda: device_step_times(trace)).iter_rows())


def device_step_times(trace: Trace) -> pl.DataFrame:
    """step, ns: each step with device work and its span (ns, summed over devices), by step."""
    spans = dict(timeline(trace).coarse.group_by("step").agg((pl.col("end") - pl.col("start")).sum()).iter_rows())
    steps = sorted(trace.gpu["step"].drop_nulls().unique().to_list())
    return pl.DataFrame({"step": steps, "ns": [spans.get(s, 0) for s in steps]},
                        schema={"step": pl.Int64, "ns": pl.Int64})


def median_step(times: dict[int, int]) -> int:
    """The step of median time (the lower one of an even count; ties by step number)."""
    ordered = sorted(times, key=lambda s: (times[s], s))
    return ordered[(len(ordered) - 1) // 2]


def item_intervals(pairs: list[tuple[Material, Material]], steps: list[int], by: str,
                   per_round: int = 1) -> tuple[pl.DataFrame, list[int], int]:
    """(per item: its 95 % interval `delta_lo_ns`–`delta_hi_ns`, its half-width `delta_pm_ns`
    and `within_noise` (the interval holds 0); the step's Δ interval; the rounds) over `steps` (both sides' same-numbered steps; a step without the item counts 0),
    summed over the (A, B) pairs of ranks given. Step n belongs to round (n − 1) // per_round;
    a round's Δ is the mean over its steps of B − A, and the interval is over rounds
    (`noise.rounds_delta_ci`)."""
    key = VIEWS[by]

    def per_step(side, column):
        items = pl.concat([m.items.filter(pl.col("step").is_in(steps)) for m in side])
        return items.group_by("step", *key).agg(pl.col("ns").sum().alias(column))

    rounds = pl.DataFrame({"step": steps}, schema={"step": pl.Int64}).with_columns(
        round=(pl.col("step") - 1) // per_round)
    size = rounds.group_by("round").agg(n=pl.len())
    deltas = (per_step([a for a, _ in pairs], "a").join(per_step([b for _, b in pairs], "b"), on=["step", *key],
                                                          how="full", coalesce=True, nulls_equal=True)
              .select("step", *key, delta=pl.col("b").fill_null(0) - pl.col("a").fill_null(0))
              .join(rounds, on="step").group_by(*key, "round").agg(pl.col("delta").sum())
              .join(size, on="round").with_columns(delta=pl.col("delta") / pl.col("n")))
    numbers = sorted(size["round"].to_list())
    items = deltas.select(key).unique(maintain_order=True).with_row_index("item")
    matrix = np.zeros((items.height, len(numbers)))
    cells = deltas.join(items, on=key, nulls_equal=True).with_columns(
        column=pl.col("round").replace_strict({r: i for i, r in enumerate(numbers)}, return_dtype=pl.Int64))
    matrix[cells["item"].to_numpy(), cells["column"].to_numpy()] = cells["delta"].to_numpy()
    mean, lo, hi = rounds_delta_ci(np.vstack([matrix, matrix.sum(0, keepdims=True)]))
    found = items.drop("item").with_columns(
        delta_lo_ns=pl.Series(np.round(lo[:-1]).astype(np.int64)), delta_hi_ns=pl.Series(np.round(hi[:-1]).astype(np.int64)),
        delta_pm_ns=pl.Series(np.round(hi[:-1] - mean[:-1]).astype(np.int64)), within_noise=pl.Series((lo[:-1] <= 0) & (hi[:-1] >= 0)))
    lo, hi = np.round(lo).astype(np.int64), np.round(hi).astype(np.int64)
    return found, [int(lo[-1]), int(hi[-1])], len(numbers)


def chosen_steps(a: Material, b: Material, steps) -> tuple[int, int, list[int], str | None]:
    """(A's step, B's step, the steps both have, warning) for `steps`: a step number, or
    "all" (each side's median step)."""
    sa, sb = a.times, b.times
    if not sa or not sb:
        raise TraceError(a.path if not sa else b.path, "no GPU work to compare")
    shared = sorted(set(sa) & set(sb))
    if steps != "all":
        if steps not in sa or steps not in sb:
            side, have = (a.path, sa) if steps not in sa else (b.path, sb)
            nor = "; nor has B" if steps not in sa and steps not in sb else ""
            raise TraceError(side, f"no step {steps} with GPU work (its steps: {', '.join(map(str, sorted(have)))}){nor}")
        return steps, steps, shared, None
    a_step, b_step = median_step(sa), median_step(sb)
    note = None if shared else f"no common step: comparing A's median step {a_step} with B's {b_step}"
    return a_step, b_step, shared, note


def combine(a_side: list[Material], b_side: list[Material], steps="all", top: int = 20,
            by: str = "kernel", per_round: int | None = None) -> RunDiff:
    """Per-rank diffs, their sum, and warnings, for the ranks both sides have; with `steps`
    "all", over every step both have: in rounds of `per_round` steps where A and B are two
    variants of one interleaved launch (`timed.steps_per_round`), else each step a round of
    its own, paired by number (`diff_pair`)."""
    pairing, per_round = ("rounds", per_round) if per_round else ("steps", 1)
    warnings = []
    a_ranks, b_ranks = by_rank(a_side, b_side)
    if len(a_side) == len(b_side) == 1:
        warnings += one_with_one(a_side[0], b_side[0])
    elif len(a_ranks) != len(b_ranks) or {m.world_size for m in a_side} != {m.world_size for m in b_side}:
        warnings.append(f"A has {len(a_ranks)} rank(s) ({world_words(a_side)}), B has "
                        f"{len(b_ranks)} ({world_words(b_side)}): comparing the ranks both have")
    warnings += one_per_rank("A", a_side) + one_per_rank("B", b_side)
    for side, materials in (("A", a_side), ("B", b_side)):
        warnings += [f"{side} rank {m.rank}: {m.named[1] - m.named[0]} of {m.named[1]} lean GPU activities not named "
                     "from the full step (no kernel of that name at their place in it): their op and dtype are "
                     "unknown" for m in materials if m.named and m.named[0] < m.named[1]]
    common = sorted(set(a_ranks) & set(b_ranks))
    if not common:
        raise TraceError(f"{a_side[0].path} / {b_side[0].path}",
                         f"no rank in common (A: {sorted(a_ranks)}, B: {sorted(b_ranks)})")
    diffs, everywhere = [], None
    for rank in common:
        a, b = a_ranks[rank], b_ranks[rank]
        a_step, b_step, shared, note = chosen_steps(a, b, steps)
        if note:
            warnings.append(f"rank {rank}: {note}")
        everywhere = set(shared) if everywhere is None else everywhere & set(shared)
        averaged = shared if steps == "all" and len(shared) > 1 else None
        diffs.append(diff_pair(a, b, a_step, b_step, top, by, averaged, per_round))
    pairs = [(a_ranks[r], b_ranks[r]) for r in common]
    intervals = item_intervals(pairs, sorted(everywhere), by, per_round) \
        if steps == "all" and len(everywhere) > 1 and all(d.rounds for d in diffs) else None
    return RunDiff(diffs, aggregate(diffs, top, by, intervals), warnings + sameness(pairs, diffs),
                   from_runner=any(m.from_runner for m in [*a_side, *b_side]), same=same_traces(pairs),
                   pairing=pairing)


def same_traces(pairs: list[tuple[Material, Material]]) -> str | None:
    """What makes every compared pair of traces one trace — `the same file(s)`, or `identical
    events in both files (a copy)` —, or None where a pair differs."""
    if not pairs or not all(a.path == b.path or a.events == b.events for a, b in pairs):
        return None
    if all(a.path == b.path for a, b in pairs):
        return "the same file" + ("s" if len(pairs) > 1 else "")
    return "identical events in both files (a copy)"


def sameness(pairs: list[tuple[Material, Material]], diffs: list[Diff]) -> list[str]:
    """What makes the comparison say nothing or mislead: A and B the same trace (one file, or
    identical events: a copy), or steps whose every item is the same; sides that ran on
    different devices."""
    devices = {(a.device, b.device) for a, b in pairs if a.device and b.device and a.device != b.device}
    notes = [f"A ran on {a}, B on {b}: the Δ compares different machines, not one change" for a, b in sorted(devices)]
    if (what := same_traces(pairs)) is not None:
        notes.append(f"A and B are the same trace{'s' if len(pairs) > 1 else ''}: {what}; every Δ is 0")
    elif all(d.step_delta_ns == 0 and (d.all_items["delta_ns"] == 0).all() for d in diffs):
        notes.append("A's and B's compared steps are identical, item by item: every Δ is 0")
    return notes


def named_on_one_side(a_side: list[Material], b_side: list[Material]) -> str | None:
    """"A" or "B" where that side's traces of the ranks both have were named from a full step
    beside them (`names/`) and none of the other side's was: their items would differ by the
    names alone (a trace and its copy outside its folder), so the named side is to be compared
    without them; else None."""
    a_ranks, b_ranks = by_rank(a_side, b_side)
    common = set(a_ranks) & set(b_ranks)
    named = {side: any(ranks[r].named is not None for r in common) for side, ranks in (("A", a_ranks), ("B", b_ranks))}
    return next((side for side, other in (("A", "B"), ("B", "A")) if named[side] and not named[other]), None)


def diff_runs(a_traces: list[Trace], b_traces: list[Trace], steps="all", top: int = 20,
              by: str = "kernel") -> RunDiff:
    """`combine` of the traces' materials, each rank's diff with its per-activity items."""
    return with_activities(combine([material(t, by) for t in a_traces], [material(t, by) for t in b_traces], steps,
                                   top, by), a_traces, b_traces)


def with_activities(result: RunDiff, a_traces: list[Trace], b_traces: list[Trace]) -> RunDiff:
    """`result` (`combine` of the traces' materials) with each rank's per-activity items."""
    a_ranks, b_ranks = by_rank(a_traces, b_traces)
    for d in result.per_rank:
        d.a_items, d.b_items = step_items(a_ranks[d.rank], d.a_step), step_items(b_ranks[d.rank], d.b_step)
    return result


def one_with_one(a: Material, b: Material) -> list[str]:
    """The warning when a single trace is compared with a single trace of another rank or world."""
    if (a.rank, a.world_size) == (b.rank, b.world_size):
        return []
    return [f"A is {rank_words(a)}, B {rank_words(b)}: the one trace of each side is compared with the other, "
            f"as rank {a.rank}"]


def rank_words(m: Material) -> str:
    """`rank 0 of world size 2`, or `rank 0` where the trace gives no world size."""
    return f"rank {m.rank}" + (f" of world size {m.world_size}" if m.world_size is not None else "")


def world_words(side: list[Material]) -> str:
    """`world size 2`, or `world size not recorded` where the side's first trace gives none."""
    size = side[0].world_size
    return f"world size {size}" if size is not None else "world size not recorded"


def one_per_rank(side: str, materials: list[Material]) -> list[str]:
    """Where several traces of a side claim one rank: which one is compared (the first, as
    `by_rank` keeps), by its file's name."""
    claims: dict[int, list[str]] = {}
    for m in materials:
        claims.setdefault(m.rank, []).append(name(m.path))
    return [f"{side}: {len(files)} traces claim rank {rank} ({', '.join(files)}): rank {rank} is compared as "
            f"{files[0]}; give one file per side to choose another" for rank, files in claims.items() if len(files) > 1]


def by_rank(a_side: list, b_side: list) -> tuple[dict, dict]:
    """Each side's traces (or materials) by rank, the first of several that claim one rank
    (`one_per_rank` says so); one trace against one trace is a pair whatever ranks they claim
    (HTA's trace diff takes a rank per side), under A's rank."""
    a_ranks, b_ranks = ({x.rank: x for x in reversed(side)} for side in (a_side, b_side))
    if len(a_side) == len(b_side) == 1:
        b_ranks = {a_side[0].rank: b_side[0]}
    return a_ranks, b_ranks


def aggregate(diffs: list[Diff], top: int, by: str, intervals: tuple | None) -> Diff:
    """All ranks together: step times and item times summed over ranks; `intervals`
    (`item_intervals` over the steps every rank pair shares, of the summed deltas) joined."""
    key = VIEWS[by]
    items = pl.concat([d.all_items.select(*key, *SUMS, *PER_SIDE) for d in diffs])
    summed = items.group_by(key).agg(pl.col(*SUMS, "a_cp_ns", "b_cp_ns", "a_busy_ns", "b_busy_ns").sum(),
                                     *[pl.when(pl.col(c).null_count() == 0).then(pl.col(c).sum()).alias(c)
                                       for c in ("a_flops", "b_flops")])
    summed = work_or_efficiency(summed)
    if intervals is not None:
        summed = summed.join(intervals[0], on=key, how="left", nulls_equal=True)
    summed = by_delta(summed, key)
    a_steps, b_steps = {d.a_step for d in diffs}, {d.b_step for d in diffs}
    return Diff(None, a_steps.pop() if len(a_steps) == 1 else None, b_steps.pop() if len(b_steps) == 1 else None,
                sum(d.a_step_ns for d in diffs),
                sum(d.b_step_ns for d in diffs), top_with_other(summed, top, key), summed,
                summed_by([d.syncs for d in diffs], "api"), summed_by([d.collectives for d in diffs], "kind"),
                summed_by([d.launches for d in diffs], "api"), steps=min(d.steps for d in diffs),
                rounds=intervals[2] if intervals else None, step_delta_ci_ns=intervals[1] if intervals else None)


def rank_mean(diff: Diff, ranks: int) -> Diff:
    """A sum over `ranks` ranks as the mean rank: every figure ÷ `ranks`, a count to a tenth
    (4.5 calls per rank), a time or size to the whole ns or byte (the items still sum to the
    step's Δ, up to rounding)."""
    def per_rank(column: str, dtype) -> pl.Expr:
        value = pl.col(column) / ranks
        if is_count(column, dtype):
            return value.round(1)
        return value.round(0).cast(dtype) if dtype.is_integer() else value

    def mean(frame):
        return frame.with_columns(per_rank(c, t) for c, t in frame.schema.items() if t.is_numeric())

    ci = [round(x / ranks) for x in diff.step_delta_ci_ns] if diff.step_delta_ci_ns else None
    return Diff(None, diff.a_step, diff.b_step, diff.a_step_ns / ranks, diff.b_step_ns / ranks, mean(diff.items),
                mean(diff.all_items), mean(diff.syncs), mean(diff.collectives), mean(diff.launches),
                steps=diff.steps, rounds=diff.rounds, step_delta_ci_ns=ci)


def sign_disagreements(result: RunDiff, top: int = 5, by: str = "kernel") -> list[str]:
    """Where ranks move in opposite directions — the step, and each of the `top` items of the
    sum — with each rank's Δ: a sum or mean over ranks hides it."""
    if len(result.per_rank) < 2:
        return []
    out = []
    steps = {d.rank: d.step_delta_ns for d in result.per_rank}
    if max(steps.values()) > 0 > min(steps.values()):
        out.append("ranks disagree on the step's Δ: " + per_rank_text(steps))
    key = VIEWS[by]
    leading = result.together.all_items.head(top).select(key)
    per_rank = pl.concat([d.all_items.select(*key, "delta_ns").with_columns(rank=pl.lit(d.rank)) for d in result.per_rank])
    split = (leading.join(per_rank, on=key, how="left", nulls_equal=True, maintain_order="left")
             .group_by(key, maintain_order=True).agg("rank", "delta_ns")
             .filter((pl.col("delta_ns").list.max() > 0) & (pl.col("delta_ns").list.min() < 0)))
    for row in split.iter_rows(named=True):
        label = " ".join(dict.fromkeys(str(row[k]) for k in key if row[k] is not None))
        out.append(f"ranks disagree on {label}: {per_rank_text(dict(zip(row['rank'], row['delta_ns'])))}")
    return out


def per_rank_text(deltas: dict[int, int]) -> str:
    """`rank 0 −14.0 ms, rank 1 +6.3 ms`."""
    return ", ".join(f"rank {r} {d / 1e6:+.{1 if abs(d) >= 1e6 else 3}f} ms".replace("-", "−")
                     for r, d in sorted(deltas.items()))


def phase_attribution(diff: Diff, ranks: int = 1) -> pl.DataFrame:
    """Per phase, the diff's Δ split into device time (compute, comm, memcpy items) and idle
    (idle items, by the phase of the work they waited for), ns, divided by `ranks` (a sum
    over ranks → the mean rank). Items without a phase (`host: other`, host-only traces) form
    the row `other`: they are part of the step, in no phase."""
    return (diff.all_items.with_columns(pl.col("phase").fill_null("other"))
            .group_by("phase").agg(
                device_delta_ns=pl.col("delta_ns").filter(pl.col("kind") != "idle").sum() // ranks,
                idle_delta_ns=pl.col("delta_ns").filter(pl.col("kind") == "idle").sum() // ranks)
            .sort("phase"))


def summed_by(frames: list[pl.DataFrame], key: str) -> pl.DataFrame:
    """Per `key`, every column summed over the frames; a size (`*_bytes`) null where one is unknown."""
    both = pl.concat(frames, how="diagonal_relaxed")
    return both.group_by(key).agg(sum_if_known(c) if c.endswith("_bytes") else pl.col(c).sum()
                                  for c in both.columns if c != key).sort(key)


def sum_if_known(column: str) -> pl.Expr:
    """The sum, or null (unknown, never 0) where any value is unknown."""
    return pl.when(pl.col(column).null_count() == 0).then(pl.col(column).sum())
