"""Domain-free kernels over sorted integer arrays (numpy), and the heaviest paths of a DAG whose
edges go forward in time: what `path_graph.py` builds the critical path's graph and finds its
paths with. Nothing here knows of traces, events or steps."""

from __future__ import annotations

import numpy as np

from tracekit.analyses.timeline import distinct


def first_rows(keys: np.ndarray, top: int) -> np.ndarray:
    """Per value 0 … top - 1: the first row of `keys` holding it; -1 where none does."""
    first = np.full(top, -1)
    first[keys[::-1]] = np.arange(len(keys))[::-1]  # of equal keys, the first row's is written last
    return first


def count_before(table: list[np.ndarray], query: list[np.ndarray], inclusive: bool) -> np.ndarray:
    """For each query row: how many rows of `table` (columns; rows in lexicographic order)
    come before it — compare less (`inclusive`: or equal) — by one sort of both together."""
    n = len(table[0])
    is_query = np.r_[np.zeros(n, bool), np.ones(len(query[0]), bool)]
    order = np.lexsort([is_query if inclusive else ~is_query,
                        *[np.concatenate([t, q]) for t, q in zip(table, query)][::-1]])
    asked = is_query[order]
    found = np.empty(len(query[0]), np.int64)
    found[order[asked] - n] = np.cumsum(~asked)[asked]
    return found


def last_before(groups: list, values, q_groups: list, q_values) -> np.ndarray:
    """For each query: the last row of the table (columns `groups` and `values`, rows in
    lexicographic order) in the query's group whose value is less; -1 when none."""
    j = count_before([*groups, values], [*q_groups, q_values], inclusive=False) - 1
    hit = j >= 0
    for g, q in zip(groups, q_groups):
        hit[hit] &= g[j[hit]] == q[hit]
    return np.where(hit, j, -1)


def first_after(groups: list, values, q_groups: list, q_values) -> np.ndarray:
    """For each query: the first row of the table (as in `last_before`) in the query's group
    whose value is greater; -1 when none."""
    j = count_before([*groups, values], [*q_groups, q_values], inclusive=True)
    hit = j < len(values)
    for g, q in zip(groups, q_groups):
        hit[hit] &= g[j[hit]] == q[hit]
    return np.where(hit, j, -1)


def distinct_runs(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an array of long runs of equal values (the threads of
    boundaries in lane order), by a sort of the runs' values only."""
    return distinct(values[np.r_[True, values[1:] != values[:-1]]]) if len(values) else values


def running_max(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The running maximum of `values` within each run of equal `groups` (a few runs)."""
    out = values.copy()
    cuts = [0, *(np.flatnonzero(groups[1:] != groups[:-1]) + 1), len(values)]
    for a, b in zip(cuts, cuts[1:]):
        out[a:b] = np.maximum.accumulate(values[a:b])
    return out


def packed(*keys: np.ndarray) -> list[np.ndarray]:
    """Integer sort keys (the first key first) as one int64 key of the same order, where their
    ranges fit in 63 bits; else as given."""
    shifted = [k - k.min() if len(k) else k for k in keys]
    bits = [int(k.max(initial=0)).bit_length() for k in shifted]
    if sum(bits) > 63:
        return list(keys)
    key = shifted[0].copy()
    for k, width in zip(shifted[1:], bits[1:]):
        key <<= width
        key |= k
    return [key]


def stable_order(keys: list[np.ndarray]) -> np.ndarray:
    """The rows' stable order by `keys` (the first key first): one sort for one key (half a
    lexsort's time over the keys it packs), else a lexsort."""
    return np.argsort(keys[0], kind="stable") if len(keys) == 1 else np.lexsort(keys[::-1])


def latest_at_depth(started: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per boundary: the latest `started` event (≥ 0) among the boundaries before it, itself
    included, at the same depth; -1 when none."""
    small = -2 ** 15 <= depth.min(initial=0) and depth.max(initial=0) < 2 ** 15
    by_depth = np.argsort(depth.astype(np.int16) if small else depth, kind="stable")  # 16 bits: a radix sort
    values, d = started[by_depth], depth[by_depth]
    fill = np.where((values >= 0) | np.r_[True, d[1:] != d[:-1]], np.arange(len(values)), 0)  # a depth's first row
    np.maximum.accumulate(fill, out=fill)  # stops the fill
    filled = np.empty_like(values)
    filled[by_depth] = values[fill]
    return filled


def pairs(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) for every left[i] == right[j] ≥ 0, in left's order, then right's."""
    order = np.argsort(right, kind="stable")
    keys = right[order]
    lo, hi = np.searchsorted(keys, left, "left"), np.searchsorted(keys, left, "right")
    n = np.where(left >= 0, hi - lo, 0)
    i = np.repeat(np.arange(len(left)), n)
    j = order[np.repeat(lo, n) + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)]
    return i, j


def grouped_sums(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by equal `keys` (≥ 0), in their order: (the first row of each group, the
    group's sum of `values`). Keys in a range no wider than the rows are counted, not sorted."""
    top = int(keys.max(initial=-1)) + 1
    if top <= len(keys):
        first, sums = first_rows(keys, top), np.zeros(top, np.int64)
        np.add.at(sums, keys, values)
        groups = np.flatnonzero(first >= 0)
        return first[groups], sums[groups]
    order = np.argsort(keys, kind="stable")  # timsort: the keys come in long sorted runs
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(order) else order
    return order[starts], np.add.reduceat(values[order], starts) if len(order) else values[:0]


def runs_of(u, v, weight, ends) -> tuple[dict, dict]:
    """A node with one edge in and one out (not in `ends`) only passes its way on, so each run
    of edges through such nodes is one edge of their summed weight (host lanes are mostly
    that). A run is mostly a stretch of consecutive edges (a lane's segments): within a
    stretch, places and weights are running sums; the stretches of a run are chained by
    pointer jumping. (stretches — begin (its first edge, an index into u, v), n (edges), head
    (its run's first edge), before (the run's edges before it) —, runs — head, u, v, w, n).
    Edges on a cycle of such nodes, which nothing reaches, are left out."""
    n = int(max(u.max(initial=-1), v.max(initial=-1), *ends, -1)) + 1
    e = np.arange(len(u))
    through = (np.bincount(v, minlength=n) == 1) & (np.bincount(u, minlength=n) == 1)
    through[list(ends)] = False
    into = first_rows(v, n)  # the first edge into each node
    before = np.where(through[u], into[u], -1)  # the edge before e in its run; -1: e is its first
    begins = (before < 0) | (before != e - 1)
    stretch = np.cumsum(begins) - 1  # each edge's stretch
    begin = np.flatnonzero(begins)  # each stretch's first edge
    end = np.append(begin[1:], len(u))[:len(begin)] - 1  # and its last
    running = np.cumsum(weight)
    done = running[begin] - weight[begin]  # the weight before each stretch

    def upto(x):  # the weight of the stretch of each edge at x up to it, it included
        return running[x] - done[stretch[x]]

    # per stretch: the stretch before it in its run (itself for a run's first), and the edges
    # and weight of all those before it, by pointer jumping
    lead = before[begin]
    parent = np.where(lead >= 0, stretch[np.maximum(lead, 0)], np.arange(len(begin)))
    count = np.where(lead >= 0, (end - begin + 1)[parent], 0)
    gained = np.where(lead >= 0, upto(end)[parent], 0)
    going = np.flatnonzero(parent[parent] != parent)
    for _ in range(64):
        if not len(going):
            break
        up = parent[going]
        count[going] += count[up]
        gained[going] += gained[up]
        parent[going] = parent[up]
        going = going[parent[parent[going]] != parent[going]]
    rooted = lead[parent] < 0  # per stretch: its run has a first edge (it is not on a cycle)
    last = np.flatnonzero(rooted[stretch] & ~through[v])  # each run's last edge
    at = stretch[last]
    head = begin[parent[at]]
    runs = {"head": head, "u": u[head], "v": v[last], "w": gained[at] + upto(last),
            "n": count[at] + last - begin[at] + 1}
    return {"begin": begin[rooted], "n": (end - begin + 1)[rooted], "head": begin[parent][rooted],
            "before": count[rooted]}, runs


def heaviest_paths(times, u, v, weight, sources: list[int], sinks: list[int]) -> list[tuple[list[int], list[int], int]]:
    """For each (source, sink) pair of disconnected parts of one graph: the heaviest path's
    nodes, its edges (indices into u, v) and its weight. times, u, v, weight: integer arrays.

    Over the graph of runs (`runs_of`): every edge goes forward in time, so nodes in time
    order — equal times ordered by how many Δt = 0 edges lead to them — are in topological
    order, and one pass over the edges in their tail's order gives each node its heaviest way
    in (max over its in-edges of that of u + weight) before passing it on. A Δt = 0 cycle (it
    weighs 0) leaves edges that go back in that order: then passes repeat until nothing
    gains. Of equal ways in, the first edge counts."""
    times, u, v, weight = (np.asarray(x, np.int64) for x in (times, u, v, weight))
    stretches, runs = runs_of(u, v, weight, [*sources, *sinks])
    tu, tv = times[runs["u"]], times[runs["v"]]
    tied = np.flatnonzero(tu == tv)
    tied = list(zip(runs["u"][tied].tolist(), runs["v"][tied].tolist()))
    depth = dict.fromkeys((b for _, b in tied), 0)  # the most Δt = 0 edges into a node, in a row (≤ 64)
    for _ in range(64 if tied else 0):
        deeper = False
        for a, b in tied:
            if depth.get(a, 0) + 1 > depth[b] and depth[b] < 64:
                depth[b], deeper = depth.get(a, 0) + 1, True
        if not deeper:
            break
    deep = np.zeros(len(times), np.int64)
    deep[list(depth)] = list(depth.values())
    du, dv = deep[runs["u"]], deep[runs["v"]]
    order = np.lexsort((runs["head"], runs["u"], du, tu))  # by tail: time, then Δt = 0 edges into it
    backward = bool(((tv == tu) & (dv <= du)).any())
    tails, heads, weights = (runs[c][order].tolist() for c in ("u", "v", "w"))
    best, before = [-1] * len(times), [-1] * len(times)  # heaviest way in from a source (-1: none), its edge
    for source in sources:
        best[source] = 0
    gained = True
    while gained:
        gained = False
        for e, tail, to, w in zip(range(len(tails)), tails, heads, weights):
            way = best[tail]
            if way >= 0 and way + w > best[to]:
                best[to], before[to], gained = way + w, e, backward
    back, walked = [], [0]  # the paths' runs (places in `order`) from sink to source, the last path first
    for source, sink in zip(sources[::-1], sinks[::-1]):
        node = sink if best[sink] >= 0 else source
        while node != source:
            e = before[node]
            back.append(e)
            node = tails[e]
        walked.append(len(back))
    # lay each path's runs out edge by edge: a stretch's edges go where its run's place on the
    # path and the run's edges before it say
    runs_on = np.array(back[::-1], np.int64)  # each path from source to sink, in the sources' order
    n = runs["n"][order][runs_on]
    start = np.full(len(u), -1)  # per run on a path, by its first edge: the place of that edge
    start[runs["head"][order][runs_on]] = np.cumsum(n) - n
    place = start[stretches["head"]]
    on = place >= 0
    length, first, place = stretches["n"][on], stretches["begin"][on], place[on] + stretches["before"][on]
    inside = np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
    laid = np.empty(int(n.sum()), np.int64)
    laid[np.repeat(place, length) + inside] = np.repeat(first, length) + inside
    cuts = np.r_[0, np.cumsum(n)][len(back) - np.array(walked[::-1])]  # where each path's edges begin
    found = []
    for k, (source, sink) in enumerate(zip(sources, sinks)):
        ids = laid[cuts[k]:cuts[k + 1]]
        found.append((np.r_[source, v[ids]], ids, best[sink]) if best[sink] >= 0 else ([], ids[:0], 0))
    return found
