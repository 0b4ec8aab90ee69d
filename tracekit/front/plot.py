"""Pictures (matplotlib, the `plot` extra): the diff waterfall, the report's step split, timelines."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl

from tracekit.core.errors import TraceError, UsageError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("pictures need matplotlib: pip install 'torch-tracekit[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """PNG (`.png` added to a name without a suffix), or HTML holding the figure as inline SVG
    (no server, no scripts); the path written."""
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    if path.suffix.lower() == ".html":
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight")
        path.write_text(f"<!doctype html><meta charset='utf-8'><title>{path.stem}</title>\n{buffer.getvalue()}")
    else:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    return path


def item_labels(items: pl.DataFrame) -> list[str]:
    """Each item's label: `kind: name (phase)` for the kernel view, a kernel's name as the
    diff's table shows it (`views.kernel_column`: two kernels never look alike), with ` · op`
    where two items' labels would otherwise be one; `kind: phase · FSDP label` for the FSDP
    view."""
    if "name" not in items.columns:
        return [" · ".join(str(r[k]) for k in ("kind", "phase", "fsdp") if r.get(k)) for r in items.to_dicts()]
    from tracekit.front.views import VIEWS, kernel_column

    names = items.select(kernel_column(pl.col("name"), VIEWS["diff.items"].kernel_kinds, LABEL))["name"].to_list()
    labels = [f"{r['kind']}: {name}" + (f" ({r['phase']})" if r.get("phase") else "")
              for r, name in zip(items.to_dicts(), names)]
    return [f"{label} · {r['op']}" if labels.count(label) > 1 and r.get("op") else label
            for label, r in zip(labels, items.to_dicts())]


LABEL = 60  # characters of a kernel's name in a label at most


def waterfall(diff, a_label: str, b_label: str, path, over: str = "all ranks") -> Path:
    """A's step, each item's signed delta (top items and `other`), B's step, in milliseconds
    (`diff`: a `Diff`; `over`: what a diff over ranks is, e.g. "mean rank")."""
    plt = _pyplot()
    items = diff.items.to_dicts()
    labels = [a_label] + item_labels(diff.items) + [b_label]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(labels) + 1.5))
    level = diff.a_step_ns / 1e6
    levels = [level]
    ax.barh(0, level, color="#777777")
    for i, r in enumerate(items, start=1):
        d = r["delta_ns"] / 1e6
        ax.barh(i, d, left=level, color="#c0392b" if d > 0 else "#27ae60")
        level += d
        levels.append(level)
    ax.barh(len(labels) - 1, diff.b_step_ns / 1e6, color="#777777")
    low, high = min(levels), max(levels)
    ax.set_xlim(max(0.0, low - 0.15 * (high - low or high)), high + 0.05 * (high - low or high))
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GPU step span (ms; the axis does not start at 0): red = B slower, green = B faster")
    who = over if diff.rank is None else f"rank {diff.rank}"
    ax.set_title(f"{b_label} − {a_label}: {diff.step_delta_ns / 1e6:+.3f} ms ({who})")
    written = save(fig, Path(path))
    plt.close(fig)
    return written


COLOURS = {"compute": ("#2e86c1", "compute"), "comm": ("#e67e22", "comm transfer"),
           "comm wait": ("#f5cba7", "comm: waiting for peers"), "memcpy": ("#7f8c8d", "memcpy"),
           "memset": ("#95a5a6", "memset")}  # category: (colour, legend)
PARTITION_COLOURS = {"comm": ("#c0392b", "exposed comm"), "idle": ("#d5d8dc", "idle")}
HOST_COLOURS = {"cpu op": ("#2e86c1", "CPU op"), "collective": ("#e67e22", "collective")}
PHASE_COLOURS = {"forward": ("#a9cce3", "forward"), "backward": ("#d2b4de", "backward"),
                 "optimizer": ("#a9dfbf", "optimizer"), "checkpoint": ("#f9e79f", "checkpoint")}


def _bars(ax, intervals, origin: int, lane: int, colour: str) -> None:
    """The intervals (ns) as bars on `lane`, in ms from `origin`."""
    ax.broken_barh(list(zip(((intervals["start"] - origin) / 1e6).to_list(),
                            ((intervals["end"] - intervals["start"]) / 1e6).to_list(), strict=True)),
                   (lane - 0.4, 0.8), color=colour, linewidth=0)


def lanes(own, segments, waits) -> list[tuple[str, object, dict]]:
    """(label, rows, colours) per lane of one step, grouped per device: each stream of the
    device (its activities, a collective's wait for its peers `waits` drawn over its start),
    then the device's partition (its segments)."""
    import polars as pl

    waited = waits.filter(pl.col("wait_end").is_not_null()).select(
        "device", "stream", "start", end=pl.col("wait_end"), category=pl.lit("comm wait"))
    own = pl.concat([own, waited], how="diagonal_relaxed")
    own = own.with_columns(pl.col("device").fill_null(0))
    out = []
    for device in own["device"].unique().sort().to_list():
        mine = own.filter(pl.col("device") == device)
        for stream in mine["stream"].unique().sort().to_list():
            out.append((f"GPU {device} · stream {stream}", mine.filter(pl.col("stream").eq_missing(stream)), COLOURS))
        out.append((f"GPU {device} · exposed comm / idle", segments.filter(pl.col("device") == device),
                    PARTITION_COLOURS))
    return out


def thread_lanes(rows) -> list[tuple[str, object, dict]]:
    """(label, rows, colours) per lane of one CPU-only step (`host_lanes`): per thread, its
    phases (where the runner marked them), then its outermost ops."""
    import polars as pl

    out = []
    for tid in rows["tid"].unique(maintain_order=True).to_list():
        mine = rows.filter(pl.col("tid").eq_missing(tid))
        for lane, label, colours in (("phases", "phases", PHASE_COLOURS), ("ops", "ops", HOST_COLOURS)):
            part = mine.filter(pl.col("lane") == lane)
            if part.height:
                out.append((f"thread {tid} · {label}", part, colours))
    return out


def _panel(trace, waits, step: int | None):
    """(trace, step, origin, span, drawn lanes, what the span is) of one rank, or None when it
    has no step to draw: a trace with device activity its GPU lanes, else its threads."""
    import polars as pl

    from tracekit.analyses.host_lanes import host_lanes
    from tracekit.analyses.timeline import timeline as step_timeline

    if trace.has_gpu:
        steps = trace.gpu.filter(pl.col("step").is_not_null())["step"].unique().sort().to_list()
    else:
        steps = trace.steps["step"].sort().to_list()
    if not steps:
        return None
    if step is not None and step not in steps:
        raise UsageError(f"--steps {step}: {trace.path} has no step {step} (its steps: {', '.join(map(str, steps))})")
    if not trace.has_gpu:  # the last step with a CPU op to draw, or the one asked for
        for chosen in ([step] if step is not None else reversed(steps)):
            drawn = thread_lanes(host_lanes(trace, chosen))
            if drawn:
                break
        else:
            if step is not None:
                raise UsageError(f"--steps {step}: {trace.path} has no CPU op in step {step} to draw")
            return None
        window = trace.steps.filter(pl.col("step") == chosen)
        origin, end = window["cpu_start"][0], window["cpu_end"][0]
        return trace, chosen, origin, end - origin, drawn, "CPU span"
    chosen = steps[-1] if step is None else step
    own = trace.gpu.filter(pl.col("step") == chosen)
    drawn = lanes(own, step_timeline(trace).segments.filter(pl.col("step") == chosen),
                  waits.filter(pl.col("step") == chosen))
    return trace, chosen, own["start"].min(), own["end"].max() - own["start"].min(), drawn, "GPU span"


def timeline(traces: list, step: int | None, path) -> Path:
    """One step per rank: lanes grouped per device — each GPU stream a lane (compute blue, comm
    orange: its transfer, light orange: its wait for peers, memcpy/memset grey), then the
    device's partition: exposed comm red, idle light grey. A rank without device activity
    (CPU only) gets its threads' lanes instead (`host_lanes`): the runner's phases, then the
    outermost ops and annotations (collectives orange), of its last step that has any. The
    legend names what is drawn."""
    import polars as pl

    from tracekit.analyses.comms import peer_waits

    plt = _pyplot()
    panels = [p for p in (_panel(trace, waits, step) for trace, waits in zip(traces, peer_waits(traces), strict=True))
              if p is not None]
    if not panels:
        raise TraceError(", ".join(t.path for t in traces), "no step to draw")
    n_lanes = sum(max(1, len(drawn)) for *_, drawn, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 0.45 * n_lanes + 1.2 * len(panels)), squeeze=False)
    longest = max(span for _, _, _, span, _, _ in panels) / 1e6
    legend = {}  # label: colour, of what some lane drew
    for ax, (trace, chosen, origin, span, drawn, what) in zip(axes[:, 0], panels):
        labels = []
        for lane, (label, rows, colours) in enumerate(drawn):
            for cat, (colour, name) in colours.items():
                bars = rows.filter(pl.col("category") == cat)
                if bars.height:
                    _bars(ax, bars, origin, lane, colour)
                    legend.setdefault(name, colour)
            labels.append(label)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, longest or 1)  # one scale for every rank: their lengths compare at a glance
        ax.set_title(f"rank {trace.rank}, step {chosen}: {what} {span / 1e6:.2f} ms — "
                     f"{'/'.join(Path(trace.path).parts[-2:])}", fontsize=9)  # the file and its folder (the variant)
    kinds = {what for *_, what in panels}
    axes[-1, 0].set_xlabel("ms from the step's first GPU activity" if kinds == {"GPU span"} else
                           "ms from the step's CPU start" if kinds == {"CPU span"} else
                           "ms from each panel's step start (GPU: its first activity; CPU only: its CPU start)")
    if legend:
        fig.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in legend.values()], list(legend), loc="upper right",
                   ncol=min(7, len(legend)), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    written = save(fig, Path(path))
    plt.close(fig)
    return written


PART_COLOURS = {"compute": "#2e86c1", "exposed comm": "#c0392b", "memcpy": "#7f8c8d"}
IDLE_SHADES = ("#f5b041", "#f8c471", "#fad7a0", "#d7bde2", "#a9dfbf", "#d5d8dc")


def report_picture(split, timed, path) -> Path:
    """Per variant, two bars: the recorded step split into its parts (`split`: variant, part,
    ms) and the timed step's median with its 95 % interval (`timed`: variant, step_ms,
    step_ms_ci), in ms."""
    plt = _pyplot()
    variants = timed["variant"].to_list()
    idle = sorted(p for p in split["part"].unique().to_list() if p.startswith("idle") and p != "idle: other")
    parts = [p for p in ("compute", "exposed comm", "memcpy") if p in split["part"].to_list()] + idle
    parts += ["idle: other"] if "idle: other" in split["part"].to_list() else []
    colours = {**PART_COLOURS, **{p: IDLE_SHADES[i % len(IDLE_SHADES)] for i, p in enumerate([*idle, "idle: other"])}}
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(variants) + 2))
    for i, variant in enumerate(variants):
        left = 0.0
        mine = dict(split.filter(split["variant"] == variant).select("part", "ms").iter_rows())
        for part in parts:
            width = mine.get(part, 0.0)
            ax.barh(i - 0.2, width, left=left, height=0.38, color=colours[part], label=part if i == 0 else None)
            left += width
        row = timed.row(i, named=True)
        lo, hi = row["step_ms_ci"] or (row["step_ms"], row["step_ms"])
        ax.barh(i + 0.2, row["step_ms"], height=0.38, color="#555555", label="timed step (median)" if i == 0 else None,
                xerr=[[row["step_ms"] - lo], [hi - row["step_ms"]]], capsize=3)
    ax.set_yticks(range(len(variants)), [f"{v}\nrecorded · timed" for v in variants], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (recorded: the trace's median step, mean over ranks; timed: median, 95 % interval)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    written = save(fig, Path(path))
    plt.close(fig)
    return written
