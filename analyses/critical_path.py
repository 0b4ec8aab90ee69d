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
- **launch**: the call's start → the activity's start (same correlation id); weight 0.
- **device work**: an activity's start → its end: `compute`, `comm`, `copy` (memcpy,
  memset). **stream order**: consecutive activities of a stream, end → start; weight 0.
- **event wait**: the last activity launched on the recording stream before the
  `cudaEventRecord` (CUPTI's `cuda_sync` record: `wait_on_stream`,
  `wait_on_cuda_event_record_corr_id`) → the first activity launched on the waiting stream
  after `cudaStreamWaitEvent`; weight 0.
- **sync**: the awaited activity's end → a blocking call's end (`timeline.SYNC_APIS`):
  event sync → the last activity on the recorded stream before the record; stream sync →
  the last one launched on that stream before the call; device sync → the last one of every
  stream; a synchronous copy → its own copy. Without a `cuda_sync` record: the activity
  launched before the call whose end is the latest within the call (`inferred`). Weight 0.
- **collective arrival** (multi-rank runs): a collective kernel waits until the last rank of
  its group starts the same collective (the i-th of its process group, on the common clock);
  start → arrival is `waiting` (for that rank), arrival → end is `comm`.
- S → every node that no other edge leads to, every node that leads nowhere → T: weight 0
  (an S or T edge to any other node could not make a heavier path).

A capture without CPU ops (the `lean`/`device` recordings: runtime calls and the runner's
phase annotations only) keeps the annotations' self time as host work of kind `ops not
recorded`: the thread ran, but what it ran is not told. A device-only capture (no runtime call
recorded) has a graph of device work alone, over each step's device span: what the host did
is not told, and the gaps between the device's work are `waiting`.

Every edge goes forward in time (one that would go back — clock skew — is dropped); all
steps' graphs are built at once, with no edge between two steps. A work edge weighs its
duration, any other 0. The critical path is the S → T path of greatest weight, found by one
pass over the nodes in time order (`heaviest_paths`). Every S → T path spends exactly the span
(durations telescope), so its length `path_ns` plus its `waiting` time is the span, exactly;
its time splits into host, runtime, compute, comm, copy and waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.analyses.comms import collective_kernels
from tracekit.analyses.timeline import SYNC_APIS, kept
from tracekit.core.model import Trace

CATEGORIES = ("host", "runtime", "compute", "comm", "copy", "waiting")
GPU_CATEGORY = {"compute": "compute", "comm": "comm", "memcpy": "copy", "memset": "copy"}
EDGE = {"category": pl.String, "kind": pl.String, "name": pl.String, "event": pl.Int64, "row": pl.Int64}
ITEMS = pl.List(pl.Struct({"category": pl.String, "kind": pl.String, "name": pl.String, "ns": pl.Int64}))


def longest_path(times, u, v, weight, source: int, sink: int) -> tuple[list[int], int]:
    """(nodes of the heaviest source → sink path, its weight; [] and 0 when none). `times[n]`:
    node n's time; every edge goes forward (`times[v] ≥ times[u]`) and weighs at most its Δt."""
    (nodes, _, found), = heaviest_paths(times, u, v, weight, [source], [sink])
    return nodes, found


def chained_edges(u, v, weight, ends: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A node with one edge in and one out (not in `ends`) only passes its way on, so each run
    of edges through such nodes is one edge of their summed weight (host lanes are mostly
    that). (edges: e, u, v, w, head = the first edge of its run, far = its place in the run;
    runs: head, u, v, w), by pointer jumping. Edges on a cycle of such nodes, which nothing
    reaches, are left out."""
    edges = pl.DataFrame({"u": u, "v": v, "w": weight}, schema={"u": pl.Int64, "v": pl.Int64, "w": pl.Int64})
    edges = edges.with_columns(e=pl.int_range(pl.len(), dtype=pl.Int64))
    ins = edges.group_by("v").agg(into=pl.col("e").first(), n_in=pl.len())
    single_out = edges.group_by("u").len().filter(pl.col("len") == 1)["u"]
    through = ins.filter((pl.col("n_in") == 1) & pl.col("v").is_in(single_out.implode())
                         & ~pl.col("v").is_in(pl.Series(ends, dtype=pl.Int64).implode())).select(node="v", into="into")
    edges = (edges.join(through.rename({"node": "u"}), on="u", how="left")
             .with_columns(v_through=pl.col("v").is_in(through["node"].implode()),
                           head=pl.coalesce("into", "e")).sort("e"))
    head = edges["head"]
    far = (head != edges["e"]).cast(pl.Int64)
    for _ in range(64):
        jumped = head.gather(head)
        if jumped.equals(head):
            break
        far, head = far + far.gather(head), jumped
    edges = edges.with_columns(head=head, far=far).filter(head.gather(head) == head)
    runs = (edges.group_by("head").agg(w=pl.col("w").sum())
            .join(edges.filter(pl.col("e") == pl.col("head")).select("head", "u"), on="head")
            .join(edges.filter(~pl.col("v_through")).select("head", "v"), on="head"))
    return edges, runs


def heaviest_paths(times, u, v, weight, sources: list[int], sinks: list[int]) -> list[tuple[list[int], list[int], int]]:
    """For each (source, sink) pair of disconnected parts of one graph: the heaviest path's
    nodes, its edges (indices into u, v) and its weight. times, u, v, weight: integer sequences.

    Over the graph of runs (`chained_edges`): every edge goes forward in time, so nodes in
    time order — equal times ordered by how many Δt = 0 edges lead to them — are in
    topological order, and one pass over the edges in their tail's order gives each node its
    heaviest way in (max over its in-edges of that of u + weight) before passing it on. A Δt = 0
    cycle (it weighs 0) leaves edges that go back in that order: then passes repeat until
    nothing gains. Of equal ways in, the first edge counts."""
    times = pl.Series("time", times, pl.Int64)
    n = len(times)
    chained, runs = chained_edges(u, v, weight, [*sources, *sinks])
    runs = runs.with_columns(tu=times.gather(runs["u"]), tv=times.gather(runs["v"]))
    tied = runs.filter(pl.col("tu") == pl.col("tv")).select("u", "v").rows()
    depth = dict.fromkeys((b for _, b in tied), 0)  # the most Δt = 0 edges into a node, in a row (≤ 64)
    for _ in range(64 if tied else 0):
        deeper = False
        for a, b in tied:
            if depth.get(a, 0) + 1 > depth[b] and depth[b] < 64:
                depth[b], deeper = depth.get(a, 0) + 1, True
        if not deeper:
            break
    deep = {k: d for k, d in depth.items() if d}
    runs = runs.with_columns(du=pl.col("u").replace_strict(deep, default=0, return_dtype=pl.Int64),
                                 dv=pl.col("v").replace_strict(deep, default=0, return_dtype=pl.Int64))
    runs = runs.sort("tu", "du", "u", "head")  # by tail: time, then Δt = 0 edges into it
    backward = runs.select(((pl.col("tv") == pl.col("tu")) & (pl.col("dv") <= pl.col("du"))).any()).item()
    tails, heads, weights = runs["u"].to_list(), runs["v"].to_list(), runs["w"].to_list()
    best, before = [-1] * n, [-1] * n  # heaviest way in from a source (-1: none), its edge
    for source in sources:
        best[source] = 0
    gained = True
    while gained:
        gained = False
        for e, tail, to, w in zip(range(len(tails)), tails, heads, weights):
            way = best[tail]
            if way >= 0 and way + w > best[to]:
                best[to], before[to], gained = way + w, e, backward
    firsts, on_path, step = runs["head"].to_list(), [], []
    for k, (source, sink) in enumerate(zip(sources, sinks)):
        node = sink
        while best[sink] >= 0 and node != source:
            on_path.append(firsts[before[node]])
            step.append(k)
            node = tails[before[node]]
    path = pl.DataFrame({"head": on_path, "k": step}, schema={"head": pl.Int64, "k": pl.Int64})
    walked = (chained.join(path.with_columns(back=pl.int_range(pl.len())), on="head")
              .sort("k", "back", "far", descending=[False, True, False]).partition_by("k", as_dict=True))
    found = []
    for k, (source, sink) in enumerate(zip(sources, sinks)):
        if best[sink] < 0:
            found.append(([], [], 0))
            continue
        found.append(([source, *walked[(k,)]["v"].to_list()], walked[(k,)]["e"].to_list(), best[sink]))
    return found


def host_events(trace: Trace) -> pl.DataFrame:
    """The steps' CPU ops and runtime/driver calls: step, kind (`op`|`annotation`|`call`), name,
    tid, start, end, correlation."""
    ops = trace.ops.filter(pl.col("step").is_not_null()).select(
        "step", kind=pl.when(pl.col("cat") == "cpu_op").then(pl.lit("op")).otherwise(pl.lit("annotation")),
        name="name", tid="tid", start="start", end="end", correlation=pl.lit(None, pl.Int64))
    calls = trace.calls.filter(pl.col("step").is_not_null()).select(
        "step", kind=pl.lit("call"), name="name", tid="tid", start="start", end="end", correlation="correlation")
    return pl.concat([ops, calls]).with_columns(pl.col("tid").fill_null(0))


def device_events(trace: Trace) -> pl.DataFrame:
    """The device activities the steps launched: step, row (into trace.gpu), name, category,
    device, stream, start, end, correlation."""
    return (trace.gpu.with_row_index("row").filter(pl.col("step").is_not_null())
            .select("step", pl.col("row").cast(pl.Int64), "name", "category", pl.col("device").fill_null(0),
                    pl.col("stream").fill_null(0), "start", "end", "correlation"))


class Edges:
    """Edges gathered as columns: u, v (node ids), work (weighs its Δt), category, kind,
    name, event (host event index), row (device activity)."""

    def __init__(self):
        self.parts: list[pl.DataFrame] = []

    def add(self, frame: pl.DataFrame, **constant):
        frame = frame.with_columns(**{k: pl.lit(c) for k, c in constant.items()})
        for column, dtype in EDGE.items():
            if column not in frame.columns:
                frame = frame.with_columns(pl.lit(None, dtype).alias(column))
        self.parts.append(frame.select(pl.col("u").cast(pl.Int64), pl.col("v").cast(pl.Int64),
                                       pl.col("work").cast(pl.Boolean), *[pl.col(c).cast(t) for c, t in EDGE.items()]))

    def frame(self) -> pl.DataFrame:
        return pl.concat(self.parts)


def host_lanes(host: pl.DataFrame, edges: Edges, unrecorded: bool = False) -> pl.DataFrame:
    """Adds host-order edges; returns the boundaries (node, step, tid, time, depth). `unrecorded`:
    the trace holds no CPU ops, so an annotation's self time is host work of kind
    `ops not recorded`."""
    bounds = pl.concat([
        host.with_row_index("event").select(
            "event", "step", "tid", time="start", is_start=pl.lit(True), node=pl.col("event") * 2,
            key=pl.when(pl.col("end") == pl.col("start")).then(1).otherwise(2), tie=-pl.col("end")),
        host.with_row_index("event").select(
            "event", "step", "tid", time="end", is_start=pl.lit(False), node=pl.col("event") * 2 + 1,
            key=pl.when(pl.col("end") == pl.col("start")).then(1).otherwise(0), tie=-pl.col("start")),
    ]).with_columns(pl.col("event").cast(pl.Int64), pl.col("node").cast(pl.Int64))
    # at one time: ends (inner first), then zero-length events, then starts (outer first). Each
    # lane (step, tid) opens and closes every event it holds, so the running depth over all
    # lanes is each lane's own, and an event open at depth d was opened in its own lane.
    bounds = bounds.sort("step", "tid", "time", "key", "tie", "node").with_columns(
        depth=pl.when(pl.col("is_start")).then(1).otherwise(-1).cum_sum())
    bounds = bounds.with_columns(
        owner=pl.when(pl.col("is_start")).then(pl.col("event")).forward_fill().over("depth"))
    bounds = bounds.with_columns(owner=pl.when(pl.col("depth") > 0).then(pl.col("owner")))
    owners = host.with_row_index("event").select(pl.col("event").cast(pl.Int64).alias("owner"),
                                                 o_kind="kind", o_name="name", o_start="start", o_end="end")
    same_lane = (pl.col("step").shift(-1) == pl.col("step")) & (pl.col("tid").shift(-1) == pl.col("tid"))
    seg = bounds.with_columns(v=pl.when(same_lane).then(pl.col("node").shift(-1)),
                              t_next=pl.col("time").shift(-1)
                              ).filter(pl.col("v").is_not_null()).join(owners, on="owner", how="left")
    # annotations waiting on another thread's op (the main thread inside backward): the latest
    # end of the other threads' ops that start before the segment ends lies after its start
    waiting_on = seg.filter(pl.col("o_kind") == "annotation").select("node", "step", "tid", "time", "t_next")
    ops = host.filter(pl.col("kind") == "op").select("step", "tid", c_start="start", c_end="end")
    busy_elsewhere = []
    for tid in waiting_on["tid"].unique().to_list():  # few threads
        others = (ops.filter(pl.col("tid") != tid).group_by("step", "c_start").agg(pl.col("c_end").max())
                  .sort("step", "c_start").with_columns(c_end=pl.col("c_end").cum_max().over("step")))
        mine = waiting_on.filter(pl.col("tid") == tid).sort("t_next")
        busy_elsewhere.append(mine.join_asof(others, left_on="t_next", right_on="c_start", by="step",
                                             strategy="backward", allow_exact_matches=False, check_sortedness=False)
                              .filter(pl.col("c_end") > pl.col("time"))["node"])
    sync = pl.col("o_name").is_in(SYNC_APIS)
    busy = pl.concat(busy_elsewhere) if busy_elsewhere else pl.Series("node", [], pl.Int64)
    seg = seg.with_columns(elsewhere=pl.col("node").is_in(busy.implode()))
    edges.add(seg.select(
        u="node", v="v", work=pl.col("owner").is_not_null() & ~sync & ~pl.col("elsewhere"),
        category=pl.when(pl.col("owner").is_null() | sync | pl.col("elsewhere")).then(pl.lit("waiting"))
        .when(pl.col("o_kind") == "call").then(pl.lit("runtime")).otherwise(pl.lit("host")),
        kind=pl.when(pl.col("owner").is_null()).then(pl.lit("thread idle")).when(sync).then(pl.lit("blocked"))
        .when(pl.col("elsewhere")).then(pl.lit("other thread"))
        .when((pl.col("o_kind") == "annotation") & unrecorded).then(pl.lit("ops not recorded")).otherwise(pl.lit("self")),
        name=pl.when(pl.col("owner").is_null()).then(pl.lit(None, pl.String)).otherwise(pl.col("o_name")),
        event="owner"))
    by_time = bounds.select("step", "tid", o_time="time", u="node").sort("o_time")
    top = bounds.filter(pl.col("is_start") & (pl.col("depth") == 1)).sort("time")
    for tid in bounds["tid"].unique().to_list():  # thread order: few threads
        others = by_time.filter(pl.col("tid") != tid).drop("tid")
        mine = top.filter(pl.col("tid") == tid)
        if others.height and mine.height:
            handoff = mine.join_asof(others, left_on="time", right_on="o_time", by="step", strategy="backward",
                                     check_sortedness=False)
            edges.add(handoff.filter(pl.col("u").is_not_null()).select("u", v="node", work=pl.lit(False)),
                      category="waiting", kind="thread order")
    return bounds


def last_before(acts: pl.DataFrame, keys: pl.DataFrame, on: list[str], corr: str) -> pl.DataFrame:
    """keys with `src`: the end node of the last activity of `on` (device, stream) launched
    before correlation `corr` (`acts`: node_end, correlation, and the `on` columns)."""
    right = acts.select(*on, "correlation", src="node_end").drop_nulls("correlation").sort("correlation")
    left = keys.with_row_index("_k").sort(corr)
    return left.join_asof(right, left_on=corr, right_on="correlation", by=on, strategy="backward", check_sortedness=False,
                          allow_exact_matches=False).sort("_k").drop("_k")


def first_after(acts: pl.DataFrame, keys: pl.DataFrame, on: list[str], corr: str) -> pl.DataFrame:
    right = acts.select(*on, "correlation", dst="node_start").drop_nulls("correlation").sort("correlation")
    left = keys.with_row_index("_k").sort(corr)
    return left.join_asof(right, left_on=corr, right_on="correlation", by=on, strategy="forward", check_sortedness=False,
                          allow_exact_matches=False).sort("_k").drop("_k")


@dataclass
class Graph:
    """Every step's graph in one: `times[n]` (ns), `steps[n]` (the step of node n), edges (u, v,
    ns = Δt ≥ 0, work, category, kind, name, event, row; no edge between two steps), and per
    step its source and sink nodes (`ends`: step, source, sink)."""

    times: pl.Series
    steps: pl.Series
    edges: pl.DataFrame
    ends: pl.DataFrame
    host: pl.DataFrame
    gpu: pl.DataFrame


def graph(trace: Trace, arrivals: pl.DataFrame | None = None) -> Graph:
    host, gpu = host_events(trace), device_events(trace)
    if trace.calls.height == 0 and trace.has_gpu:  # a device-only capture: the host's annotations tell nothing
        host = host.clear()
    unrecorded = not (trace.ops["cat"] == "cpu_op").any()  # a lean capture: calls, but no CPU ops
    n_host = host.height
    edges = Edges()
    bounds = host_lanes(host, edges, unrecorded) if n_host else None
    base = 2 * n_host
    acts = gpu.with_row_index("i").with_columns(node_start=base + 2 * pl.col("i").cast(pl.Int64),
                                                node_end=base + 2 * pl.col("i").cast(pl.Int64) + 1)
    n_nodes = base + 2 * gpu.height
    split = pl.DataFrame(schema={"row": pl.Int64, "arrival": pl.Int64, "late_rank": pl.Int64})
    if arrivals is not None and gpu.height:
        split = acts.join(arrivals, on="row").filter((pl.col("arrival") > pl.col("start")) &
                                                     (pl.col("arrival") < pl.col("end"))).select("row", "arrival", "late_rank")
    split = split.with_row_index("k").with_columns(node=n_nodes + pl.col("k").cast(pl.Int64))
    n_nodes += split.height
    acts = acts.join(split.select("row", "arrival", "late_rank", node_mid="node"), on="row", how="left")
    category = pl.col("category").replace_strict(GPU_CATEGORY, default="compute")
    whole = acts.filter(pl.col("node_mid").is_null())
    edges.add(whole.select(u="node_start", v="node_end", work=pl.lit(True), category=category, kind=pl.lit("device"),
                           name="name", row="row"))
    halves = acts.filter(pl.col("node_mid").is_not_null())
    edges.add(halves.select(u="node_start", v="node_mid", work=pl.lit(False), category=pl.lit("waiting"),
                            kind=pl.lit("collective arrival"),
                            name=pl.format("{} (rank {} late)", pl.col("name"), pl.col("late_rank")), row="row"))
    edges.add(halves.select(u="node_mid", v="node_end", work=pl.lit(True), category=pl.lit("comm"),
                            kind=pl.lit("device"), name="name", row="row"))
    lanes = acts.sort("step", "device", "stream", "start", "end")
    edges.add(lanes.select(u="node_end", v=pl.col("node_start").shift(-1).over("step", "device", "stream"),
                           work=pl.lit(False)).filter(pl.col("v").is_not_null()), category="waiting", kind="stream order")
    # per step: its window, a source and a sink node
    windows = (trace.steps.join(host.group_by("step").agg(n_host=pl.len()), on="step", how="left")
               .join(gpu.group_by("step").agg(g_start=pl.col("start").min(), g_end=pl.col("end").max()), on="step",
                     how="left")
               .filter(pl.col("n_host").is_not_null() | pl.col("g_start").is_not_null()).sort("step")
               .with_row_index("k").select(
                   "step", begin=pl.when(pl.col("n_host").is_not_null()).then(pl.col("cpu_start")).otherwise("g_start"),
                   finish=pl.max_horizontal(pl.when(pl.col("n_host").is_not_null()).then(pl.col("cpu_end")), "g_end"),
                   source=n_nodes + 2 * pl.col("k").cast(pl.Int64), sink=n_nodes + 2 * pl.col("k").cast(pl.Int64) + 1))
    placed = [acts.select(node=column, time=value, step="step") for column, value in (("node_start", "start"),
                                                                                     ("node_end", "end"))]
    if n_host:
        placed.append(bounds.select("node", "time", "step"))
        calls = host.with_row_index("event").filter(pl.col("kind") == "call").select(
            pl.col("event").cast(pl.Int64), "name", "correlation", "start", "end")
        launch = calls.join(acts.select("correlation", "node_start"), on="correlation")
        edges.add(launch.select(u=pl.col("event") * 2, v="node_start", work=pl.lit(False)),
                  category="waiting", kind="launch")
        sync_edges(trace, calls, acts, edges)
    if split.height:
        placed.append(split.join(acts.select("row", "step"), on="row").select("node", time="arrival", step="step"))
    placed += [windows.select(node=column, time=value, step="step") for column, value in (("source", "begin"),
                                                                                         ("sink", "finish"))]
    nodes = pl.concat([p.cast(pl.Int64) for p in placed]).sort("node")  # every node 0 … n, once
    times, steps = nodes["time"], nodes["step"]
    frame = edges.frame().filter(pl.col("u").is_not_null() & pl.col("v").is_not_null())
    frame = frame.with_columns(ns=times.gather(frame["v"]) - times.gather(frame["u"]))
    frame = frame.filter((pl.col("ns") >= 0) & (steps.gather(frame["u"]) == steps.gather(frame["v"])))
    # S → a node nothing else leads to, a node that leads nowhere → T: any other S or T edge
    # would weigh 0 beside a path through real edges weighing ≥ 0, so it could not be heavier
    inner = nodes.head(n_nodes).select("node", "step").join(windows.select("step", "source", "sink"), on="step")
    edges = Edges()
    edges.add(inner.join(frame.select(node="v"), on="node", how="anti").select(u="source", v="node", work=pl.lit(False)),
              category="waiting", kind="start")
    edges.add(inner.join(frame.select(node="u"), on="node", how="anti").select(u="node", v="sink", work=pl.lit(False)),
              category="waiting", kind="end")
    extra = edges.frame()
    extra = extra.with_columns(ns=times.gather(extra["v"]) - times.gather(extra["u"]))
    frame = pl.concat([frame, extra.filter(pl.col("ns") >= 0)])
    return Graph(times, steps, frame, windows.select("step", "source", "sink"), host, gpu)


def sync_edges(trace: Trace, calls: pl.DataFrame, acts: pl.DataFrame, edges: Edges):
    """Event-wait and sync edges (see the module's docstring)."""
    marks = trace.marks.filter(pl.col("cat") == "cuda_sync").select(
        "sync_kind", pl.col("device").fill_null(0), "stream", "correlation", "wait_on_stream", "wait_on_record")
    waits = marks.filter(pl.col("sync_kind") == "Stream Wait Event")
    waits = waits.filter(pl.col("wait_on_record") >= 0)
    if waits.height:
        found = last_before(acts, waits.select("device", stream="wait_on_stream", record="wait_on_record",
                                               w_stream="stream", w_corr="correlation"), ["device", "stream"], "record")
        found = first_after(acts, found.drop("stream").rename({"w_stream": "stream"}), ["device", "stream"], "w_corr")
        edges.add(found.filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null()).select(
            u="src", v="dst", work=pl.lit(False)), category="waiting", kind="event wait")
    blocking = calls.filter(pl.col("name").is_in(SYNC_APIS)).select(
        end_node=pl.col("event") * 2 + 1, call_corr="correlation", c_start="start", c_end="end", api="name")
    if not blocking.height or not acts.height:
        return
    own = blocking.join(acts.select(call_corr="correlation", src="node_end"), on="call_corr")
    marked = blocking.join(marks.rename({"correlation": "call_corr"}), on="call_corr")
    event = marked.filter((pl.col("sync_kind") == "Event Sync") & (pl.col("wait_on_record") >= 0))
    event = last_before(acts, event.select("end_node", "device", stream="wait_on_stream", record="wait_on_record"),
                        ["device", "stream"], "record")
    stream = marked.filter((pl.col("sync_kind") == "Stream Sync") & (pl.col("stream") >= 0))
    stream = last_before(acts, stream.select("end_node", "device", "stream", "call_corr"), ["device", "stream"],
                         "call_corr")
    lanes = acts.select("device", "stream").unique()
    context = blocking.filter(pl.col("api").str.contains("DeviceSynchronize|CtxSynchronize")).join(lanes, how="cross")
    context = last_before(acts, context.select("end_node", "device", "stream", "call_corr"), ["device", "stream"],
                          "call_corr")
    exact = pl.concat([f.select("end_node", "src") for f in (own, event, stream, context)])
    unknown = blocking.join(exact.select("end_node").unique(), on="end_node", how="anti")
    inferred = (unknown.join_where(acts.select("correlation", "end", src="node_end"),
                                   pl.col("correlation") < pl.col("call_corr"), pl.col("end") <= pl.col("c_end"),
                                   pl.col("end") >= pl.col("c_start"))
                .sort("end").group_by("end_node").agg(pl.col("src").last()))
    edges.add(exact.filter(pl.col("src").is_not_null()).select(u="src", v="end_node", work=pl.lit(False)),
              category="waiting", kind="sync")
    edges.add(inferred.select(u="src", v="end_node", work=pl.lit(False)), category="waiting", kind="sync (inferred)")


def collective_starts(trace: Trace) -> pl.DataFrame:
    """rank, pg, seq, row (into trace.gpu), start_abs (ns on the common clock: start + the
    trace's origin) of every launched collective kernel: the material of `arrivals_of_run`."""
    if not trace.has_gpu:
        return pl.DataFrame(schema={"rank": pl.Int64, "pg": pl.String, "seq": pl.Int64, "row": pl.Int64,
                                    "start_abs": pl.Int64})
    rows = trace.gpu.with_row_index("row").filter(pl.col("category") == "comm").select(
        pl.col("row").cast(pl.Int64), "start", pl.col("stream").fill_null(0), pl.col("device").fill_null(0))
    kernels = collective_kernels(trace).filter(pl.col("seq").is_not_null()).select(
        "pg", "seq", "start", pl.col("stream").fill_null(0), pl.col("device").fill_null(0))
    return (kernels.join(rows, on=["start", "stream", "device"]).unique(["pg", "seq"], keep="first")
            .select(rank=pl.lit(trace.rank, pl.Int64), pg="pg", seq=pl.col("seq").cast(pl.Int64), row="row",
                    start_abs=pl.col("start") + trace.origin_us * 1000))


def arrivals_of_run(starts: list[pl.DataFrame], origins_ns: list[int]) -> list[pl.DataFrame | None]:
    """Per trace of a run: row (into its gpu table), arrival (ns, its own clock), late_rank —
    when the last rank to arrive started the same collective (the (pg, seq)-th of each rank),
    for the collectives this rank entered earlier. None for a run of one trace."""
    if len(starts) < 2:
        return [None] * len(starts)
    together = pl.concat(starts)
    last = together.sort("start_abs").group_by("pg", "seq").agg(
        arrival_abs=pl.col("start_abs").last(), late_rank=pl.col("rank").last(), n=pl.len())
    return [own.join(last.filter(pl.col("n") > 1), on=["pg", "seq"])
            .filter(pl.col("late_rank") != pl.col("rank"))
            .select("row", arrival=pl.col("arrival_abs") - origin, late_rank="late_rank")
            for own, origin in zip(starts, origins_ns)]


def collective_arrivals(traces: list[Trace]) -> list[pl.DataFrame | None]:
    """`arrivals_of_run` of loaded traces."""
    return arrivals_of_run([collective_starts(t) for t in traces], [t.origin_us * 1000 for t in traces])


def dependency_graph(trace: Trace, step: int, arrivals: pl.DataFrame | None = None):
    """(nodes, edges) of one step's graph. nodes: node, time, end (the event's end, else its
    start), table (`host` | `gpu` | `arrival` | `source` | `sink`), name, correlation.
    edges: u, v, ns (Δt), work, category, kind, name, event, row."""
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
    edges = g.edges.filter(g.steps.gather(g.edges["u"]) == step)
    return nodes, edges


def path_edges(trace: Trace, arrivals: pl.DataFrame | None = None) -> pl.DataFrame:
    """The critical path of every step as its edges in time order: step, start, end, ns,
    category, kind, name, event (host event index), row (into trace.gpu). Without arrivals it
    depends on the trace alone, so it is kept with it (`timeline.kept`: a later command on the
    same trace reads it from the trace cache)."""
    if arrivals is None:
        return kept(trace, "critical-path-edges", lambda: heaviest_path_edges(trace, None))
    return heaviest_path_edges(trace, arrivals)


def heaviest_path_edges(trace: Trace, arrivals: pl.DataFrame | None) -> pl.DataFrame:
    """`path_edges`, computed."""
    schema = {"step": pl.Int64, "start": pl.Int64, "end": pl.Int64, "ns": pl.Int64, **EDGE}
    g = graph(trace, arrivals)
    if g.ends.height == 0:
        return pl.DataFrame(schema=schema)
    edges = g.edges
    weight = edges.select(pl.when("work").then("ns").otherwise(0))
    found = heaviest_paths(g.times, edges["u"], edges["v"], weight.to_series(),
                           g.ends["source"].to_list(), g.ends["sink"].to_list())
    chosen = edges[pl.Series("row", [i for _, ids, _ in found for i in ids], pl.Int64)]
    return chosen.select(
        step=g.steps.gather(chosen["u"]), start=g.times.gather(chosen["u"]), end=g.times.gather(chosen["v"]), ns="ns",
        category=pl.when(pl.col("work")).then(pl.col("category")).otherwise(pl.lit("waiting")),
        kind="kind", name="name", event="event", row="row").cast(schema)


def critical_path(trace: Trace, arrivals: pl.DataFrame | None = None, top: int | None = 10) -> pl.DataFrame:
    """One row per step: span_ns, path_ns (the path's weight: its time not waiting), its time
    by category — host_ns, runtime_ns, compute_ns, comm_ns, copy_ns, waiting_ns (they sum to
    span_ns) — and items [{category, kind, name, ns}]: the path's time by what spent it (a
    wait named `<kind>: <what>`), largest first (`top` kept). A step with no events: figures
    null. Without arrivals, kept with the trace like `path_edges`."""
    if arrivals is None:
        whole = kept(trace, "critical-path", lambda: path_split(trace, path_edges(trace)))
    else:
        whole = path_split(trace, path_edges(trace, arrivals))
    return whole.with_columns(pl.col("items").list.head(top)) if top else whole


def path_split(trace: Trace, edges: pl.DataFrame) -> pl.DataFrame:
    """`critical_path` of the trace's path edges (`path_edges`), every item kept."""
    split = (edges.group_by("step").agg(
        span_ns=pl.col("ns").sum(), path_ns=pl.col("ns").filter(pl.col("category") != "waiting").sum(),
        **{f"{c}_ns": pl.col("ns").filter(pl.col("category") == c).sum() for c in CATEGORIES}))
    waiting = pl.col("category") == "waiting"
    named = pl.when(waiting & pl.col("name").is_not_null()).then(pl.format("{}: {}", "kind", "name")) \
        .when(waiting).then(pl.col("kind")).otherwise(pl.col("name"))
    items = (edges.filter(pl.col("ns") > 0).with_columns(name=named).group_by("step", "category", "kind", "name")
             .agg(ns=pl.col("ns").sum()).sort("step", "ns", "name", descending=[False, True, False], nulls_last=True)
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
