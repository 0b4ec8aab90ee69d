"""The lead of `tracekit diff`: at most five plain sentences from the diff's frames — the real
Δ (timed steps) with its interval and verdict, the phases that carry it, and the largest
named causes in the recorded step (the rank that carries each, added and removed work, host
syncs that appear or disappear, launches that change in number). docs/diff.md, "The lead"."""

from __future__ import annotations

import polars as pl

from tracekit.analyses.diff import VIEWS, RunDiff, phase_attribution
from tracekit.core.words import counted

CAUSES = 2  # item sentences


def ms(value_ms: float) -> str:
    """A duration in ms with the decimals its size needs (`12.3`, `1.23`, `0.012`)."""
    size = abs(value_ms)
    return f"{size:.1f}" if size >= 10 else f"{size:.2f}" if size >= 1 else f"{size:.3f}"


def more_or_less(delta_ms: float) -> str:
    """`1.23 ms more` / `1.23 ms less`; `as long (to 0.001 ms)` where it rounds to nothing."""
    if float(ms(delta_ms)) == 0:
        return "as long (to 0.001 ms)"
    return f"{ms(delta_ms)} ms {'more' if delta_ms > 0 else 'less'}"


def signed_ms(delta_ms: float) -> str:
    """`+1.23 ms` / `−1.23 ms`; `0.000 ms` (no sign) where it rounds to nothing."""
    text = ms(delta_ms)
    return f"{text} ms" if float(text) == 0 else f"{'+' if delta_ms > 0 else '−'}{text} ms"


def step_sentence(result: RunDiff, a: str, b: str) -> str:
    """The timed steps' Δ when the manifests give it, else the recorded step's (mean rank),
    saying that there are no timed steps only where a side comes from tracekit's runner (other
    traces never have them)."""
    if result.real and result.real.get("step"):
        step = result.real["step"]
        lo, hi = step["d_ms_ci"]
        word = "as long as" if float(ms(step["d_ms"])) == 0 else \
            f"{ms(step['d_ms'])} ms {'longer' if step['d_ms'] > 0 else 'shorter'} than"
        return (f"In the timed steps, {b}'s step is {word} {a}'s "
                f"(95 % interval {lo:+.2f} to {hi:+.2f} ms): {step['verdict']}.")
    n = len(result.per_rank)
    delta = result.together.step_delta_ns / n / 1e6
    who = f"on the mean of {n} ranks" if n > 1 else f"on rank {result.per_rank[0].rank}"
    than = f"as long as {a}" if round(delta, 3) == 0 else f"{more_or_less(delta)} than {a}"
    untimed = "; no timed steps to compare" if result.from_runner else ""
    return f"In the recorded step, {b} takes {than} ({who}{untimed})."


def phase_sentence(result: RunDiff) -> str | None:
    """Every phase with a Δ, largest first: the timed steps' phase timers, each with its
    verdict, when known; else the trace's attribution (mean rank)."""
    if result.reconciled is not None and result.reconciled.filter(pl.col("phase") != "step").height:
        phases = result.reconciled.filter(pl.col("phase") != "step").select("phase", d="real_d_ms",
                                                                             verdict="verdict")
        source = "the timed steps' phase timers"
    else:
        attributed = phase_attribution(result.together, len(result.per_rank))
        if not attributed.height:
            return None
        phases = attributed.select("phase", d=(pl.col("device_delta_ns") + pl.col("idle_delta_ns")) / 1e6)
        source = "the items' Δ summed by phase" + (", mean rank" if len(result.per_rank) > 1 else "")
        if (phases["phase"] == "other").any():
            source += "; other: items of no phase"
    top = phases.filter(pl.col("d").round(3) != 0).sort(pl.col("d").abs(), descending=True).iter_rows(named=True)
    parts = [f"{r['phase']} {signed_ms(r['d'])}" + (f" ({r['verdict']})" if r.get("verdict") else "")
             for r in top]
    if not parts or parts[0].startswith("unknown") and len(parts) == 1:  # a trace without phases says nothing
        return None
    return f"By phase: {', '.join(parts[:-1]) + ' and ' if len(parts) > 1 else ''}{parts[-1]} ({source})."


def item_phrase(row: dict, a: str, b: str, by: str) -> str:
    """What one item is and how it moved, in words."""
    what = row["name"] if by == "kernel" else row["fsdp"]
    phase = f" in {row['phase']}" if row.get("phase") not in (None, "unknown") else ""
    delta = row["delta_ns"] / 1e6
    if row["kind"] == "comm":
        subject = f"exposed {what.replace('_', '-')} time" if by == "kernel" else f"exposed comm ({what})"
        return f"{subject}{phase} is {more_or_less(delta)}"
    if row["kind"] == "idle":
        cause = f" for {what}" if by == "kernel" and what else ""
        return f"the GPU idles {more_or_less(delta)}{cause}{phase}"
    launcher = f" (from {row['op']})" if by == "kernel" and row.get("op") else ""
    if row["a_count"] == 0:
        return f"{b} adds {row['kind']} {what}{launcher}{phase}, {ms(delta)} ms"
    if row["b_count"] == 0:
        return f"{a}'s {row['kind']} {what}{launcher}{phase} is gone, {ms(delta)} ms"
    return f"{row['kind']} {what}{launcher}{phase} takes {more_or_less(delta)}"


def cause_sentences(result: RunDiff, a: str, b: str, by: str) -> list[str]:
    """The `CAUSES` largest items over every rank's diff (one sentence each, an item once),
    naming the rank when there are several, and saying they come from the recorded step (one
    step: the timed steps' phases are the figures with an interval)."""
    key = VIEWS[by]
    pooled = pl.concat([d.all_items.with_columns(rank=pl.lit(d.rank)) for d in result.per_rank], how="diagonal_relaxed")
    largest = (pooled.sort(pl.col("delta_ns").abs(), descending=True).unique(key, keep="first", maintain_order=True)
               .filter(pl.col("delta_ns") != 0).head(CAUSES))
    several = len(result.per_rank) > 1
    out = []
    for row in largest.iter_rows(named=True):
        where = f"In the recorded step of rank {row['rank']}" if several else "In the recorded step"
        out.append(f"{where}, {item_phrase(row, a, b, by)}.")
    return out


def sync_sentence(result: RunDiff, a: str, b: str) -> str | None:
    """Host-sync APIs one side calls and the other does not (counts summed over ranks)."""
    syncs = result.together.syncs
    if not syncs.height:
        return None
    n = len(result.per_rank)
    gone = syncs.filter((pl.col("a_count") > 0) & (pl.col("b_count") == 0))
    new = syncs.filter((pl.col("a_count") == 0) & (pl.col("b_count") > 0))
    parts = [f"{a}'s {counted(r['a_count'] / n, r['api'], r['api'])} per rank (blocking the host "
             f"{ms(r['a_blocked_ns'] / n / 1e6)} ms) {'is' if r['a_count'] == n else 'are'} gone in {b}"
             for r in gone.iter_rows(named=True)]
    parts += [f"{b} adds {counted(r['b_count'] / n, r['api'], r['api'])} per rank (blocking the host "
              f"{ms(r['b_blocked_ns'] / n / 1e6)} ms)" for r in new.iter_rows(named=True)]
    return ("; ".join(parts) + ".") if parts else None


LAUNCH_CHANGE = 0.10  # the share of A's launches that B must add or drop for the lead to say so,
LAUNCHES_CHANGED = 10  # and as many per rank at least (2 → 3 launches says nothing)


def launch_sentence(result: RunDiff, a: str, b: str) -> str | None:
    """How many launches of device work a step makes per rank on each side, and the host time
    of their calls, where B makes at least LAUNCH_CHANGE more or fewer than A, and
    LAUNCHES_CHANGED per rank (what `torch.compile`'s fusion and CUDA graphs cut)."""
    launches = result.together.launches
    n = len(result.per_rank)
    a_count, b_count = (int(launches[f"{side}_count"].sum()) if launches.height else 0 for side in "ab")
    if not a_count or abs(b_count - a_count) < max(LAUNCH_CHANGE * a_count, LAUNCHES_CHANGED * n):
        return None
    a_ms, b_ms = (float(launches[f"{side}_call_ns"].sum()) / n / 1e6 for side in "ab")
    change = round(100 * abs(b_count - a_count) / a_count)
    return (f"{b} makes {change} % {'fewer' if b_count < a_count else 'more'} launches per step than {a} "
            f"({a_count / n:g} → {b_count / n:g} per rank), their calls taking the host {ms(a_ms)} → {ms(b_ms)} ms.")


def diff_lead(result: RunDiff, a: str, b: str, by: str = "kernel") -> list[str]:
    """At most five sentences: the step's Δ, the phases, the largest causes, the host syncs
    that appear or go, the launches where their number changes (`a`, `b`: the sides' names);
    where A and B are the same traces, one sentence saying so."""
    if result.same is not None:
        many = len(result.per_rank) > 1
        return [f"{a} and {b} are the same trace{'s' if many else ''} ({result.same}): no difference to attribute."]
    sentences = [step_sentence(result, a, b), phase_sentence(result), *cause_sentences(result, a, b, by),
                 sync_sentence(result, a, b), launch_sentence(result, a, b)]
    return [s for s in sentences if s][:5]
