"""`tracekit memory`: where each rank's peak memory over the step comes from."""

from __future__ import annotations

from pathlib import Path

import click

from .common import emit, format_option, main, render_frame, say, table_layout


def answers_of(path, rank: int | None = None, top: int = 10) -> list:
    """`memory_answer` of every memory record at `path` (`core.memory_files.load_memory`), or of
    `rank`'s; each named by its variant, else by its file's name."""
    from tracekit.analyses.memory import memory_answer
    from tracekit.core.errors import TraceError
    from tracekit.core.memory_files import load_memory

    records = [r for r in load_memory(path) if rank is None or r.rank == rank]
    if not records:
        raise TraceError(path, f"no memory record of rank {rank}")
    for record in records:
        record.variant = record.variant or Path(record.path).name
    return [memory_answer(r, top) for r in records]


def keyed(answer, frame):
    """`frame` with the answer's variant and rank in front."""
    import polars as pl

    return frame.select(pl.lit(answer.variant).alias("variant"), pl.lit(answer.rank, dtype=pl.Int64).alias("rank"),
                        pl.all())


def memory_doc(answer) -> dict:
    """One rank's answer as JSON (docs/json.md, `tracekit memory`)."""
    return {"variant": answer.variant, "rank": answer.rank, "source": answer.source, "device": answer.device,
            "peak": answer.peak, "phases": answer.phases.to_dicts(), "categories": answer.categories.to_dicts(),
            "phase_categories": answer.phase_categories.to_dicts(), "largest": answer.largest.to_dicts(),
            "notes": answer.notes}


def tables(answers) -> dict:
    """The four tables of `tracekit memory`: peaks, categories at the peak, phases, largest."""
    import polars as pl

    from tracekit.analyses.memory import peak_table

    return {"peaks": peak_table(answers).select("variant", "rank", "peak_bytes", "peak_phase", "peak_at_ms",
                                                "reserved_bytes", "allocator_peak_bytes"),
            "categories": pl.concat([keyed(a, a.categories) for a in answers]),
            "phases": pl.concat([keyed(a, a.phases) for a in answers]),
            "largest": pl.concat([keyed(a, a.largest) for a in answers])}


HEADS = {"categories": "live at the peak, by category (docs/metrics.md; slack: reserved − allocated):",
         "phases": "per phase (ms from the step's start):",
         "largest": "the largest live allocations at the peak, by origin:"}


@main.command()
@click.argument("path", type=click.Path(exists=True))
@click.option("--rank", type=int, default=None, help="Only this rank (default: all).")
@click.option("--top", type=int, default=5, show_default=True, help="Origins listed per rank.")
@format_option
@table_layout
def memory(path, rank, top, fmt, layout):
    """Memory over one training step per rank: the peak, when and in which phase it comes, what
    it is made of (parameters, unsharded parameters, gradients, optimizer state, activations,
    communication buffers, temporaries, allocator slack) and the largest allocations live then.

    PATH: a `tracekit profile` output, a variant's folder or its memory/ folder (the memory
    step's records), an allocator snapshot pickle (torch.cuda.memory._snapshot() after
    _record_memory_history), or a Kineto trace recorded with profile_memory=True. csv: the
    categories table."""
    from tracekit.front.render import json_text

    answers = answers_of(path, rank, top)
    for answer in answers:
        for note in answer.notes:
            say(f"{answer.variant} rank {answer.rank}: {note}")
    shown = tables(answers)
    if fmt == "json":
        return emit(json_text({"ranks": [memory_doc(a) for a in answers]}))
    if fmt == "csv":
        return emit(render_frame(shown["categories"], fmt))
    parts = [render_frame(shown["peaks"], fmt, "memory", layout)]
    parts += [f"{HEADS[name]}\n{render_frame(shown[name], fmt, f'memory.{name}', layout)}"
              for name in ("categories", "phases", "largest")]
    emit("\n\n".join(parts))


def compared(a_path, b_path, a_name: str, b_name: str, rank: int | None = None):
    """(B − A at the peak, `memory_delta`; its lead) of two variants' memory records, beside
    their traces (`records_near`); None where either side has none."""
    from tracekit.analyses.memory import memory_answer, memory_delta, memory_lead
    from tracekit.core.memory_files import records_near

    sides = [[memory_answer(r) for r in records_near(p) if rank is None or r.rank == rank] for p in (a_path, b_path)]
    if not all(sides):
        return None
    delta = memory_delta(*sides)
    return delta, memory_lead(delta, a_name, b_name)


DELTA_HEAD = "memory at the peak, B − A (mean rank; docs/metrics.md, categories and origins):"


def signed(n: float) -> str:
    from tracekit.analyses.memory import gib

    return ("+" if n > 0 else "−" if n < 0 else "±") + gib(abs(n))


def shown_delta(delta, origins: int = 5):
    """`memory_delta` for a table: the peak, phase and category rows (categories by their names),
    the `origins` largest origin rows, the Δ as signed text."""
    import polars as pl

    from tracekit.analyses.memory import LABELS

    rows = pl.concat([delta.filter(pl.col("kind") != "origin"), delta.filter(pl.col("kind") == "origin").head(origins)])
    name = pl.when(pl.col("kind") == "category").then(pl.col("name").replace(LABELS)).otherwise(pl.col("name"))
    return rows.select("kind", name.alias("name"), "a_bytes", "b_bytes",
                       pl.col("delta_bytes").map_elements(signed, return_dtype=pl.String).alias("delta"))


def variants_memory(out, base: str) -> tuple | None:
    """The memory step of a profile output's variants against `base`: (a table, one row per
    variant: its peak (mean rank), Δ against the base, the phases it comes in, and what the Δ
    is made of; {(base, variant): (`memory_delta`, its lead)}); None without records."""
    import polars as pl

    from tracekit.analyses.memory import mean_categories, memory_answer, memory_delta, memory_lead
    from tracekit.core.memory_files import records_near

    answers = {v: [memory_answer(r) for r in records_near(Path(out) / v)] for v in sorted_variants(out)}
    answers = {v: a for v, a in answers.items() if a}
    if base not in answers:
        return None
    deltas = {(base, v): memory_delta(answers[base], a) for v, a in answers.items() if v != base}
    leads = {pair: memory_lead(d, *pair) for pair, d in deltas.items()}
    rows = [{"variant": v, "peak_bytes": mean_categories(a)["peak"],
             "d_peak": "" if v == base else signed(mean_categories(a)["peak"] - mean_categories(answers[base])["peak"]),
             "peak_phase": ", ".join(sorted({x.peak["phase"] or "unknown" for x in a})),
             "made_of": "" if v == base else leads[base, v].partition(": ")[2].rstrip(".")} for v, a in answers.items()]
    return pl.DataFrame(rows), {pair: (deltas[pair], leads[pair]) for pair in deltas}


def sorted_variants(out) -> list[str]:
    """The variants of a profile output in the manifest's order."""
    import json

    try:
        return list(json.loads((Path(out) / "manifest.json").read_text())["variants"])
    except (OSError, ValueError, KeyError):
        return []


MEMORY_HEAD = "memory at the peak of the memory step (mean rank; made_of: B − A by category; tracekit memory OUT):"
