"""`tracekit critical-path`: the chain of dependencies that sets each step's length.

The graph (per step; docs/metrics.md "Critical path"). Nodes are the start and end of every
event of the step — its CPU ops and runtime/driver calls (step by start), and the device
activities it launched — plus a source S at the step's start and a sink T at its end
(`span`: the step's CPU window, stretched to the end of its last device activity). Edges:
- **host order**: on each thread, consecutive boundaries of its ops and calls (nested, so a
  parent's start → its first child's start, a child's end → the next child's start or the
  parent's end). The segment is work of the innermost open event (its self time): `host`
  for an op, `runtime` for a runtime/driver call (launch overhead, allocation); `waiting`
  inside a blocking sync call (`blocked`) and on a thread with nothing open. An
  annotation's self time while another thread runs a CPU op is `waiting` (the thread waits
  on it, e.g. the main thread during backward).
- **thread order**: a thread's top-level event starts after the latest boundary of any
  other thread before it (the trace records no hand-off; weight 0).
- **hand-off**: a thread that waited on another (an annotation's `other thread` time)
  resumes after the latest end, at or before it resumes, of a CPU op of the step on another
  thread that ended within the wait (backward's last op → the optimizer); weight 0.
- **launch**: the call's start → the activity's start (same correlation id); weight 0.
- **device work**: an activity's start → its end: `compute`, `comm`, `copy` (memcpy,
  memset). **stream order**: consecutive activities of a stream, end → start; weight 0.
- **event wait**: the last activity launched on the recording stream before the
  `cudaEventRecord` (CUPTI's `cuda_sync` record: `wait_on_stream`,
  `wait_on_cuda_event_record_corr_id`) → the first activity launched on the waiting stream
  after `cudaStreamWaitEvent`; weight 0.
  Without the record's id (-1 on the runner's traces): from the activity on another stream,
  launched before the call, whose end is the latest between the call's start and that first
  activity's start (`event wait (inferred)`).
- **sync**: the awaited activity's end → a blocking call's end (`timeline.SYNC_APIS`):
  event sync → the last activity on the recorded stream before the record (no record id but
  the event's stream: the last one launched on it before the call); stream sync →
  the last one launched on that stream before the call; device sync → the last one of every
  stream; a synchronous copy → its own copy. Without a `cuda_sync` record naming a stream or event: the activity
  launched before the call whose end is the latest within the call (`inferred`). Weight 0.
- **carried-over work**: a blocking call whose awaited activity is of an earlier step, or is
  queued behind an earlier step's activity on its stream that ends after the call starts:
  its blocked time is `carried-over work`, named for that earlier activity, not `blocked`.
- **collective arrival** (multi-rank runs): a collective kernel waits until the last rank of
  its group starts the same collective (the i-th of the step's collectives of its process
  group, of one kind on every rank, on the common clock);
  start → arrival is `waiting` (for that rank), arrival → end is `comm`.
- S → every node that no other edge leads to, every node that leads nowhere → T: weight 0
  (an S or T edge to any other node could not make a heavier path).

A capture without CPU ops (the `lean`/`device` recordings: runtime calls and the runner's
phase annotations only) keeps the annotations' self time as host work of kind `ops not
recorded`: the thread ran, but what it ran is not told. A device-only capture (no runtime call
recorded) has a graph of device work alone, over each step's device span: what the host did
is not told, and the gaps between the device's work are `waiting` of kind `stream gap, launch
not recorded` (the next activity waited for its launch, or for another stream: the trace does
not tell which; the `names/` trace of a tracekit run records one step in full).

Every edge goes forward in time (one that would go back — clock skew — is dropped); all
steps' graphs are built at once, with no edge between two steps. A work edge weighs its
duration, any other 0. The critical path is the S → T path of greatest weight, found by one
pass over the nodes in time order (`path_graph.py` builds the graph as numpy arrays,
`sorted_arrays.py` finds the path).
Every S → T path spends exactly the span (durations telescope), so its length `path_ns` plus
its `waiting` time is the span, exactly; its time splits into host, runtime, compute, comm,
copy and waiting.
"""

from __future__ import annotations

import polars as pl

from tracekit.analyses.align import path_gap_items
from tracekit.analyses.comms import collective_kernels
from tracekit.analyses.summary import shares_of_span
from tracekit.analyses.timeline import kept
from tracekit.core.model import ENGINE, Trace

CATEGORIES = ("host", "runtime", "compute", "comm", "copy", "waiting")
EDGE = {"category": pl.String, "kind": pl.String, "name": pl.String, "event": pl.Int64, "row": pl.Int64}
STEP_NAME = r"^ProfilerStep#\d+$"  # a step's own annotation: an item `ProfilerStep`, the same in every step
ITEMS = pl.List(pl.Struct({"category": pl.String, "kind": pl.String, "name": pl.String, "ns": pl.Int64}))


def longest_path(times, u, v, weight, source: int, sink: int) -> tuple[list[int], int]:
    """(nodes of the heaviest source → sink path, its weight; [] and 0 when none). `times[n]`:
    node n's time; every edge goes forward (`times[v] ≥ times[u]`) and weighs at most its Δt."""
    from tracekit.analyses.sorted_arrays import heaviest_paths

    (nodes, _, found), = heaviest_paths(times, u, v, weight, [source], [sink])
    return list(nodes), found


def host_events(trace: Trace) -> pl.LazyFrame:
    """The steps' CPU ops and runtime/driver calls: step, kind (`op`|`annotation`|`call`), name,
    tid, start, end, correlation (a query)."""
    ops = trace.ops.lazy().filter(pl.col("step").is_not_null()).select(
        "step", kind=pl.when(pl.col("cat") == "cpu_op").then(pl.lit("op")).otherwise(pl.lit("annotation")),
        name="name", tid="tid", start="start", end="end", correlation=pl.lit(None, pl.Int64))
    calls = trace.calls.lazy().filter(pl.col("step").is_not_null()).select(
        "step", kind=pl.lit("call"), name="name", tid="tid", start="start", end="end", correlation="correlation")
    return pl.concat([ops, calls]).with_columns(pl.col("tid").fill_null(0))


def device_events(trace: Trace) -> pl.LazyFrame:
    """The device activities the steps launched: step, row (into trace.gpu), name, category,
    device, stream, start, end, correlation (a query)."""
    return (trace.gpu.lazy().with_row_index("row").filter(pl.col("step").is_not_null())
            .select("step", pl.col("row").cast(pl.Int64), "name", "category", pl.col("device").fill_null(0),
                    pl.col("stream").fill_null(0), "start", "end", "correlation"))


def graph(trace: Trace, arrivals: pl.DataFrame | None = None):
    """Every step's graph in one (`path_graph.Graph`: node times and steps, edges as arrays,
    each step's source and sink). Its nodes' events are read once per trace (in memory): a
    report builds the graph with the run's arrivals and, for the diff, without."""
    from tracekit.analyses.path_graph import build, nodes_of

    def made():
        host, gpu = host_events(trace), device_events(trace)
        if trace.calls.height == 0 and trace.has_gpu:  # a device-only capture: the host's annotations tell nothing
            host = host.clear()
        return nodes_of(host, gpu, trace.steps)

    return build(trace, *kept(trace, ("critical-path", "nodes"), made), arrivals)


EDGE_COLUMNS = ("u", "v", "work", "category", "kind", "name", "event", "row", "ns")


def edge_table(g, ids=None, columns=EDGE_COLUMNS) -> pl.LazyFrame:
    """The graph's edges (all, or those at `ids`, in that order) as a table of `columns` of
    u, v, step (of u), start (time of u), end (time of v), work, category, kind, name, event
    (host event index), row (into trace.gpu), ns (Δt)."""
    import numpy as np

    from tracekit.analyses.path_graph import CODE, KINDS

    ids = np.arange(len(g.u)) if ids is None else np.asarray(ids, np.int64)
    raw = {"u": lambda: g.u[ids], "v": lambda: g.v[ids], "step": lambda: g.steps[g.u[ids]],
           "start": lambda: g.times[g.u[ids]], "end": lambda: g.times[g.v[ids]], "ns": lambda: g.ns[ids]}
    frame = pl.LazyFrame({"code": g.code[ids], "event": g.event[ids], "row": g.row[ids], "name_at": g.name_at(ids),
                          **{c: raw[c]() for c in columns if c in raw}})
    names = pl.concat([g.host["name"], g.gpu["name"]])
    name = pl.when(pl.col("name_at") >= 0).then(pl.lit(names).gather(pl.col("name_at").clip(0)))
    if g.late.height:  # a collective's wait for its last rank names that rank
        frame = frame.join(g.late.lazy(), on="row", how="left", maintain_order="left")
        name = pl.when(pl.col("code") == CODE["waiting", "collective arrival"]).then(
            pl.format("{} (rank {} late)", name, "late_rank")).otherwise(name)
    kinds = {c: pl.lit(pl.Series([k[i] for k in KINDS])).gather(pl.col("code")) for i, c in
             enumerate(("category", "kind", "work"))}
    made = {**kinds, "name": name, "event": pl.when(pl.col("event") >= 0).then("event"),
            "row": pl.when(pl.col("row") >= 0).then("row")}
    return frame.select(*[made[c].alias(c) if c in made else pl.col(c) for c in columns])


def collective_starts(trace: Trace) -> pl.DataFrame:
    """rank, pg, step (null: outside every step), seq (its launch index among the step's
    collectives of its process group), kind (the collective), row (into trace.gpu), start_abs
    (ns on the common clock: start + the trace's origin) of every launched collective kernel:
    the material of `arrivals_of_run` and `shifted_windows`."""
    if not trace.has_gpu:
        return pl.DataFrame(schema={"rank": pl.Int64, "pg": pl.String, "step": pl.Int64, "seq": pl.Int64,
                                    "kind": pl.String, "row": pl.Int64, "start_abs": pl.Int64})
    rows = trace.gpu.with_row_index("row").filter(pl.col("category") == "comm").select(
        pl.col("row").cast(pl.Int64), "start", pl.col("stream").fill_null(0), pl.col("device").fill_null(0))
    kernels = collective_kernels(trace).filter(pl.col("seq").is_not_null()).select(
        "pg", "step", "seq", "coll_kind", "start", pl.col("stream").fill_null(0), pl.col("device").fill_null(0))
    return (kernels.join(rows, on=["start", "stream", "device"]).unique(["pg", "seq"], keep="first").sort("seq")
            .select(rank=pl.lit(trace.rank, pl.Int64), pg="pg", step="step",
                    seq=(pl.int_range(pl.len()).over("pg", "step")).cast(pl.Int64), kind="coll_kind", row="row",
                    start_abs=pl.col("start") + trace.origin_us * 1000))


def arrivals_of_run(starts: list[pl.DataFrame], origins_ns: list[int]) -> list[pl.DataFrame | None]:
    """Per trace of a run: row (into its gpu table), arrival (ns, its own clock), late_rank —
    when the last rank to arrive started the same collective (the seq-th of the step's
    collectives of its process group on each rank, of one kind on all), for the collectives this
    rank entered earlier. None for a run of one trace. By step, not by launch index over the
    trace: ranks whose traces begin at different points (one holds collectives before its first
    step that another does not) still pair the same collectives."""
    if len(starts) < 2:
        return [None] * len(starts)
    together = pl.concat(starts).filter(pl.col("step").is_not_null())
    last = together.sort("start_abs").group_by("pg", "step", "seq").agg(
        arrival_abs=pl.col("start_abs").last(), late_rank=pl.col("rank").last(), n=pl.len(),
        kinds=pl.col("kind").n_unique())
    return [own.join(last.filter((pl.col("n") > 1) & (pl.col("kinds") == 1)), on=["pg", "step", "seq"])
            .filter(pl.col("late_rank") != pl.col("rank"))
            .select("row", arrival=pl.col("arrival_abs") - origin, late_rank="late_rank")
            for own, origin in zip(starts, origins_ns)]


def shifted_windows(starts: list[pl.DataFrame]) -> list[str]:
    """Notes on a run's ranks whose collectives do not line up (`collective_starts` of each):
    a process group whose ranks hold different numbers of its collectives outside every step
    (their traces begin or end at different points: paired by launch index over the trace, every
    collective would meet the wrong one), and a step in which they hold different numbers (paired
    by order within the step, those past the first difference may meet the wrong one)."""
    if len(starts) < 2:
        return []
    together = pl.concat(starts)
    every = together.select("pg", "step").unique().join(together.select("pg", "rank").unique(), on="pg")
    counts = (every.join(together.group_by("pg", "step", "rank").agg(n=pl.len()), on=["pg", "step", "rank"],
                         how="left", nulls_equal=True)
              .with_columns(pl.col("n").fill_null(0)).sort("pg", "step", "rank", nulls_last=False))
    notes = []
    for (pg, step), group in counts.filter(pl.col("n").n_unique().over("pg", "step") > 1).group_by(
            "pg", "step", maintain_order=True):
        ranks = ", ".join(f"rank {r}: {n}" for r, n in group.select("rank", "n").iter_rows())
        if step is None:
            notes.append(f"the ranks' windows are shifted: they hold different numbers of process group {pg}'s "
                         f"collectives outside the steps ({ranks}); the critical path pairs each step's collectives "
                         "by their order within the step")
        else:
            notes.append(f"in step {step} the ranks hold different numbers of process group {pg}'s collectives "
                         f"({ranks}): the critical path's waits for a late rank past the first difference may pair "
                         "the wrong collectives")
    return notes


def collective_arrivals(traces: list[Trace]) -> list[pl.DataFrame | None]:
    """`arrivals_of_run` of loaded traces."""
    return arrivals_of_run([collective_starts(t) for t in traces], [t.origin_us * 1000 for t in traces])


def run_critical_paths(traces: list[Trace], top: int | None = 10) -> list[pl.DataFrame]:
    """`critical_path` of each of a run's traces with the run's collective arrivals
    (`collective_arrivals`). Each depends on every trace of the run, so each trace keeps its
    own under the run's identity (`run_identity`): a later command on the same run reads them
    from the trace cache, and a changed trace of the run gives every rank a fresh one."""
    if len(traces) < 2:
        return [critical_path(t, None, top) for t in traces]
    key = f"critical-path-run-{run_identity(traces)}"
    if not all(key in t.derived for t in traces):
        for t, arrival in zip(traces, collective_arrivals(traces)):
            t.derived[key] = path_split(t, *heaviest(t, arrival))
    return [largest_items(t.derived[key], top) for t in traces]


def run_identity(traces: list[Trace]) -> str:
    """A hash of what a run's tables are made from: each trace's path, rank and, where the
    trace cache holds it, its entry (named by the file's identity) and the naming its tables
    were rebased on (`cache.Derived`)."""
    import hashlib

    text = "\n".join(f"{t.path}\t{t.rank}\t{getattr(t.derived, 'entry', '')}\t{getattr(t.derived, 'basis', '')}"
                     for t in traces)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dependency_graph(trace: Trace, step: int, arrivals: pl.DataFrame | None = None):
    """(nodes, edges) of one step's graph. nodes: node, time, end (the event's end, else its
    start), table (`host` | `gpu` | `arrival` | `source` | `sink`), name, correlation.
    edges: u, v, work, category, kind, name, event, row, ns (Δt)."""
    g = graph(trace, arrivals)
    n_host = g.host.height
    nodes = pl.concat([
        g.host.select("name", "correlation", table=pl.lit("host")).with_row_index("i").with_columns(
            node=2 * pl.col("i").cast(pl.Int64)),
        g.gpu.select("name", "correlation", table=pl.lit("gpu")).with_row_index("i").with_columns(
            node=2 * n_host + 2 * pl.col("i").cast(pl.Int64)),
    ]).drop("i")
    nodes = pl.concat([nodes.with_columns(end=pl.lit(False)), nodes.with_columns(end=pl.lit(True), node=pl.col("node") + 1)])
    every = pl.DataFrame({"time": g.times, "step": g.steps}).with_columns(node=pl.int_range(pl.len(), dtype=pl.Int64))
    ends = g.ends.filter(pl.col("step") == step)
    nodes = every.filter(pl.col("step") == step).join(nodes, on="node", how="left").with_columns(
        table=pl.when(pl.col("node").is_in(ends["source"].implode())).then(pl.lit("source"))
        .when(pl.col("node").is_in(ends["sink"].implode())).then(pl.lit("sink"))
        .otherwise(pl.col("table").fill_null("arrival"))).drop("step")
    return nodes, edge_table(g, (g.steps[g.u] == step).nonzero()[0]).collect(engine=ENGINE)


def path_edges(trace: Trace, arrivals: pl.DataFrame | None = None) -> pl.DataFrame:
    """The critical path of every step as its edges in time order: step, start, end, ns,
    category, kind, name, event (host event index), row (into trace.gpu). Without arrivals it
    depends on the trace alone, so it is kept with it (`timeline.kept`: a later command on the
    same trace reads it from the trace cache)."""
    import numpy as np

    def made():
        g, found = heaviest(trace, arrivals)
        ids = [np.zeros(0, np.int64), *(ids for _, ids, _ in found)]
        return edge_table(g, np.concatenate(ids), ("step", "start", "end", "ns", *EDGE)).collect(engine=ENGINE)

    return made() if arrivals is not None else kept(trace, "critical-path-edges", made)


SHARES = {"host_pct": "host_ns", "runtime_pct": "runtime_ns", "gpu_pct": "compute_ns", "comm_pct": "comm_ns",
          "copy_pct": "copy_ns", "wait_pct": "waiting_ns"}


def critical_path(trace: Trace, arrivals: pl.DataFrame | None = None, top: int | None = 10) -> pl.DataFrame:
    """One row per step: span_ns, path_ns (the path's weight: its time not waiting), its time
    by category — host_ns, runtime_ns, compute_ns, comm_ns, copy_ns, waiting_ns (they sum to
    span_ns) — and items [{category, kind, name, ns}]: the path's time by what spent it (a
    wait named `<kind>: <what>`), largest first (`top` kept); host_pct, runtime_pct, gpu_pct
    (compute), comm_pct, copy_pct, wait_pct: those times over span_ns × 100 (2 decimals), the
    step's own shares (`--agg` gives their statistic). A step with no events: figures null.
    Without arrivals, kept with the trace like `path_edges`."""
    def made():
        return path_split(trace, *heaviest(trace, arrivals))

    whole = made() if arrivals is not None else kept(trace, "critical-path", made)
    return largest_items(whole.with_columns(shares_of_span(SHARES, "span_ns")), top)


def largest_items(frame: pl.DataFrame, top: int | None) -> pl.DataFrame:
    """`frame` with each row's items (a step's, or a statistic's over the steps) sorted by
    time, largest first, and cut to `top` (all with None)."""
    ns = pl.element().struct.field("ns")
    items = pl.col("items").list.eval(pl.element().sort_by(ns, descending=True, nulls_last=True, maintain_order=True))
    return frame.with_columns(items.list.head(top) if top else items)


def heaviest(trace: Trace, arrivals: pl.DataFrame | None) -> tuple:
    """(graph, the heaviest path of each step as `path_graph.heaviest_paths` gives them).
    Without arrivals, kept in memory on the trace (not in the trace cache: `path_edges` and
    `critical_path` keep their own tables there)."""
    def made():
        from tracekit.analyses.sorted_arrays import heaviest_paths

        g = graph(trace, arrivals)
        return g, heaviest_paths(g.times, g.u, g.v, g.weight, g.ends["source"].to_list(), g.ends["sink"].to_list())

    return made() if arrivals is not None else kept(trace, ("critical-path", "found"), made)


def path_split(trace: Trace, g, found: list) -> pl.DataFrame:
    """`critical_path` of the paths `heaviest_paths` found in graph g, every item kept: the
    edges summed by step and category, and by step, kind and name (as integers: only the sums
    are named)."""
    import numpy as np

    from tracekit.analyses.path_graph import KINDS
    from tracekit.analyses.sorted_arrays import grouped_sums

    ids = np.concatenate([np.zeros(0, np.int64), *(ids for _, ids, _ in found)])
    k = np.repeat(np.arange(len(found)), [len(i) for _, i, _ in found])  # which path
    steps = g.ends["step"].to_numpy()
    ns, category = g.ns[ids], np.array([CATEGORIES.index(c) for c, *_ in KINDS])[g.code[ids]]
    figures = np.zeros((len(found), len(CATEGORIES)), np.int64)
    np.add.at(figures.reshape(-1), k * len(CATEGORIES) + category, ns)  # one index: 4x faster than a pair
    has = np.array([len(i) > 0 for _, i, _ in found], bool)
    split = pl.DataFrame({"step": steps[has], "span_ns": figures[has].sum(1),
                          "path_ns": figures[has].sum(1) - figures[has, CATEGORIES.index("waiting")],
                          **{f"{c}_ns": figures[has, i] for i, c in enumerate(CATEGORIES)}})
    spent = np.flatnonzero(ns > 0)
    # a device-only capture named from its full step: its stream gaps by their host cause
    waits = path_gap_items(trace, edge_table(g, ids[spent], ("step", "start", "end", "kind")))
    spent = np.delete(spent, waits["edge"].unique().to_numpy())
    name = g.name_key(ids[spent])
    first, sums = grouped_sums((k[spent] * len(KINDS) + g.code[ids[spent]]) * (name.max(initial=0) + 1) + name,
                               ns[spent])
    waiting = pl.col("category") == "waiting"
    named = pl.when(waiting & pl.col("name").is_not_null()).then(pl.format("{}: {}", "kind", "name")) \
        .when(waiting).then(pl.col("kind")).otherwise(pl.col("name").str.replace(STEP_NAME, "ProfilerStep"))
    # a group per name, but a collective's waits for each rank share one item; eager from here on
    # (~900 rows: one lazy query of all took twice the time)
    items = (edge_table(g, ids[spent][first], ("step", "category", "kind", "name"))
             .with_columns(ns=pl.lit(pl.Series(sums, dtype=pl.Int64)), name=named).collect(engine=ENGINE)
             .vstack(waits.drop("edge"))
             .group_by("step", "category", "kind", "name").agg(ns=pl.col("ns").sum())
             .sort("step", "ns", "name", descending=[False, True, False], nulls_last=True)
             .group_by("step", maintain_order=True).agg(items=pl.struct("category", "kind", "name", "ns")))
    return (trace.steps.select("step").join(split.join(items, on="step", how="left"), on="step", how="left")
            .with_columns(pl.col("items").cast(ITEMS)).sort("step"))


def on_path(trace: Trace, arrivals: pl.DataFrame | None = None) -> pl.DataFrame:
    """row (into trace.gpu), step, cp_ns: device activities whose work lies on their step's
    critical path, and how much of it."""
    edges = path_edges(trace, arrivals)
    return (edges.filter(pl.col("row").is_not_null() & (pl.col("category") != "waiting"))
            .group_by("row", "step").agg(cp_ns=pl.col("ns").sum()).sort("row"))


def critical_path_in_run(trace: Trace, arrivals: dict, top: int | None = 10) -> pl.DataFrame:
    """`critical_path` with the trace's collective arrivals from `arrivals` ((path, rank) →
    frame, as `arrivals_of_run` gives them), where its run has several ranks."""
    return critical_path(trace, arrivals.get((trace.path, trace.rank)), top)
