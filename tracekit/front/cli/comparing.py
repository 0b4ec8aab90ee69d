"""Verbs that compare: diff of two variants, report and check of a profile output."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import click

from tracekit.core.errors import UsageError

from .memory import DELTA_HEAD, MEMORY_HEAD, compared, shown_delta, variants_memory
from .common import (analysed_runs, counted, emit, existing, format_option, load_options, load_traces, location, main,
                     named_beside, new_picture, of_ranks, rank_option, render_frame, say, shout, steps_choice,
                     table_layout, wrote)


def named_material(trace, by: str, comm_kernels: tuple = (), cache=None):
    """`diff.material` of a trace, a lean one first named from the full step beside it
    (`named_beside`), with the counts of what was named."""
    from tracekit.analyses.diff import material

    counts = named_beside(trace, comm_kernels, cache)
    found = material(trace, by)
    found.named = counts
    return found


def whole_material(trace, by: str, named: bool, comm_kernels: tuple = (), cache=None):
    """(the trace, its `diff.material`), the trace first named from the full step beside it
    where `named` (`named_material`)."""
    from tracekit.analyses.diff import material

    return trace, (named_material(trace, by, comm_kernels, cache) if named else material(trace, by))


def diffed(a, b, steps, rank, top: int, by: str, options: dict, whole: bool = False, ranks: str = "sum"):
    """(A's traces, B's traces, the RunDiff) with every warning printed: world sizes, steps,
    and the models named by the profile manifests when both have one. The traces are loaded
    here only when `whole` (for export, the RunDiff then with its per-activity items; else
    None); else each rank's diff material comes from a worker. Where only one side is named
    from the full step beside it, both are compared without those names, saying so."""
    from functools import partial

    from tracekit.analyses.diff import combine, material, named_on_one_side, sign_disagreements, with_activities
    from tracekit.analyses.fidelity import with_real
    from tracekit.analyses.timed import steps_per_round
    from tracekit.core.loading import profile_variant

    if isinstance(steps, list) and len(steps) != 1:
        raise click.BadParameter("diff compares one step, or all (the median step)", param_hint="--steps")
    step = steps if steps == "all" else steps[0]
    names = {"comm_kernels": options["comm_kernels"], "cache": options["cache"]}

    def sides(paths: list, named: bool = True) -> list[tuple[list | None, list]]:
        """(its traces where `whole`, else None; its materials) of each of `paths`, all read in
        one pool (both sides' ranks at once)."""
        if whole:
            analysis = partial(whole_material, by=by, named=named, **names)
        else:
            analysis = partial(named_material, by=by, **names) if named else partial(material, by=by)
        runs = analysed_runs(paths, options, analysis, whole, rank, named=named and not whole, apart=False)
        found = [of_ranks([r for r in runs if r.found_in == str(path)], rank, [path]) for path in paths]
        return [([t for _, (t, _) in f], [m for _, (_, m) in f]) if whole else (None, [m for _, m in f])
                for f in found]

    # a self-diff: its traces read once (`once` would read the second PATH as the first)
    (a_traces, a_side), (b_traces, b_side) = sides([a]) * 2 if location(a) == location(b) else sides([a, b])
    if (named := named_on_one_side(a_side, b_side)) is not None:  # compare on what both sides have: no names
        say(f"warning: {named}'s traces are named from the full step in names/ beside them, "
            f"{'B' if named == 'A' else 'A'}'s have none: both are compared without those names (launching ops, "
            "phases and collective dtypes as the recordings themselves have them)")
        if named == "A":
            (a_traces, a_side), = sides([a], named=False)
        else:
            (b_traces, b_side), = sides([b], named=False)
    (ma, va), (mb, vb) = profile_variant(a), profile_variant(b)
    result = combine(a_side, b_side, step, top, by, steps_per_round(ma, va, mb, vb))
    if whole:
        result = with_activities(result, a_traces, b_traces)
    warnings = result.warnings + with_real(result, ma, va, mb, vb)
    if ranks != "each":
        warnings += [f"{w}; the {ranks} over ranks hides it (--ranks each)" for w in sign_disagreements(result, by=by)]
    for warning in warnings:
        say(f"warning: {warning}")
    return a_traces, b_traces, result


def diff_sides(paths: tuple, verb: str = "diff") -> tuple[str, str]:
    """A's and B's paths: `A B` (trace files or run directories), or `OUT A B` (variant names
    of one profile output); a mistake's fix is spelled as `tracekit VERB …`."""
    if len(paths) not in (2, 3):
        raise UsageError("diff takes A B, or OUT A B (variants of a profile output); "
                         f"got {counted(len(paths), 'argument')}")
    if len(paths) == 2:
        existing(None, None, paths)
        for side, path in zip("AB", paths):
            if len(held := variant_folders(Path(path))) > 1:  # its ranks' traces are of several variants
                other = Path(paths[1 if side == "A" else 0])  # one of its variants, kept on its side
                named = other.name if other.parent.resolve() == Path(path).resolve() else None
                rest = [v for v in held if v != named]
                pair = (held[0], held[1]) if named is None else (rest[0], named) if side == "A" else (named, rest[0])
                raise UsageError(f"{side}: {path} is a profile output of {len(held)} variants ({', '.join(held)}), "
                                 f"not one: name two of them, tracekit {verb} {path} {' '.join(pair)}")
        return paths
    out, *variants = paths
    if not Path(out).exists() and Path(variants[-1]).is_dir():
        raise UsageError(f"{out}: no such file or directory; the profile output comes first: "
                         f"tracekit {verb} {variants[-1]} {out} {variants[0]}")
    if not (Path(out) / "manifest.json").is_file() and (Path(variants[-1]) / "manifest.json").is_file():
        a, b = (Path(p).name for p in (out, variants[0]))
        raise UsageError(f"{out}: not a profile output, {variants[-1]} is; the profile output comes first: "
                         f"tracekit {verb} {variants[-1]} {a} {b}")
    existing(None, None, out)
    found = subfolders(Path(out)) if Path(out).is_dir() else []
    listed = manifest_variants(Path(out))
    for variant in variants:
        if variant in listed and variant not in found:
            entry = listed[variant] if isinstance(listed[variant], dict) else {}
            status, message = entry.get("status"), entry.get("message") or ""
            if status == "skipped":
                raise UsageError(f"{out}: {variant} was skipped ({message}): no trace to compare")
            if status != "ok":
                raise UsageError(f"{out}: {variant} failed ({status}: {message}): no trace to compare")
            raise UsageError(f"{out}: {variant} ran but has no trace here (recorded with --profile-steps 0, "
                             "or not kept)")
        if variant not in found:
            raise UsageError(f"{out}: no variant {variant} (found: {', '.join(found) or 'none'})")
    return str(Path(out) / variants[0]), str(Path(out) / variants[1])


def variant_folders(path: Path) -> list[str]:
    """The variants' folders of a profile output (a folder holding manifest.json), by name;
    none for any other path."""
    return subfolders(path) if (path / "manifest.json").is_file() else []


def subfolders(out: Path) -> list[str]:
    """The folders in `out` that may be variants (all but `names/`, the full step's names), by name."""
    return sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "names")


def manifest_variants(out: Path) -> dict:
    """The variants a profile output's manifest lists, name → entry (none without a readable manifest)."""
    try:
        return dict(json.loads((out / "manifest.json").read_text())["variants"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def side_names(a: str, b: str) -> tuple[str, str]:
    """Short names of the two sides: their last path parts (`A`/`B` when those agree)."""
    names = Path(a.rstrip("/")).name, Path(b.rstrip("/")).name
    return names if names[0] != names[1] else ("A", "B")


@main.command()
@click.argument("paths", nargs=-1, required=True, metavar="[OUT] A B")
@click.option("--steps", default="all", show_default=True, callback=steps_choice,
              help="One step both have, or all: each side's median step is attributed and each item's "
                   "delta over the steps both have gives its spread.")
@rank_option
@load_options
@click.option("--top", type=int, default=20, show_default=True, help="Items shown; the rest is one 'other' row.")
@click.option("--by", type=click.Choice(["kernel", "fsdp"]), default="kernel", show_default=True,
              help="Group by kernel identity (kind, name, op, phase) or by FSDP phase (kind, phase, FSDP label).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=new_picture,
              help="Also draw the waterfall to FILE.png or FILE.html.")
@click.option("--ranks", type=click.Choice(["each", "sum", "mean"]), default="each", show_default=True,
              help="With several ranks: a table per rank, or their sum or mean (JSON: the top level is the "
                   "mean with mean, else the sum; `ranks` holds each).")
@format_option
@table_layout
def diff(paths, steps, rank, options, top, by, ranks, plot_path, fmt, layout):
    """Attribute B's step time minus A's to kernels, collectives and idle causes, exactly.

    A and B are trace files or run directories of the same job in two variants, or, after a
    `tracekit profile` output OUT, two of its variants' names."""
    from tracekit.front.render import render_diff

    a, b = diff_sides(paths)
    from tracekit.analyses.lead import diff_lead

    _, _, result = diffed(a, b, steps, rank, top, by, options, ranks=ranks)
    names = side_names(a, b)
    lead, memory = diff_lead(result, *names, by), compared(a, b, *names, rank)  # memory: the memory step's records
    if fmt == "json" and memory:
        from tracekit.front.render import full_diff_doc, json_text

        emit(json_text({**full_diff_doc(a, b, result, ranks, lead + [memory[1]]), "memory": memory[0].to_dicts()}))
    else:
        emit(render_diff(a, b, result, fmt, layout, ranks, lead + ([memory[1]] if memory else [])))
    if memory and fmt in ("table", "md"):
        emit(f"\n{DELTA_HEAD}\n{render_frame(shown_delta(memory[0]), fmt, 'memory.delta', layout)}")
    if plot_path:
        from tracekit.front.plot import waterfall

        written = waterfall(result.shown(ranks), *names, plot_path, "sum over ranks" if ranks == "sum" else "mean rank")
        wrote(written)


@main.command("report")
@click.argument("out", type=click.Path(exists=True, file_okay=False))
@click.option("--baseline", default=None, metavar="VARIANT", help="The variant the others are compared with "
              "(default: the first that ran).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=new_picture,
              help="Also draw each variant's recorded step split (compute, exposed comm, memcpy, idle by "
                   "cause) beside its timed step to FILE.png or FILE.html.")
@format_option
@table_layout
def report_command(out, baseline, plot_path, fmt, layout):
    """The variants of a `tracekit profile` output side by side, each against the baseline."""
    show_report(out, fmt, layout, baseline, plot_path)


def named_then_prepared(run, variants: list[str], prepared=None) -> None:
    """`prepared(run, variants)` after each of the run's traces was named from the full step
    beside it (`named_beside`), so that a report's diffs and critical paths name what a
    `cupti` recording does not hold, as `diff` and `critical-path` do."""
    for trace in run.traces:
        named_beside(trace)
    prepared(run, variants)


def show_report(out, fmt: str, layout=None, baseline: str | None = None, plot_path=None) -> None:
    """The variants side by side with their noise and fidelity, warnings, then each one's
    exact diff against the baseline (top items, the mean rank); in JSON one object
    `{variants, phases, critical_path, diffs, warnings}` (docs/json.md)."""
    from tracekit.analyses.lead import diff_lead
    from tracekit.analyses.fidelity import comparison_warnings, report_warnings, with_real
    from tracekit.analyses.timed import steps_per_round
    from tracekit.analyses.variants import (base_variant, comparison_summary, critical_split, phase_table, prepared,
                                            variant_diffs, variant_table)
    from tracekit.core.loading import load_profile, traceless_variants
    from tracekit.front.render import json_text, full_diff_doc, render_diff
    from tracekit.front.views import Layout

    layout = layout or Layout()
    manifest, runs = load_profile(out, then=partial(named_then_prepared, prepared=prepared))
    try:
        base = base_variant(manifest, baseline)
    except ValueError as e:
        raise UsageError(str(e)) from None
    table, phases = variant_table(manifest, runs, base), phase_table(manifest, base)
    critical, design = critical_split(runs), comparison_summary(manifest, base)
    warnings = comparison_warnings(design, table) + report_warnings(table, manifest["config"].get("profile_mode", "full"))
    bare = traceless_variants(manifest, runs)
    if bare:
        warnings.append(f"no trace here for {', '.join(bare)} (recorded with --profile-steps 0, or not kept): "
                        "their timed figures only")
    diffs = variant_diffs(runs, top=8, base=base, per_round=steps_per_round(manifest, base, manifest, base))
    for (a, b), result in diffs.items():
        warnings += [f"{b} − {a}: {w}"
                     for w in result.warnings + with_real(result, manifest, a, manifest, b, sides=False)]
    leads = {pair: diff_lead(result, *pair) for pair, result in diffs.items()}
    memory = variants_memory(out, base)  # the memory step's records, where there are any
    for pair, (_, line) in (memory[1] if memory else {}).items():
        leads[pair] = leads.get(pair, []) + [line]
    if fmt == "json":
        emit(json_text({"comparison": design, "variants": table.to_dicts(), "phases": phases.to_dicts(),
                        "critical_path": critical.to_dicts(),
                         "diffs": [full_diff_doc(a, b, result, "sum", leads[a, b]) for (a, b), result in diffs.items()],
                         **({"memory": {"variants": memory[0].to_dicts(),
                                        "deltas": [{"a": a, "b": b, "lead": line, "rows": d.to_dicts()}
                                                   for (a, b), (d, line) in memory[1].items()]}} if memory else {}),
                         "warnings": warnings}, indent=1))
    else:
        if fmt in ("table", "md"):
            click.echo(design_text(design))
        emit(render_frame(table, fmt, "report", layout))
        if fmt in ("table", "md") and memory:
            click.echo(f"\n{MEMORY_HEAD}")
            emit(render_frame(memory[0], fmt, "report.memory", layout))
        if fmt in ("table", "md") and (manifest["config"].get("repeats") or 1) > 1:
            click.echo("(step_ms: the median of every repeat's timed steps pooled; d_step_ms: B − A of each\n"
                       "repeat's medians, averaged over repeats: it need not equal the step_ms difference;\n"
                       "the same for the phases' ms and d_ms)")
        if fmt in ("table", "md") and phases.height:
            click.echo("\nper phase, timed steps (pct: median phase ÷ median step, so they need not add to 100;\n"
                       "rec_d_ms: the Δ in the recorded steps):")
            emit(render_frame(phases, fmt, "report.phases", layout))
        if fmt in ("table", "md") and critical.height:
            click.echo("\nthe recorded step along its critical path (mean rank, ms; host … waiting add up to span):")
            emit(render_frame(critical, fmt, "report.critical", layout))
        if fmt in ("table", "md"):
            for (a, b), result in diffs.items():
                click.echo("")
                emit(render_diff(a, b, result, fmt, Layout(wide=layout.wide), "mean", leads[a, b]))
    for warning in warnings:
        say(f"warning: {warning}")
    if plot_path:
        from tracekit.analyses.variants import step_split, timed_steps
        from tracekit.front.plot import report_picture

        wrote(report_picture(step_split(runs), timed_steps(table), plot_path))


def design_text(design: dict) -> str:
    """How the variants were compared, in a line or two (`variants.comparison_summary`)."""
    if design["design"] == "interleaved":
        text = (f"compared interleaved in one process: {design['rounds']} rounds of blocks of {design['block_steps']} "
                "steps, mirrored;\nd_step_ms: the mean over rounds of B − A, with its 95 % interval over rounds")
        if design.get("control_d_ms_ci"):
            lo, hi = design["control_d_ms_ci"]
            text += (f"\nA/A control {design['control']} − {design['control_of']}: {design['control_d_ms']:+.3f} ms "
                     f"[{lo:+.3f}, {hi:+.3f}]\n(its true Δ is 0: an interval without 0 says the comparison is unsound)")
        return text
    why = f" ({design['note']})" if design.get("note") else ""
    return (f"compared sequentially{why}: each variant in its own workers, {design['repeats']} "
            f"repeat{'s' if design['repeats'] > 1 else ''}")


@main.command()
@click.argument("out", type=click.Path(exists=True, file_okay=False))
@format_option
@table_layout
def check(out, fmt, layout):
    """Compare the counts found in each profiled step's traces with what the runtime counted in
    that step, and every variant's first-step loss and grad norm and its parameter checksum
    after the timed steps with the first variant's (tolerances: docs/metrics.md).

    Prints every comparison (`not recorded` where the runtime recorded no count of it), then one
    line (`all N counts match` or `K of N counts differ`, singular for 1, and how many were not recorded);
    exits 1 on any mismatch."""
    import polars as pl

    from tracekit.analyses.checks import count_check, parity_check
    from tracekit.core.loading import load_profile
    from tracekit.front.render import json_text

    manifest, runs = load_profile(out)
    counts, parity = count_check(manifest, runs, load_profile(out, names=True)[1]), parity_check(manifest)
    if fmt == "json":
        emit(json_text({"counts": counts.to_dicts(), "parity": parity.to_dicts()}))
    else:
        shown = counts if fmt == "csv" else counts.with_columns(  # a count the runtime did not record says so
            match=pl.when(pl.col("match").is_null()).then(pl.lit("not recorded"))
            .otherwise(pl.col("match").cast(pl.String).str.to_lowercase()))
        emit(render_frame(shown, fmt) + "\n\n" + render_frame(parity, fmt, "check.parity", layout))
    for row in counts.filter(~counts["match"]).iter_rows(named=True):
        shout(f"mismatch: {row['variant']} rank {row['rank']} step {row['step']} {row['count']}: "
              f"trace {row['trace']}, runtime {row['runtime']}", "tracekit check: ")
    for row in parity.filter(~parity["match"]).iter_rows(named=True):
        shout(f"mismatch: {row['variant']} rank {row['rank']} {row['figure']} "
              f"{row['value']:.6g} vs {row['base']}'s {row['base_value']:.6g} (relative {row['rel_diff']:.2g} > "
              f"{row['tolerance']:g})", "tracekit check: ")
    recorded = int(counts["match"].is_not_null().sum())
    verdict = agreement(recorded, int((~counts["match"]).sum()), "count") if recorded \
        else "no count recorded by the runtime to compare"
    if 0 < recorded < counts.height:
        verdict += f" ({counts.height - recorded} not recorded by the runtime)"
    if parity.height:
        verdict += ", " + agreement(parity.height, int((~parity["match"]).sum()), "parity figure")
    click.echo(verdict, err=fmt in ("json", "csv"))
    if not (counts["match"].all() and parity["match"].all()):
        sys.exit(1)


def agreement(n: int, differ: int, thing: str) -> str:
    """`all N things match` (`1 thing matches`) or `K of N things differ` (`1 of N things differs`)."""
    if differ:
        return f"{differ} of {counted(n, thing)} {'differs' if differ == 1 else 'differ'}"
    return f"{counted(n, thing)} matches" if n == 1 else f"all {counted(n, thing)} match"
