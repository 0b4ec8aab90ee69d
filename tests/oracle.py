"""A brute-force reference for the timeline's definitions (docs/metrics.md): it walks every
elementary interval (between consecutive start/end times of any event) of every (device,
step) span of a small trace and decides each one on its own, with plain Python over the
trace's rows — no sweeping or interval algebra.

It knows nothing of tracekit's analyses; it reads only the loaded tables (`trace.gpu`,
`trace.calls`, `trace.ops`), whose loading has tests of its own.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction

PRIORITY = ("compute", "comm", "memcpy", "memset")
SYNCS = {"cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cuEventSynchronize",
         "cuStreamSynchronize", "cuCtxSynchronize", "hipEventSynchronize", "hipStreamSynchronize",
         "hipDeviceSynchronize", "cudaMemcpy", "hipMemcpy", "hipMemcpyWithStream"}


def covers(row, t) -> bool:
    return row["start"] <= t < row["end"]


def outermost(rows):
    """The rows no other row of their thread contains (of two with the same bounds, the later
    in the trace is the one inside)."""
    return [r for i, r in enumerate(rows)
            if not any(o["tid"] == r["tid"] and j != i and o["start"] <= r["start"] and o["end"] >= r["end"]
                       and (o["start"], -o["end"], j) < (r["start"], -r["end"], i) for j, o in enumerate(rows))]


def outermost_cover(rows, t):
    """Among outermost rows covering time t, the last to start; of equal starts, the one of
    the lowest thread id."""
    best = None
    for r in rows:
        if covers(r, t) and (best is None or (-r["start"], r["tid"]) < (-best["start"], best["tid"])):
            best = r
    return best


def cause(t, others, calls, ops) -> str:
    if any(covers(o, t) for o in others):
        return "other step's GPU work"
    call = outermost_cover(calls, t)
    if call:
        name = call["name"]
        kind = "sync" if name in SYNCS else "launch" if any(w in name for w in ("Launch", "Memcpy", "Memset")) \
            else "runtime"
        return f"{kind}: {name}"
    op = outermost_cover(ops, t)
    return f"cpu_op: {op['name']}" if op else "nothing recorded"


def drop_zero(counter):
    return {k: v for k, v in counter.items() if v}


def reference(trace, scope="step"):
    """{(step, device): {"span", "busy", "idle", "comm", "compute", "overlap", "exposed_comm",
    "comm_alone", "parts": Counter((category, cause) → ns), "shares": {row → Fraction}}}."""
    gpu = [dict(r, row=i, device=r["device"] if r["device"] is not None else 0)
           for i, r in enumerate(trace.gpu.to_dicts())]
    if scope == "launched":  # device work whose launch is in the trace, or that has no correlation
        launched = {c["correlation"] for c in trace.calls.to_dicts()}
        gpu = [r for r in gpu if r["correlation"] is None or r["correlation"] in launched]
    if scope != "step":  # a whole-trace scope: every activity (of the scope) its own, no step
        gpu = [dict(r, step=None) for r in gpu]
    calls = outermost(trace.calls.to_dicts())
    ops = outermost([o for o in trace.ops.to_dicts() if not o["name"].startswith("ProfilerStep#")])
    times = sorted({r[k] for rows in (gpu, calls, ops) for r in rows for k in ("start", "end")})
    groups = defaultdict(list)
    for r in gpu:
        if scope != "step" or r["step"] is not None:
            groups[(r["step"], r["device"])].append(r)
    out = {}
    for (step, device), own in groups.items():
        others = [r for r in gpu if r["device"] == device and r not in own] if scope == "step" else []
        lo, hi = min(r["start"] for r in own), max(r["end"] for r in own)
        fig = Counter()
        parts, shares = Counter(), defaultdict(Fraction)
        points = [lo] + [t for t in times if lo < t < hi] + [hi]
        for t, after in zip(points, points[1:]):
            w = after - t  # everything is constant until the next event time
            running = {c: [r for r in own if r["category"] == c and covers(r, t)] for c in PRIORITY}
            n = {c: len(v) for c, v in running.items()}
            winner = next((c for c in PRIORITY if n[c]), "idle")
            # the step's comm under another step's compute on its device is hidden, not exposed
            hidden = winner == "comm" and any(o["category"] == "compute" and covers(o, t) for o in others)
            winner = "compute" if hidden else winner
            fig["span"] += w
            fig["busy"] += w * (winner != "idle")
            fig["idle"] += w * (winner == "idle")
            fig["comm"] += w * (n["comm"] > 0)
            fig["compute"] += w * (n["compute"] > 0)
            fig["overlap"] += w * (n["comm"] > 0 and (n["compute"] > 0 or hidden))
            fig["exposed_comm"] += w * (winner == "comm")
            fig["comm_alone"] += w * (n["comm"] > 0 and n["compute"] == n["memcpy"] == n["memset"] == 0
                                      and not any(covers(o, t) for o in others))
            if winner == "idle":
                parts[("idle", cause(t, others, calls, ops))] += w
                continue
            if hidden:  # no activity of the step has a share of it
                parts[("compute", "other step's GPU work")] += w
                continue
            kinds = sorted(r["coll_kind"] for r in running["comm"]) if winner == "comm" else [None]
            parts[(winner, kinds[0])] += w
            for r in running[winner]:
                shares[r["row"]] += Fraction(w, n[winner])
        out[(step, device)] = dict(fig, parts=drop_zero(parts), shares=dict(shares))
    return out



def swept(rows, hiding=()):
    """{"span", "busy", "idle", "comm", "compute", "overlap", "exposed_comm"} of a list of
    (start, end, category) rows on one device: a plain sweep over their start/end events,
    counting what runs between consecutive event times. `hiding`: (start, end) of compute on
    the device that is not the rows' own (another step's): it hides their comm, nothing else."""
    lo, hi = min(a for a, _, _ in rows), max(b for _, b, _ in rows)
    hiders = [(max(a, lo), min(b, hi), "hiding") for a, b in hiding if min(b, hi) > max(a, lo)]
    events = sorted([(a, 1, c) for a, _, c in [*rows, *hiders]] + [(b, -1, c) for _, b, c in [*rows, *hiders]],
                    key=lambda e: e[0])
    running, fig, last = Counter(), Counter(), None
    for t, step, category in events:
        if last is not None and t > last:
            w = t - last
            busy = sum(v for c, v in running.items() if c != "hiding") > 0
            comm, compute = running["comm"] > 0, running["compute"] > 0
            hidden = compute or running["hiding"] > 0
            fig["busy"] += w * busy
            fig["idle"] += w * (not busy)
            fig["comm"] += w * comm
            fig["compute"] += w * compute
            fig["overlap"] += w * (comm and hidden)
            fig["exposed_comm"] += w * (comm and not hidden)
        running[category] += step
        last = t
    fig["span"] = hi - lo
    return {k: fig[k] for k in ("span", "busy", "idle", "comm", "compute", "overlap", "exposed_comm")}


def whole_trace(trace):
    """{device: figures of `swept`} over every device activity of the trace, launch record or
    not."""
    rows = defaultdict(list)
    for r in trace.gpu.select("device", "category", "start", "end").to_dicts():
        rows[r["device"] if r["device"] is not None else 0].append((r["start"], r["end"], r["category"]))
    return {device: swept(group) for device, group in rows.items()}


def per_step(trace):
    """{(step, device): figures of `swept`} over the device activities each step launched, with
    the compute of other steps (or of none) on the device hiding their comm."""
    gpu = [dict(r, device=r["device"] if r["device"] is not None else 0)
           for r in trace.gpu.select("step", "device", "category", "start", "end").to_dicts()]
    rows = defaultdict(list)
    for r in gpu:
        if r["step"] is not None:
            rows[(r["step"], r["device"])].append((r["start"], r["end"], r["category"]))
    return {(step, device): swept(group, [(r["start"], r["end"]) for r in gpu if r["device"] == device
                                          and r["step"] != step and r["category"] == "compute"])
            for (step, device), group in rows.items()}
