"""Memory over the step: when the peak comes, what it is made of, and how two variants' peaks
differ (docs/metrics.md, "Memory over the step").

Pure functions of a `MemoryRecord` (`tracekit.core.memory_files`: one rank's allocations over
one step, each live from `alloc_ns` to `free_ns`). Allocated bytes at a time t are the bytes of
the allocations live at t (alloc ≤ t < free; one allocated before the record counts from its
start, one never freed to its end); the peak is their largest value over the step, at the
first event that reaches it. Every allocation gets one category (`categorized`, the rules in
order); allocator slack is reserved − allocated at the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.core.memory_files import BEFORE, MemoryRecord

# category → how people call it (the lead, the table's notes)
LABELS = {"params": "parameters", "params_unsharded": "unsharded parameters", "grads": "gradients",
          "optimizer": "optimizer state", "activations": "activations", "comm": "communication buffers",
          "temporary": "temporaries", "before": "other memory from before the step", "unattributed": "unattributed",
          "slack": "allocator slack"}
CATEGORIES = tuple(LABELS)
TAGS = {"param": "params", "grad": "grads", "optimizer": "optimizer"}
# FSDP's unsharded (all-gathered) parameters: FSDP2's all-gather outputs, FSDP1's padded unsharded flat parameter
UNSHARDED = r"_fsdp_param\.py\(\d+\): (alloc_storage|alloc_all_gather_outputs|init_all_gather_outputs)|" \
            r"_alloc_padded_unsharded_flat_param"
# collective buffers: FSDP2's copy-in/out and reduce-scatter buffers, FSDP1's low-precision shard and gradient
# reduction, c10d's own, and whatever is allocated under a c10d op or FSDP's collective annotations
COMM = r"_fsdp_collectives\.py\(|distributed_c10d\.py\(|c10d::|FSDP::(all_gather|post_backward_reduce)|" \
       r"_use_low_precision_shard|_runtime_utils\.py\(\d+\): _reduce_grad"
OPTIMIZER = r"torch/optim/"
PYTHON_FRAME = r"^[^<\s][^<]*\.py\(\d+\): "
EARLIEST = -(2 ** 62)  # the time of what was live before any event of a record
NO_FRAME = "(no Python frame: the autograd engine or a C++ path)"
OP = r"^(?:[a-z0-9_]+::[^<]* < )*([a-z0-9_]+::[^<]*?)(?: < |$)"  # the outermost op of the ops innermost in a stack


@dataclass
class MemoryAnswer:
    """One rank's memory over its step (`memory_answer`)."""

    variant: str | None
    rank: int | None
    source: str
    device: str | None
    peak: dict  # bytes, at_ms, phase, reserved_bytes, slack_bytes, allocator_peak_bytes
    phases: pl.DataFrame  # phase, start_ms, end_ms, start_bytes, peak_bytes, peak_at_ms, end_bytes
    categories: pl.DataFrame  # category, bytes, pct, count: live at the peak (slack: reserved − allocated)
    phase_categories: pl.DataFrame  # phase, category, bytes: live at each phase's own peak
    largest: pl.DataFrame  # origin, op, category, bytes, count: the live allocations at the peak by origin
    origins: pl.DataFrame  # origin, category, bytes: every origin of the bytes live at the peak
    notes: list[str] = field(default_factory=list)


def phase_of(time: pl.Expr, phases: pl.DataFrame) -> pl.Expr:
    """The phase whose [start, end) holds `time` (null where none does)."""
    out = pl.lit(None, dtype=pl.String)
    for phase, start, end in phases.iter_rows():
        out = pl.when((time >= start) & (time < end)).then(pl.lit(phase)).otherwise(out)
    return out


def origin(stack: pl.Expr) -> pl.Expr:
    """Where an allocation was made, as a person names it: the innermost Python frame outside
    torch (the model's or the training loop's line), else the innermost `nn.Module: …` around
    it, else its innermost frame or op; `NO_FRAME` for an empty stack."""
    frames = stack.str.split(" < ")
    ours = frames.list.eval(pl.element().filter(pl.element().str.contains(PYTHON_FRAME)
                                                & ~pl.element().str.starts_with("torch/"))).list.first()
    module = frames.list.eval(pl.element().filter(pl.element().str.starts_with("nn.Module: "))).list.first()
    return (pl.when(stack == "").then(pl.lit(NO_FRAME))
            .otherwise(pl.coalesce(ours, module, frames.list.first())))


def categorized(record: MemoryRecord) -> pl.DataFrame:
    """The record's allocations with `alloc_phase`, `category`, `origin` and `op` (the
    outermost of the ops innermost in its stack, `aten::linear` around `aten::addmm`: Kineto's
    records only). The rules, first
    that holds: tagged state (`param` → params, `grad` → grads, `optimizer`); made under FSDP's
    unshard (`UNSHARDED` in its stack) → params_unsharded; made under a collective (`COMM`) →
    comm; allocated before the record → before; then by lifetime, where the record has phases:
    made in forward and alive past its end → activations; in a record with no tags (a user's
    file), made under `torch/optim/` and never freed → optimizer, made in backward with no
    Python frame and alive past backward's end → grads; any other → temporary. Without a
    forward phase (no phases, or a trace's steps only) the lifetime rules cannot hold:
    unattributed."""
    phases, blocks = record.phases, record.blocks
    ends = dict(zip(phases["phase"].to_list(), phases["end_ns"].to_list()))
    untagged = blocks["tag"].null_count() == blocks.height
    alive_past = lambda phase: pl.col("free_ns").is_null() | (pl.col("free_ns") >= ends.get(phase, 0))  # noqa: E731
    rule = (pl.when(pl.col("tag").is_not_null()).then(pl.col("tag").replace_strict(TAGS, default="before"))
            .when(pl.col("stack").str.contains(UNSHARDED)).then(pl.lit("params_unsharded"))
            .when(pl.col("stack").str.contains(COMM)).then(pl.lit("comm"))
            .when(pl.col("alloc_ns").is_null()).then(pl.lit("before")))
    if "forward" not in ends:  # no phases, or steps only (a user's trace)
        rule = rule.otherwise(pl.lit("unattributed"))
    else:
        rule = rule.when((pl.col("alloc_phase") == "forward") & alive_past("forward")).then(pl.lit("activations"))
        if untagged:
            rule = (rule.when(pl.col("stack").str.contains(OPTIMIZER) & pl.col("free_ns").is_null())
                    .then(pl.lit("optimizer"))
                    .when((pl.col("alloc_phase") == "backward") & (pl.col("stack") == "") & alive_past("backward"))
                    .then(pl.lit("grads")))
        rule = rule.otherwise(pl.lit("temporary"))
    return (blocks.with_columns(alloc_phase=phase_of(pl.col("alloc_ns"), phases))
            .with_columns(category=rule, origin=pl.when(pl.col("stack") == BEFORE).then(pl.lit(BEFORE))
                          .otherwise(origin(pl.col("stack"))), op=pl.col("stack").str.extract(OP)))


def live_curve(blocks: pl.DataFrame) -> pl.DataFrame:
    """Allocated bytes after each alloc and free: `t_ns`, `allocated_bytes` (time order), with a
    first row at `EARLIEST` holding what was live before any event."""
    before = int(blocks.filter(pl.col("alloc_ns").is_null())["bytes"].sum())
    events = pl.concat([
        blocks.filter(pl.col("alloc_ns").is_not_null()).select(t_ns="alloc_ns", change="bytes"),
        blocks.filter(pl.col("free_ns").is_not_null()).select(t_ns="free_ns", change=-pl.col("bytes")),
    ]).sort("t_ns", maintain_order=True)
    return pl.concat([pl.DataFrame({"t_ns": [EARLIEST], "allocated_bytes": [before]}),
                      events.select("t_ns", allocated_bytes=before + pl.col("change").cum_sum())])


def live_at(blocks: pl.DataFrame, t: int) -> pl.DataFrame:
    """The allocations live at `t`."""
    return blocks.filter((pl.col("alloc_ns").is_null() | (pl.col("alloc_ns") <= t))
                         & (pl.col("free_ns").is_null() | (pl.col("free_ns") > t)))


def highest(curve: pl.DataFrame, start: int, end: int) -> tuple[int, int]:
    """(t, bytes) of the first highest point of `curve` in [start, end), the value at `start`
    (what was live when it began) included."""
    at_start = curve.filter(pl.col("t_ns") < start).tail(1).with_columns(t_ns=pl.lit(start, dtype=pl.Int64))
    inside = pl.concat([at_start, curve.filter((pl.col("t_ns") >= start) & (pl.col("t_ns") < end))])
    if inside.height == 0:
        return start, 0
    row = inside.row(int(inside["allocated_bytes"].arg_max()), named=True)
    return row["t_ns"], row["allocated_bytes"]


def value_at(curve: pl.DataFrame, t: int) -> int:
    rows = curve.filter(pl.col("t_ns") <= t)
    return int(rows["allocated_bytes"][-1]) if rows.height else 0


def reserved_at(record: MemoryRecord, t: int) -> int | None:
    rows = record.reserved.filter(pl.col("t_ns") <= t)
    return int(rows["reserved_bytes"][-1]) if rows.height else None


def by_category(live: pl.DataFrame, total: int) -> pl.DataFrame:
    """Bytes, share of `total` and allocations per category, in `CATEGORIES` order."""
    order = pl.Enum(CATEGORIES)
    return (live.group_by("category").agg(pl.col("bytes").sum(), count=pl.len())
            .with_columns(pct=pl.col("bytes") / total * 100 if total else pl.lit(None, dtype=pl.Float64))
            .sort(pl.col("category").cast(order)).select("category", "bytes", "pct", "count"))


def memory_answer(record: MemoryRecord, top: int = 10) -> MemoryAnswer:
    """One rank's memory over its step: the peak (time in ms from the step's start, phase,
    reserved memory and slack there), each phase's start, peak and end bytes, the categories
    live at the peak and at each phase's own peak, and the `top` origins of the bytes live at
    the peak."""
    blocks = categorized(record)
    curve = live_curve(blocks)
    start = record.start_ns
    ms = lambda t: round((t - start) / 1e6, 3)  # noqa: E731
    t, peak = highest(curve, record.start_ns, record.end_ns + 1)
    at_peak = live_at(blocks, t)
    phase = record.phases.filter((pl.col("start_ns") <= t) & (pl.col("end_ns") > t))["phase"]
    reserved = reserved_at(record, t)
    categories = by_category(at_peak, peak)
    if reserved is not None:
        slack = pl.DataFrame({"category": ["slack"], "bytes": [reserved - peak], "pct": [None], "count": [None]},
                             schema=categories.schema)
        categories = pl.concat([categories, slack])
    phases, per_phase = [], []
    for name, a, b in record.phases.iter_rows():
        pt, pb = highest(curve, a, b)
        phases.append({"phase": name, "start_ms": ms(a), "end_ms": ms(b), "start_bytes": value_at(curve, a - 1),
                       "peak_bytes": pb, "peak_at_ms": ms(pt), "end_bytes": value_at(curve, b - 1)})
        per_phase.append(by_category(live_at(blocks, pt), pb).select(pl.lit(name).alias("phase"), "category", "bytes"))
    largest = (at_peak.group_by("origin", "op", "category").agg(pl.col("bytes").sum(), count=pl.len())
               .sort("bytes", "origin", "op", descending=[True, False, False], nulls_last=True).head(top))
    origins = at_peak.group_by("origin", "category").agg(pl.col("bytes").sum())
    peak_row = {"bytes": peak, "at_ms": ms(t), "phase": phase[0] if phase.len() else None,
                "reserved_bytes": reserved, "slack_bytes": None if reserved is None else reserved - peak,
                "allocator_peak_bytes": record.allocator_peak_bytes}
    phase_schema = {"phase": pl.String, "start_ms": pl.Float64, "end_ms": pl.Float64, "start_bytes": pl.Int64,
                    "peak_bytes": pl.Int64, "peak_at_ms": pl.Float64, "end_bytes": pl.Int64}
    return MemoryAnswer(record.variant, record.rank, record.source, record.device, peak_row,
                        pl.DataFrame(phases, schema=phase_schema, orient="row"),
                        categories, pl.concat(per_phase) if per_phase else
                        pl.DataFrame(schema={"phase": pl.String, "category": pl.String, "bytes": pl.Int64}),
                        largest, origins, list(record.notes))


def peak_table(answers: list[MemoryAnswer]) -> pl.DataFrame:
    """One row per rank: its peak, when and in which phase, and the largest categories there
    (bytes per category as columns `<category>_bytes`)."""
    rows = []
    for a in answers:
        row = {"variant": a.variant, "rank": a.rank, "peak_bytes": a.peak["bytes"], "peak_at_ms": a.peak["at_ms"],
               "peak_phase": a.peak["phase"], "reserved_bytes": a.peak["reserved_bytes"],
               "allocator_peak_bytes": a.peak["allocator_peak_bytes"]}
        row.update({f"{c}_bytes": b for c, b in a.categories.select("category", "bytes").iter_rows()})
        rows.append(row)
    return pl.DataFrame(rows)


def mean_categories(answers: list[MemoryAnswer]) -> dict[str, float]:
    """Each category's bytes at the peak (the peak itself as `peak`), the mean over `answers`."""
    sums: dict[str, float] = {"peak": 0.0}
    for a in answers:
        sums["peak"] += a.peak["bytes"]
        for category, size in a.categories.select("category", "bytes").iter_rows():
            sums[category] = sums.get(category, 0.0) + size
    return {k: v / len(answers) for k, v in sums.items()} if answers else {}


def mean_origins(answers: list[MemoryAnswer]) -> dict[tuple[str, str], float]:
    sums: dict[tuple[str, str], float] = {}
    for a in answers:
        for o, c, size in a.origins.select("origin", "category", "bytes").iter_rows():
            sums[o, c] = sums.get((o, c), 0.0) + size
    return {k: v / len(answers) for k, v in sums.items()} if answers else {}


def mean_phase_peaks(answers: list[MemoryAnswer]) -> dict[str, float]:
    """Each phase's peak bytes, the mean over `answers` (a phase some rank lacks counts 0 there)."""
    sums: dict[str, float] = {}
    for a in answers:
        for phase, size in a.phases.select("phase", "peak_bytes").iter_rows():
            sums[phase] = sums.get(phase, 0.0) + size
    return {k: v / len(answers) for k, v in sums.items()}


def memory_delta(a: list[MemoryAnswer], b: list[MemoryAnswer]) -> pl.DataFrame:
    """B − A at the peak, the mean rank (whole bytes): one row for the peak, then one per phase
    (`kind` phase: the phase's own peak), one per category either side has at the peak (`kind`
    category), then one per origin whose bytes differ
    (`kind` origin, `origin [category]`, largest |Δ| first): `name`, `a_bytes`, `b_bytes`,
    `delta_bytes`; the peak row also has each side's peak phase."""
    ma, mb = mean_categories(a), mean_categories(b)
    phase = lambda side: ", ".join(sorted({x.peak["phase"] or "unknown" for x in side}))  # noqa: E731
    rows = [{"kind": "peak", "name": "peak", "a_bytes": ma.get("peak", 0.0), "b_bytes": mb.get("peak", 0.0),
             "a_phase": phase(a), "b_phase": phase(b)}]
    pa, pb = mean_phase_peaks(a), mean_phase_peaks(b)
    rows += [{"kind": "phase", "name": p, "a_bytes": pa.get(p, 0.0), "b_bytes": pb.get(p, 0.0)}
             for p in dict.fromkeys([*pa, *pb])]
    rows += [{"kind": "category", "name": c, "a_bytes": ma.get(c, 0.0), "b_bytes": mb.get(c, 0.0)}
             for c in CATEGORIES if c in ma or c in mb]
    oa, ob = mean_origins(a), mean_origins(b)
    rows += [{"kind": "origin", "name": f"{o} [{c}]", "a_bytes": oa.get((o, c), 0.0), "b_bytes": ob.get((o, c), 0.0)}
             for o, c in sorted(set(oa) | set(ob))]
    frame = pl.DataFrame(rows, schema={"kind": pl.String, "name": pl.String, "a_bytes": pl.Float64,
                                       "b_bytes": pl.Float64, "a_phase": pl.String, "b_phase": pl.String})
    frame = frame.with_columns(pl.col("a_bytes", "b_bytes").round(0).cast(pl.Int64)) \
        .with_columns(delta_bytes=pl.col("b_bytes") - pl.col("a_bytes"))
    origins = frame.filter(pl.col("kind") == "origin").sort(pl.col("delta_bytes").abs(), "name",
                                                              descending=[True, False])
    return pl.concat([frame.filter(pl.col("kind") != "origin"), origins.filter(pl.col("delta_bytes") != 0)])


def gib(n: float) -> str:
    """Bytes in the largest binary unit of at least 1, two decimals (`1.90 GiB`, `512.00 KiB`)."""
    for power, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if abs(n) >= 2 ** power:
            return f"{n / 2 ** power:.2f} {unit}"
    return f"{n:.0f} B"


def memory_lead(delta: pl.DataFrame, a: str, b: str, shown: int = 3) -> str | None:
    """`B's peak is X lower than A's (mean rank; in backward, A's in forward): unsharded
    parameters −2.40 GiB, activations +0.50 GiB` — the categories of the allocated bytes
    (slack is not among them) whose Δ is largest, up to `shown`, leaving out those under 1 % of
    the peak Δ; None without a peak row."""
    peak = delta.filter(pl.col("kind") == "peak")
    if peak.height == 0:
        return None
    row = peak.row(0, named=True)
    d = row["delta_bytes"]
    where = f"in {row['b_phase']}" + (f", {a}'s in {row['a_phase']}" if row["a_phase"] != row["b_phase"] else "")
    if d == 0:
        head = f"{b}'s peak equals {a}'s ({gib(row['b_bytes'])}, mean rank; {where})"
    else:
        head = f"{b}'s peak is {gib(abs(d))} {'higher' if d > 0 else 'lower'} than {a}'s (mean rank; {where})"
    parts = (delta.filter((pl.col("kind") == "category") & (pl.col("name") != "slack")
                          & (pl.col("delta_bytes").abs() >= 0.01 * max(abs(d), 1)))
             .sort(pl.col("delta_bytes").abs(), descending=True).head(shown))
    named = [f"{LABELS[n]} {'+' if x > 0 else '−'}{gib(abs(x))}"
             for n, x in parts.select("name", "delta_bytes").iter_rows()]
    return head + (": " + ", ".join(named) if named else "") + "."
