"""Pictures (matplotlib, the `plot` extra): the diff waterfall."""

from __future__ import annotations

import base64
import io
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """PNG, or HTML holding the figure as inline SVG (no server, no scripts)."""
    if path.suffix.lower() == ".html":
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight")
        path.write_text(f"<!doctype html><meta charset='utf-8'><title>{path.stem}</title>\n{buffer.getvalue()}")
    else:
        fig.savefig(path, dpi=150, bbox_inches="tight")


def item_label(item: dict) -> str:
    """`kind: name (phase)` for the kernel view, `kind: phase · FSDP label` for the FSDP view."""
    if "name" in item:
        return f"{item['kind']}: {item['name']}"[:60] + (f" ({item['phase']})" if item.get("phase") else "")
    return " · ".join(str(item[k]) for k in ("kind", "phase", "fsdp") if item.get(k))


def waterfall(diff: dict, a_label: str, b_label: str, path) -> None:
    """A's step, each item's signed delta (top items and `other`), B's step, in milliseconds."""
    plt = _pyplot()
    items = diff["items"].to_dicts()
    labels = [a_label] + [item_label(r) for r in items] + [b_label]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(labels) + 1.5))
    level = diff["a_step_ns"] / 1e6
    levels = [level]
    ax.barh(0, level, color="#777777")
    for i, r in enumerate(items, start=1):
        d = r["delta_ns"] / 1e6
        ax.barh(i, d, left=level, color="#c0392b" if d > 0 else "#27ae60")
        level += d
        levels.append(level)
    ax.barh(len(labels) - 1, diff["b_step_ns"] / 1e6, color="#777777")
    low, high = min(levels), max(levels)
    ax.set_xlim(max(0.0, low - 0.15 * (high - low or high)), high + 0.05 * (high - low or high))
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GPU step span (ms; the axis does not start at 0): red = B slower, green = B faster")
    who = "all ranks" if diff["rank"] is None else f"rank {diff['rank']}"
    ax.set_title(f"{b_label} − {a_label}: {diff['step_delta_ns'] / 1e6:+.3f} ms ({who})")
    save(fig, Path(path))
    plt.close(fig)
