"""What the `table` format shows of each verb's frame: a compact default column set (the few
figures a person reads first), `--columns a,b,…` to choose, `--wide` for every column.

Only the terminal table is shaped here (and Markdown takes its short names, `render.markdown`);
json/csv keep every column in ns and bytes. In the
table, `*_ns` columns are shown as `*_ms` (3 decimals), byte counts as GiB/MiB/KiB, and a
view's shares (`*_pct`) are a part over the step's span × 100, 1 decimal: the analysis's own
column where it has one (a statistic row's is then the statistic of the steps' shares; docs/metrics.md, "Tables").
Long text wraps within the terminal width (`COLUMNS`), never cut. To show more of a verb by
default, add names to its `View.default` (raw or shown names; absent ones are skipped).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import textwrap
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import combinations

import polars as pl

from tracekit.core.errors import UsageError
from tracekit.core.demangle import demangled


@dataclass(frozen=True)
class View:
    default: tuple[str, ...] = ()  # empty: every column
    shares: dict = field(default_factory=dict)  # shown name → (part column, whole column)
    aliases: dict = field(default_factory=dict)  # raw column → shown name (before the unit suffix)
    kernel_names: tuple[str, ...] = ()  # raw columns of kernel names, shown without `void`, namespaces, arguments
    kernel_kinds: tuple[str, ...] = ()  # the rows' `kind`s whose name is a kernel's (empty: every row's)
    chains: tuple[str, ...] = ()  # raw columns of blame chains (names joined by " < "), shown short
    prose: tuple[str, ...] = ()  # raw columns of sentences: whole in Markdown, where long names are elided
    varied: tuple[str, ...] = ("run", "step")  # default columns shown only when they take more than one value
    # (a figure's column: more than one besides blanks)
    empty: str = "no figures in these traces"  # the table's one line when no row has a figure
    implied: dict = field(default_factory=dict)  # default column → the column that says it already
    telling: dict = field(default_factory=dict)  # default column → the rows' keys: shown only where two
    # rows that share those keys differ in it (the process group, dtype, device of look-alike rows)
    parts: tuple[str, ...] = ()  # default shares that add up to 100: those 0 in every row left out, said so
    one_step: bool = True  # a line names the one step where the `step` column is not shown (not twice: items)


# characters of a kernel's name in a table (more where the table has room): with pct_peak, the default kernels table leaves 45
LONGEST = 44


@dataclass(frozen=True)
class Layout:
    """The user's choice: `--columns` (shown or raw names) or `--wide`."""

    columns: tuple[str, ...] | None = None
    wide: bool = False
    longest: int = LONGEST  # a kernel's name's characters at most (more where the table has room: `render`)


SPAN = "gpu_span_ns"
KEYS = ("run", "rank", "step", "agg", "device", "path", "variant", "n_steps")  # what names a row, not a figure
DEVICE_ONLY = ("no device activity (kernel, memcpy or memset records) in these steps: {} device work. "
               "CPU-only (gloo) runs: host-side collectives in `tracekit comms`, CPU time in `summary`")
WORD = 24  # a text column is kept this wide, where its words are, before a column's name breaks
WHOLE = 32  # an identifier up to this long is kept whole where the table can make room (`cudaStreamCreateWithFlags`)
WRAPPED = 16  # text columns wider than this wrap when the table is too wide; names (run, kind) do not
VIEWS = {
    "summary": View(("run", "rank", "step", "agg", "device", "cpu_ms", "gpu_span_ms", "busy_pct",
                     "exposed_comm_pct", "host_bound"),
                    {"busy_pct": ("gpu_busy_ns", SPAN), "idle_pct": ("idle_ns", SPAN),
                     "exposed_comm_pct": ("exposed_comm_ns", SPAN), "host_idle_pct": ("host_idle_ns", SPAN)}),
    "overlap": View(("run", "rank", "step", "agg", "device", "comm_ms", "compute_ms", "overlap_pct",
                     "exposed_comm_ms", "comm_alone_ms"), empty=DEVICE_ONLY.format("overlap is a figure of")),
    "breakdown": View(("run", "rank", "step", "agg", "device", "span_ms", "category", "cause", "ms", "pct"),
                      {"pct": ("parts.ns", "span_ns")},
                      {"parts.category": "category", "parts.cause": "cause", "parts.ns": "ns", "parts.pct": "pct"},
                      empty=DEVICE_ONLY.format("the breakdown splits")),
    "syncs": View(("run", "rank", "step", "agg", "api", "count", "blocked_ms", "gpu_idle_ms", "blame"),
                  aliases={"calls.api": "api", "calls.count": "count", "calls.blocked_ns": "blocked_ns",
                           "calls.gpu_idle_ns": "gpu_idle_ns", "calls.blame": "blame", "calls.chains": "chains"},
                  chains=("calls.blame",),
                  empty="no host-blocking calls (cudaDeviceSynchronize, cudaStreamSynchronize, …) or cuda_sync "
                        "records in these steps (`--scope trace`: the whole trace)"),
    "comms": View(("run", "rank", "step", "agg", "pg", "kind", "dtype", "device", "stream", "count", "bytes", "kernel_ms",
                   "exposed_ms", "busbw_gbps", "wait_ms"),
                  aliases={f"collectives.{c}": c for c in
                           ("pg", "kind", "dtype", "device", "stream", "count", "bytes", "kernel_ns", "exposed_ns",
                            "algbw_gbps", "busbw_gbps", "transfer_ns", "wait_ns", "mismatched")},
                  varied=("run", "step"), empty="no collectives (device kernels or host-side ops) in these traces",
                  telling={c: ("path", "rank", "step", "agg", "kind") for c in ("pg", "dtype", "device", "stream")}),
    "kernels": View(("run", "rank", "step", "agg", "count", "total_ms", "mean_ms", "pct_of_busy", "category",
                     "coll_kind", "pct_peak", "name", "op"),
                    aliases={f"kernels.{c}": c for c in
                             ("name", "op", "category", "coll_kind", "count", "total_ns", "mean_ns", "pct_of_busy",
                              "tflops", "pct_peak")},
                    kernel_names=("kernels.name",), empty=DEVICE_ONLY.format("kernels lists"),
                    implied={"coll_kind": "name", "category": "name"},  # a kernel's name says what it is
                    # `--by op`: one comm row per step (record_param_comms) whose kind `comms` tells
                    telling={"coll_kind": ("path", "rank", "step", "agg", "category")}),
    "launches": View(("run", "rank", "step", "agg", "device", "api", "count", "call_ms", "delay_p50_ms", "delay_max_ms",
                      "short", "long_calls", "long_delays"),  # device_ms, delay_p90_ms: --wide
                     aliases={f"apis.{c}": c for c in ("api", "count", "call_ns", "device_ns", "delay_p50_ns",
                                                       "delay_p90_ns", "delay_max_ns", "short", "long_calls",
                                                       "long_delays")},
                     telling={"device": ("path", "rank")},  # a rank's one device says nothing
                     empty="no launches in these steps: no device activity (kernel, memcpy or memset records) with "
                           "its launching runtime or driver call in the trace (CPU-only runs launch none)"),
    "lint": View(("run", "rank", "severity", "kind", "count", "step", "detail"), prose=("detail",)),
    # the default table: the steps' shares (100 % of the span), then their items (`critical-path.items`)
    "critical-path": View(("run", "rank", "step", "agg", "span_ms", "host_pct", "runtime_pct", "gpu_pct", "comm_pct",
                           "copy_pct", "wait_pct"),
                          {"host_pct": ("host_ns", "span_ns"), "gpu_pct": ("compute_ns", "span_ns"),
                           "comm_pct": ("comm_ns", "span_ns"), "wait_pct": ("waiting_ns", "span_ns"),
                           "runtime_pct": ("runtime_ns", "span_ns"), "copy_pct": ("copy_ns", "span_ns")},
                          {f"items.{c}": c for c in ("category", "kind", "name", "ns")},
                          kernel_names=("items.name",),
                          parts=("host_pct", "runtime_pct", "gpu_pct", "comm_pct", "copy_pct", "wait_pct")),
    "critical-path.items": View(("run", "rank", "step", "agg", "category", "name", "ms"),
                                aliases={f"items.{c}": c for c in ("category", "kind", "name", "ns")},
                                kernel_names=("items.name",), one_step=False),
    "report": View(("variant", "rank", "step_ms", "d_step_ms", "d_step_ms_ci", "verdict", "peak_mem", "recompiles"),
                   {"busy_pct": ("gpu_busy_ns", SPAN), "exposed_comm_pct": ("exposed_comm_ns", SPAN),
                    "idle_pct": ("idle_ns", SPAN)},
                   {"peak_allocated_bytes": "peak_mem", "profiler_overhead": "overhead",
                    "recorded_to_timed": "rec_timed"}),
    "report.critical": View(()),
    "check.parity": View(("variant", "rank", "figure", "base", "rel_diff", "tolerance", "match")),  # values: --wide
    "report.phases": View(("variant", "phase", "ms", "pct", "d_ms", "d_ms_ci", "verdict", "rec_d_ms"),
                          aliases={"pct_of_step": "pct", "d_recorded_ms": "rec_d_ms", "recorded_ms": "rec_ms"}),
    "diff.reconciliation": View(("phase", "real", "real_ci", "verdict", "recorded", "attributed", "device", "idle"),
                                aliases={"real_d_ms": "real", "real_d_ms_ci": "real_ci", "recorded_d_ms": "recorded",
                                         "attributed_d_ms": "attributed", "device_d_ms": "device",
                                         "idle_d_ms": "idle", "unexplained_ms": "unexplained"}),
    "diff.items": View(("kind", "name", "op", "phase", "fsdp", "change", "a_ms", "b_ms", "delta_ms", "noise_ms",
                        "critical", "why"),
                       aliases={"delta_pm_ns": "noise_ns"},  # the interval's half-width: delta ± noise
                       kernel_names=("name",), kernel_kinds=("compute", "memcpy"),
                       telling={"op": ("kind", "name", "phase", "fsdp")},  # one kernel from two ops: two rows
                       varied=("phase", "fsdp")),  # a trace without phases: `unknown` on every row says nothing
    "diff.syncs": View(("api", "a_count", "a_blocked_ms", "b_count", "b_blocked_ms")),
    "diff.launches": View(("api", "a_count", "a_call_ms", "b_count", "b_call_ms")),
    "diff.collectives": View(("kind", "a_count", "a_bytes", "a_exposed_ms", "b_count", "b_bytes", "b_exposed_ms")),
}
VIEWS["syncs.trace"] = replace(VIEWS["syncs"], empty="no host-blocking calls (cudaDeviceSynchronize, "
                               "cudaStreamSynchronize, …) or cuda_sync records in these traces")


def shown_name(raw: str, view: View) -> str:
    """The column's name in the table: its alias, `_ns` → `_ms` (`ns` → `ms`)."""
    name = view.aliases.get(raw, raw)
    if name == "ns" or name.endswith("_ns"):
        return name[:-2] + "ms"
    return name


def is_bytes(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "bytes" or name.endswith("_bytes")


def human_bytes(expr: pl.Expr) -> pl.Expr:
    """Bytes as text in the largest binary unit of at least 1, 2 decimals always (`3.53 GiB`,
    `2.60 GiB`: not `2.6 GiB` beside it)."""
    text = None
    for power, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        hundredths = (expr / 2**power * 100).round(0).cast(pl.Int64)
        part = pl.format("{}.{} " + unit, hundredths // 100, (hundredths % 100).cast(pl.String).str.zfill(2))
        text = pl.when(expr >= 2**power).then(part) if text is None else text.when(expr >= 2**power).then(part)
    return text.otherwise(pl.format("{} B", expr))


# Launchers whose meaning is in their first template argument: shown as `launcher<argument>`.
LAUNCHERS = (r"^((at::native::)?(vectorized_|unrolled_|index_)?elementwise_kernel(_manual_unroll)?|"
             r"(at::native::)?reduce_kernel|(at::native::)?multi_tensor_apply_kernel|cutlass\w*::Kernel\d*|"
             r"cutlass::device_kernel|ck_tile::kentry)$")




def short_kernel_name(name: pl.Expr, longest: int = LONGEST) -> pl.Expr:
    """A kernel's base name, as `nsys stats` shows it: a mangled C++ name (`_Z…`, as HIP
    traces keep them) demangled, else its nested name (`sgl_hip::activation::act_and_mul_kernel`);
    no `void `, anonymous namespaces or `at::native::`, no template or argument lists; a generic
    launcher keeps the head of its first template argument (`cutlass::Kernel2<cutlass_80_wmma_…>`,
    `ck_tile::kentry<ck_tile::Rmsnorm2dFwd>`; `vectorized_elementwise_kernel<…FillFunctor>`
    keeps its functor's name); a Python frame keeps its file and function (`modeling_bert.py(181):
    forward`), a host op of the critical path named `enumerate(DataLoader)#…` its whole name.
    Where two different names of the column would look alike, each gets what tells it apart
    (`told_apart`: Tensile's `Cijk_… [MT256x128x64]`); past `LONGEST` characters the middle is
    elided (the full name: `--wide`, json, csv); `longest` where the table has more room."""
    clean = (name.map_batches(lambda names: pl.Series([demangled(n) if n else n for n in names], dtype=pl.String),
                              return_dtype=pl.String)
             .str.replace(r"^void ", "").str.replace_all(r"\(anonymous namespace\)::", "")
             .str.replace_all(r"\bat::native::", "").str.replace(r"^\S*/(\S+\.py\(\d+\): )", "${1}"))
    base = clean.str.extract(r"^([^<(]+)", 1).str.strip_chars()
    functor = clean.str.extract(r"([A-Za-z0-9_]+(?:_kernel_cuda|Functor|_functor))", 1)
    argument = clean.str.extract(r"^[^<(]+<\s*(?:\d+\s*,\s*)*([A-Za-z_][A-Za-z0-9_:]*)", 1)
    shown = (pl.when(base.str.contains(LAUNCHERS) & functor.is_not_null()).then(base + "<" + functor + ">")
             .when(base.str.contains(LAUNCHERS) & argument.is_not_null()).then(base + "<" + argument + ">")
             .otherwise(base))
    whole = clean.str.contains(r"^[A-Za-z_][\w.]*\([^()<>]*\)#|^\S+\.py\(\d+\): ")  # `enumerate(DataLoader)#…`, a frame
    shown = pl.when(shown.is_null() | (shown == "") | whole).then(clean).otherwise(shown)
    shown = pl.when(clean.str.starts_with("_Z")).then(mangled_head(clean)).otherwise(shown)
    return pl.struct(shown, clean.alias("__full")).map_batches(partial(told_apart, longest=longest),
                                                               return_dtype=pl.String)  # named as `name`


def kernel_column(name: pl.Expr, kinds: tuple[str, ...] = (), longest: int = LONGEST) -> pl.Expr:
    """A column of names short (`short_kernel_name`): those of the rows whose `kind` is one of
    `kinds` (a diff's compute and memcpy items; the others name an idle cause, a collective, a
    host op: a Python frame among them by its file, line and function, not its path), every
    row's without `kinds`."""
    if not kinds:
        return short_kernel_name(name, longest)
    kernel = pl.col("kind").is_in(list(kinds))
    frame = name.str.replace(r"^(\w+: )?\S*/(\S+\.py\(\d+\): )", "${1}${2}")  # `cpu_op: modeling_bert.py(181): forward`
    return pl.coalesce(short_kernel_name(pl.when(kernel).then(name), longest), frame)


def mangled_head(name: pl.Expr) -> pl.Expr:
    """The nested name at the head of a mangled name no demangler here reads (`_ZN7sgl_hip10
    activation18act_and_mul_kernelI…` → `sgl_hip::activation::act_and_mul_kernel`)."""
    def head(text: str | None) -> str | None:
        if text is None:
            return None
        at, parts = 3 if text.startswith("_ZN") else 2, []
        while (digits := re.match(r"\d+", text[at:])) and int(digits.group()) > 0:
            start = at + len(digits.group())
            parts.append(text[start:start + int(digits.group())])
            at = start + int(digits.group())
        return "::".join(parts) or text
    return name.map_batches(lambda names: pl.Series([head(n) for n in names], dtype=pl.String), return_dtype=pl.String)


def told_apart(pairs: pl.Series, longest: int = LONGEST) -> pl.Series:
    """Each (shown, full) name's shown name (a struct of the two, in that order); where different full names would be shown alike,
    with the words of its full name at the places where those names first differ from each
    other (`Cijk_Alik_Bljk_… [MT256x128x64]` beside `… [MT128x224x64]`), so that no two of them
    look alike; past `longest` characters the middle elided."""
    shown, full = (pairs.struct.field(f.name).to_list() for f in pairs.dtype.fields)
    alike: dict[str, set[str]] = {}
    for s, f in zip(shown, full):
        if s is not None:
            alike.setdefault(elided(s, None, longest), set()).add(f)
    marks = {}
    for looks, names in alike.items():
        words = {f: name_words(f or "") for f in names}
        places = sorted({first_difference(words[a], words[b]) for a, b in combinations(sorted(names), 2)})
        for f in names if len(names) > 1 else ():
            marks[looks, f] = ", ".join(words[f][i] if i < len(words[f]) else "–" for i in places)
    return pl.Series([elided(s, marks.get((elided(s, None, longest), f)), longest) for s, f in zip(shown, full)],
                     dtype=pl.String)


def name_words(name: str) -> list[str]:
    """A name's words: its runs of letters and digits; of a mangled name no demangler here
    reads (`_ZN7cutlass6KernelIN4gemm…ILi128E…`), its identifiers and its template arguments'
    values (`cutlass`, `Kernel`, `gemm`, …, `128`), never the mangling's own letters
    (`9GemmShapeI…28ELi8EEENS`)."""
    if not name.startswith("_Z"):
        return re.findall(r"[A-Za-z0-9]+", name)
    words, at = [], 0
    while at < len(name):
        value = re.match(r"L[a-z](n?\d+)E", name[at:])  # `Li64E`: the int 64
        skip = re.match(r"S[0-9A-Z]*_|T[0-9]*_", name[at:])  # a substitution, a template parameter
        size = re.match(r"[1-9]\d*", name[at:])
        if value:
            words.append(value.group(1).replace("n", "-"))
        elif size and not skip:
            start = at + size.end()
            words.append(name[start:start + int(size.group())])
            at = start + int(size.group())
            continue
        at += (value or skip).end() if value or skip else 1
    return words


def first_difference(a: list[str], b: list[str]) -> int:
    """The first place where the word lists `a` and `b` differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def elided(shown: str | None, mark: str | None, longest: int = LONGEST) -> str | None:
    """`shown` (with ` [mark]` where it has one) in at most `longest` characters: the middle of
    a longer name elided (its last 11 characters kept), the mark kept (its own middle elided
    past half of them)."""
    if shown is None:
        return None
    if mark is None:
        return shown if len(shown) <= longest else shown[:longest - 12] + "…" + shown[-11:]
    if len(mark) > longest // 2:
        mark = mark[:longest // 4] + "…" + mark[-(longest // 4):]
    tail = f" [{mark}]"
    room = longest - len(tail)
    return (shown if len(shown) <= room else shown[:room - 1] + "…") + tail


CHAIN = 52  # characters of a blame chain's names in a table: with `… N more`, one or two lines of its column


def short_chain(chain: pl.Expr) -> pl.Expr:
    """A blame chain (names joined by " < ", innermost first) as a table shows it: a Python
    frame by its file and function (`profile.py(34): run_torch_profiler`, not its whole path),
    the innermost names that fit in `CHAIN` characters (the first one always, its middle elided
    past them), then how many more there are (`< … 13 more`; the whole chain: `--wide`, json, csv)."""
    names = chain.str.split(" < ").list.eval(pl.element().str.replace(r"^\S*/(\S+\.py\(\d+\): )", "${1}"))
    fits = ((pl.element().str.len_chars() + 3).cum_sum() <= CHAIN + 3) | (pl.int_range(pl.len()) == 0)
    kept = names.list.eval(pl.element().filter(fits))
    more = names.list.len() - kept.list.len()
    text = kept.list.join(" < ")
    text = pl.when(text.str.len_chars() > CHAIN).then(
        text.str.slice(0, CHAIN - 12) + "…" + text.str.slice(-11)).otherwise(text)
    return pl.when(more > 0).then(pl.format("{} < … {} more", text, more)).otherwise(text)


def size_text(n: int) -> str:
    """A byte count as the tables show it."""
    return pl.select(human_bytes(pl.lit(n, pl.Int64))).item()


def in_units(raw: str, dtype, view: View, wide: bool = False, longest: int = LONGEST) -> pl.Expr:
    """The column as a person reads it: ns → ms (3 decimals), bytes → GiB/MiB/KiB, kernel
    names short (full with `wide`)."""
    col = pl.col(raw)
    if raw in view.kernel_names and not wide:
        return kernel_column(col, view.kernel_kinds, longest)
    if raw in view.chains and not wide:
        return short_chain(col)
    if not dtype.is_numeric():
        return col
    if raw.rsplit(".", 1)[-1] == "ns" or raw.endswith("_ns"):
        return (col / 1e6).round(3)
    if is_bytes(raw):
        return human_bytes(col)
    return col


def catalogue(frame: pl.DataFrame, view: View, wide: bool = False, longest: int = LONGEST) -> dict[str, pl.Expr]:
    """Every column the table can show, by shown name: the frame's own, its run (the trace's
    directory; its file's name where two files of the folder claim one rank, after the folder
    where two folders hold files of that name) and the view's shares."""
    out = {shown_name(c, view): in_units(c, t, view, wide, longest).alias(shown_name(c, view))
           for c, t in frame.schema.items()}
    if "path" in frame.columns:  # a trace file's folder; its own name where two traces of one rank share one
        pairs = frame.select("path", pl.col("rank") if "rank" in frame.columns else pl.lit(None).alias("rank"))
        names = run_names(pairs.unique().drop_nulls("path").rows())
        out["run"] = pl.col("path").replace_strict(names, default=None, return_dtype=pl.String).alias("run")
    raw = {shown_name(c, view): c for c in frame.columns}
    for name, (part, whole) in view.shares.items():
        if name in raw:  # the analysis's own share: on a statistic row, the statistic of the steps' shares
            out[name] = pl.col(raw[name]).round(1).alias(name)
        elif part in frame.columns and whole in frame.columns:
            out[name] = (pl.col(part) / pl.col(whole) * 100).round(1).alias(name)
    return out


def run_names(traces: list[tuple[str, int | None]]) -> dict[str, str]:
    """Each (path, rank)'s run as a table names it: the folder of a trace file (a run
    directory's own name); where two traces of one rank would take one name (two files of a
    folder, or files of folders of one name: `a/ddp/rank0.json`, `b/ddp/rank0.json`), the
    file's name without `.json`, after as many of its folders as tell it from the others so
    named (`a/ddp/rank0`; `h100/Qwen…` beside `mi300/Qwen…`)."""
    def parts(path: str) -> list[str]:
        return re.sub(r"(\.pt)?(\.trace)?\.json(\.gz)?$", "", path.rstrip("/")).split("/")

    def folder(path: str) -> str:
        whole = path.rstrip("/").split("/")
        return whole[-2] if re.search(r"\.json(\.gz)?$", path) and len(whole) > 1 else whole[-1]

    names = {path: folder(path) for path, _ in traces}
    sharing = Counter((names[path], rank) for path, rank in set(traces))
    depth = {path: 1 for path, rank in traces if sharing[names[path], rank] > 1}
    while depth:
        names.update({path: "/".join(parts(path)[-k:]) for path, k in depth.items()})
        alike = Counter(names[path] for path in depth)
        longer = [path for path, k in depth.items() if alike[names[path]] > 1 and k < len(parts(path))]
        if not longer:
            break
        depth.update({path: depth[path] + 1 for path in longer})
    return names


def chosen(frame: pl.DataFrame, view: View, layout: Layout) -> pl.DataFrame:
    """The table's columns: `layout.columns`, every column with `wide`, else the view's
    default (of its `varied` columns, those that take more than one value)."""
    shown = catalogue(frame, view, layout.wide, layout.longest)
    if layout.columns:
        names = {**{c: shown_name(c, view) for c in frame.columns},
                 **{view.aliases.get(c, c): shown_name(c, view) for c in frame.columns}, **{c: c for c in shown}}
        unknown = [c for c in layout.columns if c not in names]
        if unknown:
            raise UsageError(f"--columns: no column {', '.join(unknown)}; choose from {', '.join(shown)}")
        return frame.select(shown[names[c]] for c in layout.columns)
    if layout.wide or not view.default:  # a trace's path once, above the table (`paths_line`), not on every row
        several = "path" in frame.columns and frame.select(shown["run"].n_unique()).item() > 1  # runs
        return frame.select(shown["run" if c == "path" else shown_name(c, view)] for c in frame.columns
                            if c != "path" or several and layout.wide or not layout.wide)
    names = [c for c in view.default if c in shown and view.implied.get(c) not in shown]
    tests = {**{f"varies {c}": (shown[c] if c in KEYS else shown[c].drop_nulls()).n_unique() > 1  # a figure: besides blanks
                for c in names if c in view.varied},
             **{f"telling {c}": telling(frame, shown[c], view.telling[c], view) for c in names if c in view.telling}}
    passed = frame.select(**tests).row(0, named=True) if tests and frame.height else dict.fromkeys(tests, False)
    names = [c for c in names if passed.get(f"varies {c}", True) and passed.get(f"telling {c}", True)]
    if "step" in names and "agg" in names:  # one column: the step, or the statistic's row (`mean`)
        shown["step"] = pl.coalesce(pl.col("agg"), pl.col("step").cast(pl.String)).alias("step")
        names.remove("agg")
    return frame.select(shown[c] for c in names)


def column_width(text: str, name: str) -> int:
    """The width of the column `name` of the table `text` (by its rule; 0 if it has none)."""
    lines = text.splitlines()
    rule = next((k for k, line in enumerate(lines) if line.startswith("─")), None)
    spans = [m.span() for m in re.finditer("─+", lines[rule])] if rule else []
    return next((b - a for a, b in spans if any(line[a:b].strip() == name for line in lines[:rule])), 0)


def paths_line(frame: pl.DataFrame) -> str:
    """Above a `--wide` table, which shows a row's run (its folder) and not its path: the paths
    of its traces, once each (`path: P`, or `paths:` then one a line)."""
    paths = frame["path"].unique(maintain_order=True).to_list() if "path" in frame.columns else []
    return f"path: {paths[0]}" if len(paths) == 1 else "paths:\n" + "\n".join(f"  {p}" for p in paths) if paths else ""


def with_figures(table: pl.DataFrame) -> pl.DataFrame:
    """The table's rows that show at least one figure (a row of blank cells says nothing)."""
    figures = [c for c in table.columns if c not in KEYS]
    if not figures:
        return table
    return table.filter(~pl.all_horizontal([pl.col(c).is_null() | (pl.col(c).cast(pl.String) == "") for c in figures]))


def telling(frame: pl.DataFrame, column: pl.Expr, keys: tuple[str, ...], view: View) -> pl.Expr:
    """Whether rows that share `keys` (shown names; those the frame has) differ in `column`,
    blanks aside (an expression of one boolean)."""
    raw = {view.aliases.get(c, c): c for c in frame.columns}
    by = [pl.col(raw[k]) for k in keys if k in raw] or [pl.lit(0)]
    return column.drop_nulls().n_unique().over(by).max() > 1  # a blank (a step with no row of its own) tells nothing


def path_text(path: str, room: int) -> str:
    """`path` as a table's heading shows it in at most `room` characters: relative to the
    current folder where it lies under it, then, where still longer, its middle folders elided
    (`/work/…/trace_diff/control/control.json.gz`), its file's name kept whole where it fits."""
    here = os.getcwd().rstrip("/") + "/"
    text = path[len(here):] if path.startswith(here) else path
    if len(text) <= room:
        return text
    parts = text.split("/")
    head, tail = ("/".join(parts[:2]) if text.startswith("/") else parts[0]), parts[-1]
    for part in reversed(parts[2 if text.startswith("/") else 1:-1]):
        if len(f"{head}/…/{part}/{tail}") > room:
            break
        tail = f"{part}/{tail}"
    text = f"{head}/…/{tail}"
    return text if len(text) <= room else "…" + text[len(text) - room + 1:]


def terminal_width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


IDENTIFIERS = ("step", "rank", "device", "stream", "pg")  # numbers that name something: no separators


def cell(value, decimals: int, separators: bool = True, whole: bool = False, share: bool = False) -> str:
    """A value as the table prints it: blank for null, thousands separators (not in
    identifiers), a column's fixed decimals; in a column of counts (`whole`) a whole value as
    the integer it is, its units under the units of the column's averages (`6  ` over `3.7`);
    in a share's or a rate's (`share`) a value above 0 that its decimals would show as 0 as
    the least they show (`<0.01`: a bus bandwidth of 0.0065 GB/s is not `0.0`)."""
    if share and isinstance(value, float) and 0 < abs(value) < 0.5 * 10 ** -decimals:
        return ("-" if value < 0 else "") + f"<{10 ** -decimals:.{decimals}f}"
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if separators else str(value)
    if isinstance(value, float) and whole and value.is_integer():
        return f"{int(value):,}" + " " * (decimals + 1 if decimals else 0)
    if isinstance(value, float):
        return f"{value:,.{decimals}f}" if math.isfinite(value) else str(value)
    return str(value)


SHARE = re.compile(r"(?:^|[._])(?:pct|gbps)(?:_|$)")  # a percentage or a rate: `busy_pct`, `pct_of_busy`, `busbw_gbps`
RELATIVE = ("rel_diff", "tolerance")  # relative figures, read against each other: 3 decimals always


def decimals(values: pl.Series) -> int:
    """The decimals of a float column, the same on every row: 3 for ms and for relative
    differences and their tolerances (`0.000` beside `0.001`, never `0`); what the values need
    (1 or 2) for percentages and rates (`pct_of_busy` too: a mean of 0.795 reads `0.80`, not
    beside `14.050`); else what the values need, at most 3."""
    if values.name == "ms" or values.name.endswith("_ms") or values.name.endswith(RELATIVE):
        return 3
    most = 2 if SHARE.search(values.name) else 3
    needed = [len(f"{v:.{most}f}".rstrip("0").partition(".")[2]) if abs(v) >= 0.5 * 10 ** -most or v == 0 else most
              for v in values if isinstance(v, float) and math.isfinite(v)]  # a tiny figure: `<0.01`
    return max(needed, default=0) if most == 3 else max([1, *needed])


def header_pieces(name: str, size: int) -> list[str]:
    """A column's name on as many lines as `size` needs, broken after its underscores (only where
    the table fits the terminal no other way: `table_text`)."""
    parts, lines = re.findall(r"[^_]+_?|_", name), [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + len(part) > size:
            lines.append("")
        lines[-1] += part
    return lines


# Where a word too long for its line breaks: at a token's boundary, after `::`, `.`, `/`, `<`, `,`,
# `(`, `:`, `-`, `#` or `…`; inside an identifier only after an underscore (not one of a run, `__next__`,
# nor one that starts a name, `._x`, `#_x`), where it has no boundary that fits; never inside a run of
# letters and digits (`cudaDevice|Synchronize`) but where there is no other place at all.
TOKEN_BREAKS = re.compile(r"::|[./<,(:\-…#]")
IDENTIFIER_BREAKS = re.compile(r"(?<![._#])_(?!_)")
BREAKS = re.compile(f"{TOKEN_BREAKS.pattern}|{IDENTIFIER_BREAKS.pattern}")
PIECE = 4  # the fewest characters of a word put at the end of a line before the rest of it
NARROW = 12  # a text column's width at least, where the table cannot give it its words (WORD)
WIDE = 2 * WORD  # a text column's width at least where the table is wider than the terminal anyway (--wide)
# Spaces that never end a line: between a number and its unit (`13.742 ms`, `0.026 / ms`, `1.20 ×`,
# `3.53 GiB`, `… 3 more`), and in `rank 0`, `step 12`
KEPT_SPACES = re.compile(r"(?<=\d) (?=(?:ns|µs|us|ms|s|min|%|×|x|B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|GB/s|TB/s|MB/s|"
                         r"TFLOP/s|TFLOPs?|GHz|MHz|more)(?![\w/]))"
                         r"|(?<=\d) (?=/ (?:ns|µs|us|ms|s)\b)|(?<=\d /) (?=(?:ns|µs|us|ms|s)\b)"
                         r"|(?:(?<=\brank)|(?<=\bstep)) (?=\d)|(?<=…) (?=\d+ more)")
NBSP = "\u00a0"


def kept_together(text: str) -> str:
    """`text` with the spaces that must not end a line (`KEPT_SPACES`) made no-break spaces."""
    return KEPT_SPACES.sub(NBSP, text)


def filled(text: str, width: int, indent: str = "") -> str:
    """Prose (a note, a sentence, a heading) filled in lines of at most `width`, the lines after
    the first indented by `indent`: a number kept with its unit (`KEPT_SPACES`), a path or name
    whole on its line, never broken inside."""
    return textwrap.fill(kept_together(text), width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False).replace(NBSP, " ")


def words_of(text: str) -> list[str]:
    """`text`'s words, split at its spaces but those `kept_together` (no-break spaces)."""
    return [w for w in re.split(r"[^\S\u00a0]+", kept_together(text)) if w]


CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z][a-z])")  # a camel-case word's start: `…AndAsync|Communication`


def cut_at(word: str, room: int) -> int:
    """Where `word` breaks to fill `room`: after its last token boundary that fits, else (none
    of at least `PIECE` characters) after its last underscore that fits (`BREAKS`), else
    before its last camel-case word that fits (`LinearWithGradAccumulationAndAsync` over
    `Communication`, not `…AndAsyn` over `cCommunication`); 0 if none."""
    cut = max((m.end() for m in TOKEN_BREAKS.finditer(word) if m.end() <= room), default=0)
    if cut >= PIECE:
        return cut
    cut = max((m.end() for m in BREAKS.finditer(word) if m.end() <= room), default=0)
    return cut or max((m.start() for m in CAMEL.finditer(word) if PIECE <= m.start() <= room), default=0)


def wrapped(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width`, filled word by word (a number kept with its unit:
    `kept_together`): a word that does not fit the line's rest starts the next line; one longer
    than a line is broken at its last boundary that fits (`cut_at`: `FullyShardedDataParallel.`
    over `_pre_forward`), mid-identifier only where it has none."""
    lines, line = [], ""
    for word in words_of(text):
        while word:
            sep = " " if line else ""
            room = width - len(line) - len(sep)
            if len(word) <= room:
                line, word = line + sep + word, ""
                continue
            cut = cut_at(word, room)
            if line and (cut < PIECE or len(word) <= width):
                lines.append(line)  # the word starts the next line
                line = ""
                continue
            cut = cut or width
            lines.append(line + sep + word[:cut])
            line, word = "", word[cut:]
    lines = lines + [line] if line or not lines else lines
    return [piece.replace(NBSP, " ") for piece in lines]


def atoms_of(word: str) -> list[str]:
    """The pieces of `word` between the places it may break (`BREAKS`), each with its mark."""
    ends = [m.end() for m in BREAKS.finditer(word) if 0 < m.end() < len(word)]
    return [word[a:b] for a, b in zip([0, *ends], [*ends, len(word)])]


def table_text(frame: pl.DataFrame, width: int | None = None, whole: set[str] = frozenset(), wide: bool = False) -> str:
    """The frame as an aligned plain table (numbers right, text left, a rule under the names),
    two spaces between columns. A figure's column is never narrower than its widest figure, and
    its name breaks (after an underscore) only where the table would not fit otherwise; when the table is wider than `width` (default: the
    terminal's), the text columns wrap (at `BREAKS`) to share what the others leave, each kept
    as wide as its longest word (up to `WORD`) where there is room, else its longest identifier,
    else `NARROW`, else what is left, and `WIDE` where the table is wider than the terminal all
    the same (`--wide`, `wide`: its names whole, its text columns `WIDE` wide where the terminal
    is narrower); nothing is cut. The columns `whole` are counts: their whole values shown as integers (`cell`)."""
    width = width or terminal_width()
    columns = frame.columns
    texts = [[cell(v, decimals(frame[c]), c not in IDENTIFIERS, c in whole, bool(SHARE.search(c))) for v in frame[c]]
             for c in columns]
    numeric = [t.is_numeric() or c == "step" for c, t in zip(columns, frame.dtypes)]
    sizes = [max(len(c), max(map(len, column), default=0)) for c, column in zip(columns, texts)]
    gaps = 2 * (len(columns) - 1)
    wrap = [i for i, t in enumerate(frame.dtypes) if t == pl.String and sizes[i] > WRAPPED]
    if wide:  # the terminal, or what its figures and its text columns at `WIDE` take
        width = max(width, sum(s for i, s in enumerate(sizes) if i not in wrap) + gaps + sum(
            max(len(columns[i]), min(sizes[i], WIDE)) for i in wrap))
    room = width - sum(s for i, s in enumerate(sizes) if i not in wrap) - gaps
    words = {i: max((len(w) for t in texts[i] for w in words_of(t)), default=0) for i in wrap}
    atoms = {i: max((len(a) for t in texts[i] for w in words_of(t) for a in atoms_of(w)), default=0) for i in wrap}

    def at_least(most: dict) -> dict:  # an identifier up to `WHOLE` characters, words up to `WORD`
        return {i: max(len(columns[i]), min(sizes[i], WHOLE if most is atoms else WORD, most[i])) for i in wrap}

    heads = [[c] for c in columns]
    fixed = [i for i in range(len(columns)) if i not in wrap]
    broken = {i: max(max(map(len, texts[i]), default=0), *map(len, header_pieces(columns[i], 1))) for i in fixed}
    narrow = sum(max(len(columns[i]), min(sizes[i], NARROW)) for i in wrap)
    fits = room + sum(sizes[i] - broken[i] for i in fixed) >= narrow
    for i in sorted(fixed, key=lambda i: broken[i] - sizes[i]) if fits or not wide else []:  # narrower all the same
        if sum(at_least(atoms).values()) <= room:  # a name breaks only where nothing else fits
            break
        heads[i] = header_pieces(columns[i], max(max(map(len, texts[i]), default=0),
                                                 room - sum(at_least(atoms).values()) + sizes[i]))
        room += sizes[i] - max(map(len, heads[i] + texts[i]))
        sizes[i] = max(map(len, heads[i] + texts[i]))
    least = at_least(words)
    if sum(least.values()) > room:  # each as wide as its words, else its identifiers, where it fits
        least = {i: max(len(columns[i]), min(sizes[i], NARROW)) for i in wrap}
        for most in (atoms, words):
            for i in sorted(wrap, key=lambda i: sizes[i]):
                wider = max(least[i], at_least(most)[i])
                if sum(least.values()) - least[i] + wider <= room:
                    least[i] = wider
    if sum(least.values()) > room:  # what is left, down to the names' width
        least = {i: len(columns[i]) for i in wrap}
    if sum(least.values()) > room:  # wider than the terminal whatever the text does (--wide)
        least = {i: max(len(columns[i]), min(sizes[i], WIDE)) for i in wrap}
    if sum(sizes[i] for i in wrap) > room:
        order = sorted(wrap, key=lambda i: sizes[i])  # the narrow ones keep their width
        for k, i in enumerate(order):
            rest = order[k + 1:]
            sizes[i] = max(least[i], min(sizes[i], room // (len(rest) + 1), room - sum(least[j] for j in rest)))
            room -= sizes[i]

    def lines(pieces: list[list[str]]) -> list[str]:
        return ["  ".join((p[k] if k < len(p) else "").rjust(sizes[i]) if numeric[i] else
                          (p[k] if k < len(p) else "").ljust(sizes[i]) for i, p in enumerate(pieces)).rstrip()
                for k in range(max(map(len, pieces)))]

    def row_lines(row: list[str]) -> list[str]:
        return lines([wrapped(t, sizes[i]) if i in wrap else [t] for i, t in enumerate(row)])

    out = lines(heads) + ["  ".join("─" * s for s in sizes)]
    for row in zip(*texts):
        out += row_lines(list(row))
    return "\n".join(out)
