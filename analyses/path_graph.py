"""The critical path's dependency graph, as numpy arrays.

What the graph holds is defined in `critical_path.py`; this module builds it, with the
domain-free kernels of `sorted_arrays.py`, whose `heaviest_paths` finds its paths. Both are
imported only when a path is computed, so that a command reading the kept path from the trace
cache does not import numpy (as `timeline.py` does).

Nodes are integers: host event i (row of `critical_path.host_events`) has its start at 2i and
its end at 2i + 1; device activity j (row of `device_events`) follows at 2·n_host + 2j and
+ 1; then one node per collective split at its arrival; then each step's source and sink.
An edge is (u, v, code): `code` indexes `KINDS` (its category, kind and whether it is work,
weighing its Δt), `event` is the host event whose self time it is (-1: none), `row` the device
activity's row in `trace.gpu` (-1: none). Names are not carried: they are read from the host
and device tables for the edges of the path only (`critical_path.edge_table`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analyses.sorted_arrays import (distinct_runs, first_after, first_rows, last_before, latest_at_depth,
                                             packed, pairs, running_max, stable_order)
from tracekit.analyses.timeline import SYNC_APIS
from tracekit.core.model import ENGINE, Trace

# (category, kind, work, where the edge's name comes from: the host event, the device row, none)
KINDS = (
    ("waiting", "thread idle", False, None), ("waiting", "blocked", False, "event"),
    ("waiting", "other thread", False, "event"), ("runtime", "self", True, "event"),
    ("host", "ops not recorded", True, "event"), ("host", "self", True, "event"),
    ("waiting", "thread order", False, None),
    ("compute", "device", True, "row"), ("comm", "device", True, "row"), ("copy", "device", True, "row"),
    ("waiting", "collective arrival", False, "row"),
    ("waiting", "stream order", False, None), ("waiting", "launch", False, None),
    ("waiting", "event wait", False, None), ("waiting", "sync", False, None),
    ("waiting", "sync (inferred)", False, None), ("waiting", "start", False, None), ("waiting", "end", False, None),
    ("waiting", "stream gap, launch not recorded", False, None), ("waiting", "hand-off", False, None),
    ("waiting", "event wait (inferred)", False, None), ("waiting", "carried-over work", False, "row"),
)
CODE = {(category, kind): code for code, (category, kind, _, _) in enumerate(KINDS)}
WORK = np.array([work for _, _, work, _ in KINDS])
NAMED = np.array([{"event": 1, "row": 2}.get(source, 0) for *_, source in KINDS])  # 1: a host name, 2: a device name
GPU_CODE = {"comm": CODE["comm", "device"], "memcpy": CODE["copy", "device"], "memset": CODE["copy", "device"]}
OP, ANNOTATION, CALL, NO_OWNER = 0, 1, 2, 3  # host event kinds; a segment of no event
DEVICE_SYNC_APIS = [api for api in SYNC_APIS if "DeviceSynchronize" in api or "CtxSynchronize" in api]  # every stream
NONE = np.iinfo(np.int64).min


@dataclass
class Graph:
    """Every step's graph in one: `times[n]` (ns) and `steps[n]` of node n; edges u, v, ns
    (Δt ≥ 0), code, event, row (no edge between two steps); per step its source and sink
    (`ends`: step, source, sink); the host and device tables the nodes index; `late`: row →
    late_rank of the split collectives."""

    times: np.ndarray
    steps: np.ndarray
    u: np.ndarray
    v: np.ndarray
    ns: np.ndarray
    code: np.ndarray
    event: np.ndarray
    row: np.ndarray
    ends: pl.DataFrame
    host: pl.DataFrame
    gpu: pl.DataFrame
    late: pl.DataFrame

    @property
    def weight(self) -> np.ndarray:
        """What each edge weighs: its Δt for work, else 0."""
        return np.where(WORK[self.code], self.ns, 0)

    def name_key(self, ids: np.ndarray) -> np.ndarray:
        """Per edge at `ids`, an integer (≥ 0) for its name: equal names, equal integers; a
        collective's wait for its last rank, whose name tells that rank, has one of its own."""
        host, gpu = self.host["#name_id"].to_numpy(), self.gpu["#name_id"].to_numpy()
        top = 1 + max(host.max(initial=0), gpu.max(initial=0))
        at, named = self.name_at(ids), NAMED[self.code[ids]]
        key = np.where(named == 1, host[np.clip(at, 0, max(len(host) - 1, 0))] if len(host) else 0, 0)
        device = np.flatnonzero(named == 2)
        key[device] = gpu[at[device] - len(host)]
        arrival = device[self.code[ids[device]] == CODE["waiting", "collective arrival"]]
        key[arrival] = top + at[arrival] - len(host)
        return key

    def name_at(self, ids: np.ndarray) -> np.ndarray:
        """Where the name of each edge at `ids` is in the host names followed by the device
        names (`KINDS`); -1: it has none."""
        named = NAMED[self.code[ids]]
        at = np.where(named == 1, self.event[ids], -1)
        device = np.flatnonzero(named == 2)
        at[device] = self.host.height + np.searchsorted(self.gpu["row"].to_numpy(), self.row[ids[device]])
        return at


class Edges:
    """Edges gathered as arrays, in the order added (of equal ways into a node, the pass
    keeps the first edge: the order is part of the definition); an edge that goes back in
    time (clock skew) or from one step to another is left out."""

    def __init__(self, times: np.ndarray, steps: np.ndarray):
        self.times, self.steps = times, steps
        self.parts: list[tuple] = []

    def add(self, u, v, code, event=-1, row=-1, checked=True):
        """`checked=False`: forward within a step by construction, not tested."""
        u, v, code, event, row = (np.broadcast_to(np.asarray(x, np.int64), len(u)) for x in (u, v, code, event, row))
        if checked:
            keep = (self.times[v] >= self.times[u]) & (self.steps[u] == self.steps[v])
            u, v, code, event, row = u[keep], v[keep], code[keep], event[keep], row[keep]
        self.parts.append((u, v, code, event, row))

    def recode(self, events: np.ndarray, rows: np.ndarray, old: int, new: int):
        """Edges of code `old` whose event is one of `events` get code `new` and that event's
        row of `rows`."""
        order = np.argsort(events)
        for k, (u, v, code, event, row) in enumerate(self.parts):
            hit = (code == old) & np.isin(event, events)
            if hit.any():
                code, row = code.copy(), row.copy()
                code[hit], row[hit] = new, rows[order[np.searchsorted(events[order], event[hit])]]
                self.parts[k] = (u, v, code, event, row)

    def degrees(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(edges into, edges out of) each of the first n nodes."""
        return (sum((np.bincount(v, minlength=n)[:n] for _, v, *_ in self.parts), np.zeros(n, np.int64)),
                sum((np.bincount(u, minlength=n)[:n] for u, *_ in self.parts), np.zeros(n, np.int64)))

    def arrays(self) -> tuple:
        """(u, v, code, event, row), the parts given up."""
        parts, self.parts = self.parts, []
        if not parts:
            return tuple(np.zeros(0, np.int64) for _ in range(5))
        return tuple(np.concatenate([part[i] for part in parts]) for i in range(5))


def numbers(frame: pl.DataFrame | pl.LazyFrame, *columns: str, **more: pl.Expr) -> list[np.ndarray]:
    """Integer columns as int64 arrays (null → -1), then the columns of `more` (name →
    expression), from one query."""
    frame = frame.lazy().select(pl.col(*columns).fill_null(-1).cast(pl.Int64), **more).collect(engine=ENGINE)
    return [frame[c].to_numpy() for c in (*columns, *more)]


def with_arrays(frame: pl.LazyFrame, ints: tuple, **more: pl.Expr) -> tuple[pl.DataFrame, list[np.ndarray]]:
    """(the table, with columns `#<name>` added: `ints` as int64 (null → -1), then `more` (name
    → expression); those columns as arrays), from one query."""
    table = frame.with_columns(*[pl.col(c).fill_null(-1).cast(pl.Int64).alias(f"#{c}") for c in ints],
                               **{f"#{c}": e for c, e in more.items()}).collect(engine=ENGINE)
    return table, [table[f"#{c}"].to_numpy() for c in (*ints, *more)]


def name_ids() -> pl.Expr:
    """An integer per name (equal names, equal integers; > 0, no name: 0)."""
    return pl.col("name").cast(pl.Categorical).to_physical().cast(pl.Int64).fill_null(-1) + 1


TABLE_COLUMNS = ("name", "correlation", "#name_id")  # what a graph reads of its events' tables (`Graph`)


class Events:
    """The host events (`critical_path.host_events`; `table`: their `TABLE_COLUMNS`) as
    arrays: step, tid, start, end, correlation (-1: none), kind (OP, ANNOTATION, CALL), sync (a
    blocking call, `timeline.SYNC_APIS`), device_sync (it waits for every stream), name_id."""

    def __init__(self, host: pl.LazyFrame):
        kind = pl.col("kind")
        self.table, (self.step, self.tid, self.start, self.end, self.correlation, self.kind,
                     self.name_id) = with_arrays(
            host, ("step", "tid", "start", "end", "correlation"),
            kind=pl.when(kind == "op").then(OP).when(kind == "call").then(CALL).otherwise(ANNOTATION),
            name_id=name_ids())
        self.sync = named_in(self.table["name"], self.name_id, SYNC_APIS)
        self.device_sync = (self.kind == CALL) & named_in(self.table["name"], self.name_id, DEVICE_SYNC_APIS)
        self.table = self.table.select(TABLE_COLUMNS)  # the arrays hold the rest


def named_in(names: pl.Series, ids: np.ndarray, among) -> np.ndarray:
    """Per row: whether its name (of integer `ids`, `name_ids`) is one of `among`, testing each
    distinct name once (a trace's events have a few hundred)."""
    first = first_rows(ids, int(ids.max(initial=0)) + 1)
    present = np.flatnonzero(first >= 0)
    found = np.zeros(len(first), bool)
    found[present] = names.gather(first[present]).is_in(among).fill_null(False).to_numpy()
    return found[ids]


def host_lanes(h: Events, edges: Edges, unrecorded: bool):
    """Adds host-order and thread-order edges. `unrecorded`: the trace holds no CPU ops, so an
    annotation's self time is host work of kind `ops not recorded`."""
    node = lane_order(h)
    event, is_start = node // 2, node % 2 == 0
    b = {"node": node, "step": h.step[event], "tid": h.tid[event],
         "time": np.where(is_start, h.start[event], h.end[event]), "start": is_start}
    # each lane (step, tid) opens and closes every event it holds, so the running depth over
    # all lanes is each lane's own; the event open innermost after a boundary is the latest
    # start at its depth (none at depth 0)
    depth = np.cumsum(np.where(is_start, 1, -1))
    owner = latest_at_depth(np.where(is_start, event, -1), depth)
    owner[depth <= 0] = -1
    segment = np.flatnonzero((b["step"][1:] == b["step"][:-1]) & (b["tid"][1:] == b["tid"][:-1]))
    own = owner[segment]
    kind = np.where(own >= 0, h.kind[own], NO_OWNER)
    # a segment's kind by its owner's; then an annotation's while another thread runs an op,
    # and a blocking call's, are waiting
    by_kind = [CODE["host", "self"], CODE["host", "ops not recorded" if unrecorded else "self"], CODE["runtime", "self"],
               CODE["waiting", "thread idle"]]
    code = np.array(by_kind)[kind]
    by_time = TimeOrder(b)
    annotation = np.flatnonzero(kind == ANNOTATION)
    code[annotation[busy_elsewhere(b, segment[annotation], h, by_time)]] = CODE["waiting", "other thread"]
    code[(own >= 0) & h.sync[own]] = CODE["waiting", "blocked"]
    edges.add(node[segment], node[segment + 1], code, event=own, checked=False)
    thread_order(b, depth, by_time, edges)
    waited = segment[code == CODE["waiting", "other thread"]]
    edges.add(*hand_offs(b, waited, h), CODE["waiting", "hand-off"])


def lane_order(h: Events) -> np.ndarray:
    """The boundaries (node 2i: event i's start, 2i + 1: its end) by step, thread and time; at
    one time ends (inner first), then zero-length events, then starts (outer first); then by
    node."""
    is_start = np.tile([True, False], len(h.start))
    key = np.where(np.repeat(h.start == h.end, 2), 1, np.where(is_start, 2, 0))
    time = np.column_stack([h.start, h.end]).ravel()
    tids = distinct_runs(h.tid)
    lane = (h.step - h.step.min()) * len(tids) + np.searchsorted(tids, h.tid)  # by step, then thread
    keys = packed(np.repeat(lane, 2), time, key)
    order = stable_order(keys)  # then by node
    # boundaries equal in all four are few (times are in ns), so only they are sorted by the
    # tie — the other bound, latest first — which over every boundary would cost 4x the sort above
    ordered = [k[order] for k in keys]
    same = np.r_[False, np.logical_and.reduce([k[1:] == k[:-1] for k in ordered])]  # as the one before
    tied = same | np.r_[same[1:], False]
    if tied.any():
        sub = order[tied]
        tie = -np.where(sub % 2 == 0, h.end[sub // 2], h.start[sub // 2])
        order[tied] = sub[np.lexsort((tie, np.cumsum(~same)[tied]))]
    return order


class TimeOrder:
    """The boundaries (`host_lanes`) in time order within each step, ties in lane order:
    `order` (lane positions), `place` (each lane position's place in it), `times` (the places
    where a new step or time begins)."""

    def __init__(self, b: dict):
        self.order = np.lexsort((b["time"], b["step"]))
        n = len(self.order)
        self.place = np.empty(n, np.int64)
        self.place[self.order] = np.arange(n)
        step, time = b["step"][self.order], b["time"][self.order]
        self.times = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (time[1:] != time[:-1])])

    def first(self, places: np.ndarray) -> np.ndarray:
        """Per place: the first place of its step and time."""
        return self.times[np.searchsorted(self.times, places, "right") - 1]

    def last(self, places: np.ndarray) -> np.ndarray:
        """Per place: the last place of its step and time."""
        return np.append(self.times, len(self.order))[np.searchsorted(self.times, places, "right")] - 1


def busy_elsewhere(b: dict, segment: np.ndarray, h: Events, t: TimeOrder) -> np.ndarray:
    """For annotation segments (lane positions): whether another thread runs a CPU op during
    it — one of its step's ops on another thread starts before the segment ends and ends
    after it starts (the thread waits on it, e.g. the main thread during backward)."""
    event = b["node"][t.order] // 2
    op_start = b["start"][t.order] & (h.kind[event] == OP)
    ops = event[op_start]  # the ops by start, in time order
    step, tid, end = h.step[ops], h.tid[ops], h.end[ops]
    # the last op started before the segment's end (its place among `ops`; -1: none)
    until = t.first(t.place[segment + 1])  # the first place at the segment's end
    j = np.where(until > 0, np.cumsum(op_start)[until - 1] - 1, -1)
    s_tid, s_step = b["tid"][segment], b["step"][segment]
    busy = np.zeros(len(segment), bool)
    for thread in distinct_runs(s_tid):  # few threads
        reach = running_max(np.where(tid != thread, end, NONE), step)  # the latest end of the step's other ops so far
        mine = np.flatnonzero((s_tid == thread) & (j >= 0))
        mine = mine[step[j[mine]] == s_step[mine]]
        busy[mine] = reach[j[mine]] > b["time"][segment[mine]]
    return busy


def thread_order(b: dict, depth: np.ndarray, t: TimeOrder, edges: Edges):
    """A thread's top-level event starts after the latest boundary of any other thread of its
    step at or before it (of several at one time, the last in lane order)."""
    tid = b["tid"][t.order]
    runs = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1]])  # the places where a thread's run begins
    top = np.flatnonzero(b["start"] & (depth == 1))  # lane positions of top-level starts (few)
    top = top[np.argsort(t.place[top], kind="stable")]  # in time order
    at = t.last(t.place[top])  # the last place at its time
    # the last place there or before of another thread: that one, or the one before its run
    j = np.where(tid[at] != b["tid"][top], at, runs[np.searchsorted(runs, at, "right") - 1] - 1)
    found = j >= 0
    found[found] = b["step"][t.order[j[found]]] == b["step"][top[found]]
    edges.add(b["node"][t.order[j[found]]], b["node"][top[found]], CODE["waiting", "thread order"], checked=False)


def hand_offs(b: dict, waited: np.ndarray, h: Events) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of the hand-off edges: a thread that waited on another (`other thread`
    segments, lane positions) resumes after the latest end, at or before it resumes, of a CPU
    op of its step on another thread that ended within the wait (backward's last op on the
    autograd thread → the main thread's optimizer)."""
    ops = np.flatnonzero(h.kind == OP)
    src, dst = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for thread in distinct_runs(b["tid"][waited]):  # few threads
        mine, others = waited[b["tid"][waited] == thread], ops[h.tid[ops] != thread]
        others = others[np.lexsort((h.end[others], h.step[others]))]
        resume = mine + 1
        j = last_before([h.step[others]], h.end[others], [b["step"][resume]], b["time"][resume] + 1)
        found = j >= 0
        found[found] = h.end[others[j[found]]] > b["time"][mine[found]]
        src.append(2 * others[j[found]] + 1)
        dst.append(b["node"][resume[found]])
    return np.concatenate(src), np.concatenate(dst)


class Activities:
    """The device activities (`critical_path.device_events`; `table`: their row and
    `TABLE_COLUMNS`) as arrays: row, step, device, stream, start, end, correlation (-1: none), code
    (of their work), name_id, node_start, node_end."""

    def __init__(self, gpu: pl.LazyFrame, base: int):
        self.table, (self.row, self.step, self.device, self.stream, self.start, self.end, self.correlation, self.code,
                     self.name_id) = with_arrays(
            gpu, ("row", "step", "device", "stream", "start", "end", "correlation"),
            code=pl.col("category").replace_strict(GPU_CODE, default=CODE["compute", "device"], return_dtype=pl.Int64),
            name_id=name_ids())
        self.table = self.table.select("row", *TABLE_COLUMNS)
        self.node_start = base + 2 * np.arange(len(self.row), dtype=np.int64)
        self.node_end = self.node_start + 1

    def last_before(self, device, stream, correlation) -> np.ndarray:
        """Per key: the end node of the last activity on (device, stream) launched before
        `correlation`; -1 when none."""
        return self.beside(last_before, self.node_end, device, stream, correlation)

    def first_after(self, device, stream, correlation) -> np.ndarray:
        """Per key: the start node of the first activity on (device, stream) launched after
        `correlation`; -1 when none."""
        return self.beside(first_after, self.node_start, device, stream, correlation)

    def beside(self, find, nodes, device, stream, correlation) -> np.ndarray:
        """`nodes` of the activity `find` (`last_before` or `first_after`) picks per key among the
        launched ones on (device, stream); -1 when none."""
        known = self.launched
        j = find([self.device[known], self.stream[known]], self.correlation[known], [device, stream], correlation)
        return np.where((j >= 0) & (correlation >= 0), nodes[known[j]], -1) if len(known) else j

    @functools.cached_property
    def launched(self) -> np.ndarray:
        """The activities with a correlation id, by (device, stream, correlation)."""
        known = np.flatnonzero(self.correlation >= 0)
        return known[np.lexsort((self.correlation[known], self.stream[known], self.device[known]))]


def device_lanes(acts: Activities, split: dict, edges: Edges, gap: int = CODE["waiting", "stream order"]):
    """Device work (start → end, or start → arrival → end for a split collective) and
    stream order (an activity's end → the next one's start on its stream, of kind `gap`)."""
    mid = np.full(len(acts.row), -1)
    mid[split["at"]] = split["node"]
    whole = mid < 0
    edges.add(acts.node_start[whole], acts.node_end[whole], acts.code[whole], row=acts.row[whole])
    edges.add(acts.node_start[~whole], mid[~whole], CODE["waiting", "collective arrival"], row=acts.row[~whole])
    edges.add(mid[~whole], acts.node_end[~whole], CODE["comm", "device"], row=acts.row[~whole])
    lane = np.lexsort((acts.end, acts.start, acts.stream, acts.device, acts.step))
    same = ((acts.step[lane][1:] == acts.step[lane][:-1]) & (acts.device[lane][1:] == acts.device[lane][:-1])
            & (acts.stream[lane][1:] == acts.stream[lane][:-1]))
    edges.add(acts.node_end[lane[:-1][same]], acts.node_start[lane[1:][same]], gap)


def sync_edges(trace: Trace, h: Events, acts: Activities, edges: Edges):
    """Launch, event-wait and sync edges (see `critical_path.py`)."""
    calls = np.flatnonzero(h.kind == CALL)
    i, j = pairs(h.correlation[calls], acts.correlation)
    edges.add(2 * calls[i], acts.node_start[j], CODE["waiting", "launch"])
    stream, corr, on, record, start, device, kind = numbers(
        trace.marks.lazy().filter(pl.col("cat") == "cuda_sync"), "stream", "correlation", "wait_on_stream",
        "wait_on_record", "start", device=pl.col("device").fill_null(0).cast(pl.Int64), kind=pl.col("sync_kind"))
    wait = np.flatnonzero((kind == "Stream Wait Event") & (record >= 0))
    if len(wait):
        src = acts.last_before(device[wait], on[wait], record[wait])
        dst = acts.first_after(device[wait], stream[wait], corr[wait])
        both = (src >= 0) & (dst >= 0)
        edges.add(src[both], dst[both], CODE["waiting", "event wait"])
    blind = np.flatnonzero((kind == "Stream Wait Event") & (record < 0) & (stream >= 0))
    if len(blind) and len(acts.row):
        edges.add(*inferred_waits(device[blind], stream[blind], corr[blind], start[blind], acts),
                  CODE["waiting", "event wait (inferred)"])
    blocking = calls[h.sync[calls]]
    if not (len(blocking) and len(acts.row)):
        return
    b_corr, b_end = h.correlation[blocking], 2 * blocking + 1
    i, j = pairs(b_corr, acts.correlation)  # a synchronous copy waits for its own copy
    found = [(b_end[i], acts.node_end[j])]
    i, m = pairs(b_corr, corr)  # the call's cuda_sync records
    event = (kind[m] == "Event Sync") & (record[m] >= 0)
    found.append((b_end[i][event], acts.last_before(device[m][event], on[m][event], record[m][event])))
    told = (kind[m] == "Event Sync") & (record[m] < 0) & (on[m] >= 0)  # no record id, but the event's stream
    found.append((b_end[i][told], acts.last_before(device[m][told], on[m][told], b_corr[i][told])))
    synced = (kind[m] == "Stream Sync") & (stream[m] >= 0)
    found.append((b_end[i][synced], acts.last_before(device[m][synced], stream[m][synced], b_corr[i][synced])))
    every = blocking[h.device_sync[blocking]]  # waits for the last activity of every stream
    order = np.lexsort((acts.stream, acts.device))
    device_of, stream_of = acts.device[order], acts.stream[order]
    lane = np.r_[True, (device_of[1:] != device_of[:-1]) | (stream_of[1:] != stream_of[:-1])]  # the streams
    d = np.repeat(every, lane.sum())
    found.append((2 * d + 1, acts.last_before(np.tile(device_of[lane], len(every)),
                                              np.tile(stream_of[lane], len(every)), h.correlation[d])))
    dst, src = (np.concatenate(c) for c in zip(*found))
    edges.add(src[src >= 0], dst[src >= 0], CODE["waiting", "sync"])
    unknown = blocking[~np.isin(b_end, dst)]  # no record found, not even one that led nowhere
    inferred = inferred_syncs(unknown, h, acts)
    edges.add(*inferred, CODE["waiting", "sync (inferred)"])
    carried_over(np.concatenate([src[src >= 0], inferred[0]]), np.concatenate([dst[src >= 0], inferred[1]]), h,
                 acts, edges)


def carried_over(src: np.ndarray, dst: np.ndarray, h: Events, acts: Activities, edges: Edges):
    """Blocking calls (sync edges src → dst, the call's end) that wait on work an earlier step
    left running: the awaited activity (the latest-ending of its sources) is of an earlier step,
    or is queued on a stream whose last activity of an earlier step ends after the call starts.
    Their blocked time is `carried-over work`, named for that earlier activity (the awaited
    one, or its stream's; an edge from one step to another is left out of the graph)."""
    last = np.lexsort((edges.times[src], dst))
    last = last[np.r_[dst[last][1:] != dst[last][:-1], True]] if len(last) else last  # per call, its latest
    awaited, call = (src[last] - acts.node_start[0]) // 2 if len(last) else last, dst[last] // 2
    order = np.lexsort((acts.end, acts.step, acts.stream, acts.device))
    j = last_before([acts.device[order], acts.stream[order]], acts.step[order],
                    [acts.device[awaited], acts.stream[awaited]], h.step[call])
    before = np.where(j >= 0, order[np.maximum(j, 0)], -1)  # its stream's last activity of an earlier step
    itself = acts.step[awaited] < h.step[call]
    held = itself | ((before >= 0) & (acts.end[np.maximum(before, 0)] > h.start[call]))
    named = np.where(itself, awaited, before)[held]
    edges.recode(call[held], acts.row[named], CODE["waiting", "blocked"], CODE["waiting", "carried-over work"])


def inferred_waits(device, stream, corr, start, acts: Activities) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) for `cudaStreamWaitEvent`s whose record carries no event record id: dst, the
    first activity launched on the waiting stream after the call; src, the activity on another
    stream of the device, launched before the call, whose end is the latest from the call's
    start to dst's start — the recorded work must end before the waiting stream goes on, and
    the one that ends last is the one that can have held it (a wait that held nothing, its
    event already done at the call, gets none)."""
    dst = acts.first_after(device, stream, corr)
    k = np.flatnonzero(dst >= 0)
    at = (dst[k] - acts.node_start[0]) // 2 if len(k) else k
    by_end = np.argsort(acts.end, kind="stable")
    lo, hi = np.searchsorted(acts.end[by_end], start[k], "left"), np.searchsorted(acts.end[by_end], acts.start[at], "right")
    found = np.full(len(k), -1)

    def fits(a, w):
        return ((acts.device[a] == device[w]) & (acts.stream[a] != stream[w]) & (acts.correlation[a] >= 0)
                & (acts.correlation[a] < corr[w]))

    pending, place = np.arange(len(k)), hi - 1  # each wait's window scanned from its latest end back
    for _ in range(4):  # most find theirs within a few activities, all at once
        pending, place = pending[place >= lo[pending]], place[place >= lo[pending]]
        a = by_end[place]
        ok = fits(a, k[pending])
        found[pending[ok]] = a[ok]
        pending, place = pending[~ok], place[~ok] - 1
    for p, last in zip(pending.tolist(), place.tolist()):  # the few left, one by one
        a = by_end[lo[p]:last + 1]
        ok = np.flatnonzero(fits(a, k[p]))
        found[p] = a[ok[-1]] if len(ok) else -1
    held = found >= 0
    return acts.node_end[found[held]], dst[k[held]]


def inferred_syncs(calls: np.ndarray, h: Events, acts: Activities) -> tuple[np.ndarray, np.ndarray]:
    """(src, call end node) for blocking calls without a `cuda_sync` record: the activity
    launched before the call whose end is the latest within it (few calls)."""
    by_end = np.argsort(acts.end, kind="stable")
    ends, launched = acts.end[by_end], acts.correlation[by_end]
    lo, hi = np.searchsorted(ends, h.start[calls], "left"), np.searchsorted(ends, h.end[calls], "right")
    src, dst = [], []
    for call, a, b, before in zip(calls.tolist(), lo.tolist(), hi.tolist(), h.correlation[calls].tolist()):
        inside = np.flatnonzero((launched[a:b] >= 0) & (launched[a:b] < before))  # ended within it, launched before
        if len(inside):
            src.append(acts.node_end[by_end[a + inside[-1]]])
            dst.append(2 * call + 1)
    return np.array(src, np.int64), np.array(dst, np.int64)


def windows(trace: Trace, host_steps: np.ndarray, acts: Activities, first: int) -> dict:
    """Per step with events: step, begin, finish (ns: its CPU window, stretched to the end of its
    last device activity; a step without host events: its device span), source, sink (nodes
    from `first`)."""
    step, cpu_start, cpu_end = numbers(trace.steps.lazy().sort("step"), "step", "cpu_start", "cpu_end")
    k = np.minimum(np.searchsorted(step, acts.step), max(len(step) - 1, 0))
    ours = step[k] == acts.step if len(step) else np.zeros(0, bool)
    g_start, g_end = np.full(len(step), np.iinfo(np.int64).max), np.full(len(step), NONE)
    np.minimum.at(g_start, k[ours], acts.start[ours])
    np.maximum.at(g_end, k[ours], acts.end[ours])
    has_host, has_gpu = np.isin(step, host_steps), np.bincount(k[ours], minlength=len(step)) > 0
    keep = has_host | has_gpu
    begin = np.where(has_host, cpu_start, g_start)
    finish = np.where(has_host, np.maximum(cpu_end, g_end), g_end)
    source = first + 2 * np.arange(keep.sum())
    return {"step": step[keep], "begin": begin[keep], "finish": finish[keep], "source": source, "sink": source + 1}


def collective_splits(acts: Activities, arrivals: pl.DataFrame | None, first: int) -> dict:
    """The collectives whose last rank arrived after they started: at (index into acts), node
    (from `first`), arrival (ns), late_rank."""
    none = {"at": np.zeros(0, np.int64), "node": np.zeros(0, np.int64), "arrival": np.zeros(0, np.int64),
            "late_rank": np.zeros(0, np.int64)}
    if arrivals is None or not len(acts.row):
        return none
    row, arrival, late = numbers(arrivals, "row", "arrival", "late_rank")
    at, k = pairs(acts.row, row)
    keep = (arrival[k] > acts.start[at]) & (arrival[k] < acts.end[at])
    at, k = at[keep], k[keep]
    return {"at": at, "node": first + np.arange(len(at)), "arrival": arrival[k], "late_rank": late[k]}


def nodes_of(host: pl.LazyFrame, gpu: pl.LazyFrame, steps: pl.DataFrame) -> tuple[Events, Activities]:
    """The host events and device activities of the graph, the same with or without a run's
    collective arrivals (`build` only reads them). A host event that outlasts its step's span
    (a Python frame that ends in the next step, as `profiler.step()`'s does) ends with it."""
    h = Events(host)
    acts = Activities(gpu, 2 * len(h.step))
    step, cpu_end = numbers(steps.lazy().sort("step"), "step", "cpu_end")
    if len(step) and len(h.step):
        k = np.minimum(np.searchsorted(step, acts.step), len(step) - 1)
        finish = cpu_end.copy()
        np.maximum.at(finish, k, np.where(step[k] == acts.step, acts.end, NONE))
        i = np.minimum(np.searchsorted(step, h.step), len(step) - 1)
        h.end = np.where(step[i] == h.step, np.minimum(h.end, finish[i]), h.end)
    return h, acts


def build(trace: Trace, h: Events, acts: Activities, arrivals: pl.DataFrame | None) -> Graph:
    """The graph of every step (`critical_path.graph`) from its host events and device
    activities (`nodes_of`)."""
    unrecorded = not (trace.ops["cat"] == "cpu_op").any()  # a lean capture: calls, but no CPU ops
    n_nodes = 2 * len(h.step) + 2 * len(acts.row)
    split = collective_splits(acts, arrivals, n_nodes)
    n_nodes += len(split["at"])
    ends = windows(trace, distinct_runs(h.step), acts, n_nodes)
    times = np.concatenate([np.column_stack([h.start, h.end]).ravel(), np.column_stack([acts.start, acts.end]).ravel(),
                            split["arrival"], np.column_stack([ends["begin"], ends["finish"]]).ravel()])
    steps = np.concatenate([np.repeat(h.step, 2), np.repeat(acts.step, 2), acts.step[split["at"]],
                            np.repeat(ends["step"], 2)])
    edges = Edges(times, steps)
    if len(h.step):
        host_lanes(h, edges, unrecorded)
    # a device-only capture (no runtime call, `critical_path.graph`): a gap on a stream waited
    # for a launch or for another stream, which the trace does not tell apart
    device_lanes(acts, split, edges, CODE["waiting", "stream gap, launch not recorded"] if trace.calls.height == 0
                 else CODE["waiting", "stream order"])
    if len(h.step):
        sync_edges(trace, h, acts, edges)
    # S → a node nothing else leads to, a node that leads nowhere → T: any other S or T edge
    # would weigh 0 beside a path through real edges weighing ≥ 0, so it could not be heavier
    e_step = ends["step"]
    k = np.minimum(np.searchsorted(e_step, steps[:n_nodes]), max(len(e_step) - 1, 0))
    inner = np.flatnonzero(e_step[k] == steps[:n_nodes]) if len(e_step) else np.zeros(0, np.int64)
    into, out = edges.degrees(n_nodes)
    first, last = inner[into[inner] == 0], inner[out[inner] == 0]
    edges.add(ends["source"][k[first]], first, CODE["waiting", "start"])
    edges.add(last, ends["sink"][k[last]], CODE["waiting", "end"])
    u, v, code, event, row = edges.arrays()
    late = pl.DataFrame({"row": acts.row[split["at"]], "late_rank": split["late_rank"]})
    return Graph(times, steps, u, v, times[v] - times[u], code, event, row,
                 pl.DataFrame({c: ends[c] for c in ("step", "source", "sink")}), h.table, acts.table, late)

