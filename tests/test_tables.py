"""The table format: what a person reads first, fitting the terminal; machine formats keep
every column at full precision (docs/metrics.md, "Tables")."""

import json

import pytest
import synth
from click.testing import CliRunner
from conftest import DATA, messages

from tracekit.front.cli import main
from tracekit.front.views import column_width

RUN = DATA / "h200x2-blocks4"
FSDP2 = RUN / "fsdp2"


def run(*args, columns=100):
    result = CliRunner(env={"COLUMNS": str(columns)}).invoke(main, list(map(str, args)))
    assert result.exit_code == 0, result.output
    return result.stdout


VERBS = [("summary", FSDP2), ("comms", FSDP2), ("syncs", FSDP2), ("overlap", FSDP2), ("breakdown", FSDP2),
         ("lint", FSDP2), ("kernels", FSDP2), ("kernels", "--by", "op", FSDP2), ("kernels", "--by", "category", FSDP2),
         ("check", RUN), ("report", RUN), ("diff", RUN / "fsdp1", FSDP2), ("cache", "info")]


@pytest.mark.parametrize("args", VERBS, ids=lambda a: " ".join(map(str, a[:3])))
def test_the_default_table_fits_100_columns(args):
    lines = run(*args).splitlines()
    assert lines and max(map(len, lines)) <= 100


def test_wide_has_every_column_and_columns_chooses():
    wide = run("summary", "--wide", FSDP2)
    assert "collectives.reduce_scatter" in wide and "comm_alone_ms" in wide
    chosen = run("summary", "--columns", "rank,gpu_span_ns,busy_pct", FSDP2).splitlines()
    assert chosen[0].split() == ["rank", "gpu_span_ms", "busy_pct"]
    # rank 0's span is 40,927,090 ns in the json: 40.927 ms in the table
    assert chosen[2].split()[:2] == ["0", "40.927"]


def test_an_unknown_column_is_one_line_exit_2():
    result = CliRunner().invoke(main, ["summary", "--columns", "rank,nope", str(FSDP2)])
    assert result.exit_code == 2 and len(messages(result.stderr)) == 1 and "nope" in result.stderr


def test_shares_of_the_step_span(tmp_path):
    """Kernels at [10, 20) and [40, 50) µs: span 40 µs, busy 20 (50.0 %), idle 20 (50.0 %)."""
    events = [synth.step(1, 0.0, 100.0), *synth.launched("k", 1.0, 10.0, 10.0, corr=1),
              *synth.launched("k", 2.0, 40.0, 10.0, corr=2)]
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    lines = run("summary", "--columns", "gpu_span_ms,busy_pct,idle_pct", path).splitlines()
    assert lines[2].split() == ["0.040", "50.0", "50.0"]


def test_bytes_read_in_binary_units():
    """fsdp2 rank 0's all-gathers move 310,148,096 bytes (json) = 295.78 MiB."""
    doc = json.loads(run("comms", "--format", "json", "--rank", 0, FSDP2))
    (gather,) = [c for c in doc["traces"][0]["steps"][0]["collectives"] if c["kind"] == "all_gather"]
    assert gather["bytes"] == 310148096
    assert "295.78 MiB" in run("comms", "--rank", 0, FSDP2)


def test_csv_keeps_the_full_text_markdown_the_table_s_names():
    md = run("lint", "--format", "md", RUN / "fsdp1")
    details = [line for line in md.splitlines() if "…" in line]
    assert not details and max(map(len, md.splitlines())) > 200  # a lint detail is a sentence: whole
    kernel = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    assert kernel in run("kernels", "--format", "csv", FSDP2)
    md = run("kernels", "--format", "md", FSDP2)
    assert kernel not in md and "| ncclDevKernel_AllGather_RING_LL " in md


def markdown_cells(text: str) -> list[dict]:
    """The rows of a Markdown table as {column: cell}."""
    lines = [line.strip().strip("|").split("|") for line in text.splitlines() if line.startswith("|")]
    names = [c.strip() for c in lines[0]]
    return [dict(zip(names, (c.strip() for c in line))) for line in lines[2:]]


@pytest.mark.parametrize("verb", ["kernels", "syncs", "critical-path"])
def test_markdown_shows_ms_and_no_enormous_cell(verb):
    """TraceLens' Qwen trace in Markdown: lines of 1,075–2,173 characters (templated kernel
    names, 20-name blame chains, chains as JSON) and times in ns. Now the times are in ms, as
    in the table, and no cell passes 120 characters; csv keeps ns and the whole text. (Its
    critical path is the host's, with no long name: TraceLens' torch.compile trace's runs
    through its `Cijk_…` GEMMs.)"""
    import csv
    import io

    compiled = TRACELENS_QWEN.parents[1] / "torch_compile_triton" / "trace.json.gz"
    trace = compiled if verb == "critical-path" else TRACELENS_QWEN
    md = run(verb, "--format", "md", trace)
    rows = markdown_cells(md)
    assert rows and not [c for c in rows[0] if c == "ns" or c.endswith("_ns")]
    assert max(len(cell) for row in rows for cell in row.values()) <= 120
    assert max(map(len, md.splitlines())) < 600
    full = list(csv.DictReader(io.StringIO(run(verb, "--format", "csv", trace))))
    assert max(len(v or "") for row in full for v in row.values()) > 120  # the whole text is there
    times = [c for c in full[0] if c == "ns" or c.endswith("_ns")]
    assert times and len(full) == len(rows)
    for got, whole in zip(rows, full):
        for c in times:
            if whole[c]:
                assert float(got[c[:-2] + "ms"]) == pytest.approx(int(whole[c]) / 1e6, abs=5e-4)


def test_report_and_profile_tables_in_csv():
    csv = run("report", "--format", "csv", RUN).splitlines()
    assert csv[0].startswith("variant,rank,status") and len(csv) == 11


def test_check_ends_with_one_verdict_line(tmp_path):
    import shutil

    doc = json.loads(run("check", "--format", "json", RUN))
    compared = sum(c["match"] is not None for c in doc["counts"])
    unrecorded = f"({len(doc['counts']) - compared} not recorded by the runtime)"
    assert run("check", RUN).splitlines()[-1] == \
        f"all {compared} counts match {unrecorded}, all {len(doc['parity'])} parity figures match"
    shutil.copytree(RUN, tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest["variants"]["fsdp1"]["ranks"][0]["first_step"]["loss"] *= 2
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, ["check", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == f"all {compared} counts match {unrecorded}, 1 of {len(doc['parity'])} " \
                                             "parity figures differs"  # one of them: it read "differ"


TRACELENS_QWEN = DATA / "wild" / "tracelens" / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def table_rows(text: str) -> list[list[str]]:
    """A table's rows, each the lines it takes (a row starts where its first column has text),
    to its end (a blank line) and without the notes under it (`(not shown, …)`)."""
    lines = text.splitlines()
    body = lines[[i for i, line in enumerate(lines) if line.startswith("─")][0] + 1:]
    body = [line for line in (body[:body.index("")] if "" in body else body) if not line.startswith("(")]
    rows = []
    for line in body:
        if line[:1] != " " or line.lstrip()[:1].isdigit() and line[:4].strip():
            rows.append([line])
        else:
            rows[-1].append(line)
    return rows


def enclosing_names(path, api: str) -> list[str]:
    """From the trace file itself: the names of the events on the thread of the (first) `api`
    call that enclose it, innermost first (ProfilerStep#N left out, as syncs' blame does)."""
    import gzip

    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    call = next(e for e in spans if e["name"] == api)
    inside = [e for e in spans if e is not call and e.get("cat") != "cuda_runtime" and e["tid"] == call["tid"]
              and e["pid"] == call["pid"] and e["ts"] <= call["ts"] and e["ts"] + e["dur"] >= call["ts"] + call["dur"]
              and not e["name"].startswith("ProfilerStep#")]
    return [e["name"] for e in sorted(inside, key=lambda e: (-e["ts"], e["ts"] + e["dur"]))]


def test_a_syncs_row_takes_two_lines_its_whole_blame_chain_in_json_and_wide():
    """TraceLens' traces blame a sync on 20-odd enclosing ops and Python frames: the table row
    shows the innermost and how many more, in one or two lines; json and --wide the whole chain."""
    chain = enclosing_names(TRACELENS_QWEN, "cudaStreamSynchronize")
    assert len(chain) > 10
    rows = [r for r in table_rows(run("syncs", TRACELENS_QWEN)) if "cudaStreamSynchronize" in r[0]]
    assert rows and all(len(r) <= 2 for r in rows)
    shown = " ".join(" ".join(r) for r in rows)
    assert chain[0] in shown and f"… {len(chain) - 2} more" in shown
    doc = json.loads(run("syncs", "--format", "json", TRACELENS_QWEN))
    blamed = [c["blame"] for s in doc["traces"][0]["steps"] for c in s["calls"] if c["api"] == "cudaStreamSynchronize"]
    assert blamed == [chain]
    wide = [r for r in table_rows(run("syncs", "--wide", "--columns", "api,blame", TRACELENS_QWEN, columns=2000))
            if "cudaStreamSynchronize" in r[0]]
    assert wide[0][0].split(None, 1)[1] == " < ".join(chain)


def column_pieces(text: str, name: str) -> list[list[str]]:
    """Per table row, the text of column `name` on each of its lines (its extent: its rule)."""
    import re

    text = next(block for block in text.split("\n\n") if name in block.splitlines()[0].split())  # its table
    lines = text.splitlines()
    rule = next(line for line in lines if line.startswith("─"))
    extents = [m.span() for m in re.finditer("─+", rule)]
    start, end = next((a, b) for a, b in extents if lines[0][a:b].strip() == name)
    return [[line[start:end].strip() for line in row if line[start:end].strip()] for row in table_rows(text)]


def mid_word_breaks(pieces: list[str], names: set[str]) -> list[str]:
    """The line breaks of a cell (its `pieces`, one a line) that are neither at a space of its
    name (one of `names`) nor after one of `._:/<,(-…#`; None when the cell is none of the names."""
    for name in names:
        bad, pos = [], 0
        for a, b in zip(pieces, pieces[1:] + [None]):
            if not name.startswith(a, pos):
                break
            pos += len(a)
            if b is None:
                return bad if pos == len(name) else None
            if name.startswith(" ", pos):
                pos += 1
            elif not a.endswith(tuple("._:/<,(-…#")):
                bad.append(f"{a}|{b}")
    return None


def shown_names(kind: str, doc) -> set[str]:
    """The names the table shows (kernel names short, as the table's views make them)."""
    import polars as pl

    from tracekit.front.views import VIEWS, kernel_column, short_kernel_name

    lengths = range(44, 101)  # elided to 44 characters, or as many more as the table has room for
    if kind == "diff":  # its compute and memcpy items' kernels short, the others as they are
        items = pl.DataFrame(doc["items"]).select("kind", "name")
        return {n for k in lengths
                for n in items.select(kernel_column(pl.col("name"), VIEWS["diff.items"].kernel_kinds, k))["name"]}
    field = {"critical-path": "items", "kernels": "kernels"}[kind]
    full = pl.DataFrame({"n": [i["name"] for t in doc["traces"] for s in t["steps"] for i in s[field] or []]},
                        schema={"n": pl.String})
    return {n for k in lengths for n in full.select(short_kernel_name(pl.col("n"), k))["n"]}


@pytest.mark.parametrize("args", [
    ("critical-path", DATA / "h200x2-small" / "fsdp1"), ("kernels", "--agg", "mean", DATA / "h200x2-small"),
    ("diff", "--ranks", "mean", DATA / "h200x2-small" / "ddp", DATA / "h200x2-small" / "fsdp1"),
], ids=["critical-path", "kernels", "diff"])
def test_names_break_at_boundaries_not_mid_identifier(args):
    """At 100 columns a name too long for its column breaks at a space, after `.`, `::`, `_`,
    `<`, `…`… (`FullyShardedDataParallel.` over `_post_backward_hook`, never
    `FullyShardedDataParallel._po` over `st_backward_hook`), and never inside a run of letters
    and digits, camel case included (`cudaDevice` over `Synchronize`, `…z_coop` over `B_NNT`:
    issue 27, D3). critical-path at 60 columns: its items' table has room for them at 100."""
    text, doc = run(*args, columns=60 if args[0] == "critical-path" else 100), json.loads(run(*args, "--format", "json"))
    if args[0] == "diff":
        text = text[text.index("kind     name"):].split("\n\n")[0]
    names = shown_names(args[0], doc) | {f"{n} more items" for n in range(1000)}
    cells = [p for p in column_pieces(text, "name") if len(p) > 1]
    assert cells
    found = {" / ".join(p): mid_word_breaks(p, names) for p in cells}
    assert all(v is not None for v in found.values()), [k for k, v in found.items() if v is None]
    assert not [v for v in found.values() if v], found


def test_a_host_item_named_with_its_arguments_keeps_them():
    """`critical-path` shows its items' names short as kernel names; the TensorBoard plugin's
    ResNet-50 steps spend most host time in `enumerate(DataLoader)#_SingleProcessDataLoaderIter.
    __next__`, which was shown as `enumerate`."""
    path = DATA / "wild" / "tensorboard-plugin" / "resnet50_num_workers_0"
    names = {i["name"] for t in json.loads(run("critical-path", "--format", "json", path))["traces"]
             for s in t["steps"] for i in s["items"]}
    assert "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" in names
    cells = ["".join(p) for p in column_pieces(run("critical-path", path), "name")]  # broken at `(`, `_`: no space
    assert "enumerate" not in cells and any(c.startswith("enumerate(DataLoader)#") for c in cells)


def test_wide_keeps_every_figure_readable_and_the_names_long():
    """`kernels --wide` of TraceLens' MI300 Qwen trace (Tensile `Cijk_…` names of 300+
    characters): the table is wider than the terminal all the same, so no column's name breaks
    and no figure's column narrows, and the names wrap in lines of 48 characters (`views.WIDE`),
    not 4 (issue 27, D5); the trace's path is said once above the table, not on every row (it
    took 48 columns of each: issue 27, item 4), and a folder's rows name their run."""
    path = DATA / "wild" / "tracelens" / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    lines = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["kernels", "--wide", "--top", "3", str(path)]).stdout.splitlines()
    assert lines[0] == f"path: {path}" and lines[2].startswith("─")  # the names on one line
    assert lines[1].split() == ["rank", "step", "device", "gpu_busy_ms", "peak_sku", "name", "category", "coll_kind",
                                "count", "total_ms", "mean_ms", "pct_of_busy", "tflops", "pct_peak"]
    widths = {name: len(rule) for name, rule in zip(lines[1].split(), lines[2].split())}
    assert widths["name"] == 48 and widths["pct_of_busy"] == len("pct_of_busy")
    assert sum(str(path) in line for line in lines) == 1
    run_folder = DATA / "h200x2-small"
    lines = run("kernels", "--wide", "--top", "2", run_folder).splitlines()
    paths = sorted(str(p) for p in run_folder.glob("*/rank*.trace.json.gz"))
    assert lines[0] == "paths:" and sorted(line.strip() for line in lines[1:11]) == paths
    assert lines[11].split()[:2] == ["run", "rank"] and not any(str(run_folder) in line for line in lines[12:])


def test_a_column_name_breaks_only_where_the_table_fits_no_other_way():
    """`critical-path` of HTA's Triton example and `kernels --by op` of the DDP H200 trace fit 100
    columns with every column's name whole (they printed `host_` over `pct` to widen the names,
    which fit whole all the same: issue 27, D3); a name breaks, after an underscore, only where
    an item's identifier would be cut otherwise."""
    for args in (["critical-path", DATA / "external" / "hta-tests-data" / "triton_example" / "triton_example.json.gz"],
                 ["kernels", "--by", "op", DATA / "h200x2-blocks4" / "ddp" / "rank0.pt.trace.json.gz"]):
        lines = CliRunner(env={"COLUMNS": "100"}).invoke(main, list(map(str, args))).stdout.splitlines()
        assert lines[1].startswith("─") and max(map(len, lines)) <= 100, lines[:3]


WILD = DATA / "wild" / "tracelens"


@pytest.mark.parametrize("path", [WILD / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                                  WILD / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz",
                                  WILD / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"],
                         ids=["mi300-tensile", "sglang-aiter", "h100-bert"])
def test_short_names_stay_apart_where_the_names_differ(path):
    """Tensile's `Cijk_…` GEMMs, aiter's mangled kernels and BERT's Python frames (issue 27, D4):
    in `kernels --top 40` and `critical-path --top 40` two different names never look alike."""
    import polars as pl

    from tracekit.front.views import short_kernel_name

    for kind in ("kernels", "critical-path"):
        doc = json.loads(run(kind, "--top", "40", "--format", "json", path))
        field = {"critical-path": "items", "kernels": "kernels"}[kind]
        full = sorted({i["name"] for t in doc["traces"] for s in t["steps"] for i in s[field] or []})
        short = pl.DataFrame({"n": full}).select(short_kernel_name(pl.col("n")))["n"].to_list()
        assert len(set(short)) == len(full), sorted(s for s in short if short.count(s) > 1)
        assert not [s for s in short if s.startswith("_Z")] and max(map(len, short)) <= 44


def test_tensile_aiter_and_python_frames_read_as_what_they_are():
    """The two Tensile GEMMs of the MI300 Qwen trace by their macro tiles; aiter's kernels
    demangled (libstdc++'s `__cxa_demangle`, std::bfloat16_t read for older ones); a BERT
    module's frame with its line and function (issue 27, D4)."""
    kernels = run("kernels", "--top", "2", WILD / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    assert "[MT256x128x64]" in kernels and "[MT128x224x64]" in kernels
    sglang = run("kernels", "--top", "12", WILD / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz")
    assert "aiter::add_rmsnorm_quant_kernel [256]" in sglang and "aiter::add_rmsnorm_quant_kernel [64]" in sglang
    assert "sgl_hip::activation::act_and_mul_kernel" in sglang and "_Z" not in sglang
    bert = [" ".join(p) for p in column_pieces(run("critical-path", "--top", "20", WILD / "h100" /
                                                   "gaunernst_bert-small-uncased__1016001.json.gz"), "name")]
    assert "modeling_bert.py(181): forward" in bert and "transformers/models/bert/modeling_bert.py" not in bert


def diff_items_text(text: str) -> str:
    """The items' table of `diff`'s first (or only) rank (its note of blank columns left out)."""
    table = text[text.index("\nkind ") + 1:].split("\n\n")[0]
    return "\n".join(line for line in table.splitlines() if not line.startswith("(not shown"))


def test_diff_shows_kernels_short_and_keeps_distinct_ones_apart():
    """`diff` of TraceLens' BERT and Qwen, H100 against MI300 (issue 27, item 1): the BERT H100
    trace runs three different `cutlass::Kernel2<…>` GEMMs (read from its JSON): three items, not
    one `cutlass::Kernel2`, each shown short (`kernels`' names, at most 44 characters) and
    unlike the others; Qwen's Tensile `Cijk_…` GEMMs (300+ characters, their full names in json
    and with --wide) take at most three lines each, not 19."""
    import gzip

    bert = [WILD / side / "gaunernst_bert-small-uncased__1016001.json.gz" for side in ("h100", "mi300")]
    events = json.loads(gzip.decompress(bert[0].read_bytes()))["traceEvents"]
    launched = {e["name"].split("<", 1)[1].split(">", 1)[0] for e in events
                if e.get("cat") == "kernel" and "cutlass::Kernel2<" in e["name"]}
    assert len(launched) == 3
    doc = json.loads(run("diff", "--top", "40", "--format", "json", *bert))
    assert {i["name"] for i in doc["items"] if i["name"].startswith("cutlass")} == \
        {f"cutlass::Kernel2<{k}>" for k in launched}
    text = diff_items_text(run("diff", "--top", "40", *bert))
    cells = ["".join(p) for p in column_pieces(text, "name")]
    shown = [c for c in cells if c.startswith("cutlass::Kernel2<")]
    # 44 characters, or two lines of a name column that wraps (`render.roomier`)
    longest = max(44, 2 * column_width(text, "name"))
    assert len(shown) == len(set(shown)) == 3 and max(map(len, shown)) <= longest, shown  # whole where they fit
    qwen = [WILD / side / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz" for side in ("h100", "mi300")]
    full = [i["name"] for i in json.loads(run("diff", "--format", "json", *qwen))["items"]]  # the rows' order
    assert min(len(n) for n in full if n.startswith("Cijk")) > 300
    rows = column_pieces(diff_items_text(run("diff", *qwen)), "name")
    tensile = {(f, " ".join(p)) for f, p in zip(full, rows, strict=True) if f.startswith("Cijk")}
    assert max(len(p) for p in rows if p[0].startswith("Cijk")) <= 3  # 19 lines before
    assert len({f for f, _ in tensile}) == len({s for _, s in tensile}) == len(tensile) >= 2  # one look per name
    wide = ["".join(p) for p in column_pieces(diff_items_text(run("diff", "--wide", *qwen)), "name")]
    assert wide == full


def test_a_long_name_breaks_at_a_token_boundary_never_inside_a_dunder():
    """A word too long for its line breaks after a token's boundary (`#`, `.`, `::`) before an
    underscore inside an identifier, and never inside a run of underscores (`__next__`,
    `kernel__5x`): the TensorBoard ResNet's `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`
    in `breakdown`'s 47-column cause was `…#_` over `SingleProcessDataLoaderIter.__next__` (issue 27, item 5)."""
    from tracekit.front.views import wrapped

    name = "cpu_op: enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    assert wrapped(name, 47) == ["cpu_op: enumerate(DataLoader)#", "_SingleProcessDataLoaderIter.__next__"]
    assert wrapped("sm90_xmma_gemm_bf16bf16_bf16f32_…__5x_cublas", 19) == [
        "sm90_xmma_gemm_", "bf16bf16_bf16f32_…", "__5x_cublas"]  # was `…_` over `_5x_cublas`
    assert wrapped("autograd::engine::evaluate_function: AddBackward0", 31) == [
        "autograd::engine::", "evaluate_function: AddBackward0"]
    cells = column_pieces(run("breakdown", DATA / "wild" / "tensorboard-plugin" / "resnet50_num_workers_0"), "cause")
    broken = [p for p in cells if len(p) > 1]
    assert broken and all(p[0].endswith(("#", ".", "::", ":")) or p[1].startswith("…") for p in broken), broken


def test_markdown_has_the_table_s_decimals_and_blanks_for_missing_values():
    """Markdown of HTA's trace_diff test trace with `--agg mean` wrote `65.090000` for a share the
    table shows as `65.09` (a mean needing six decimals set its column's), and of the DDP H200
    trace `16.84` beside the table's `16.840` ms; HTA's simple-add kernels wrote `null` where a
    kernel has no collective kind or FLOPs (issue 27, item 6). Now each float column has the
    table's decimals (the same cells), and a missing value is blank as in the table."""
    figures = ("cpu_ms", "compute_ms", "overlap_pct")
    for args in (["--agg", "mean", DATA / "external" / "hta-tests-data" / "trace_diff" / "test" / "test.json.gz"],
                 [DATA / "h200x2-small" / "ddp"]):
        table = table_rows(run("summary", "--columns", ",".join(figures), *args))
        md = markdown_cells(run("summary", "--format", "md", *args))
        assert [[row[f] for f in figures] for row in md] == [row[0].split() for row in table]
    kernels = run("kernels", "--format", "md", DATA / "external" / "hta-simple-add" /
                  "benchmark_result_493459_1694039959_trace.json.gz")
    rows = markdown_cells(kernels)
    assert "null" not in kernels and rows and all(r["kernels.coll_kind"] == "" for r in rows)


def test_relative_differences_keep_their_tolerances_decimals():
    """`check` of the one-H200 CUPTI run: fsdp2's parity figures equal fsdp1's, and `rel_diff`
    read `0` where the H200 × 2 run's reads `0.000` beside its tolerance's `0.001` (one format for
    the column whatever the run: issue 27, item 7); now 3 decimals, as its tolerance."""
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["check", str(DATA / "h200x1-cupti")])
    text = result.stdout[result.stdout.index("\nvariant") + 1:result.stdout.index("\n1 count matches")]  # the verdict after it
    cells = column_pieces(text, "rel_diff")
    assert cells and all(len(p) == 1 and p[0].endswith(".000") for p in cells), cells
    assert {p[0] for p in column_pieces(text, "tolerance")} == {"0.001", "0.010"}


def test_a_name_is_elided_only_where_two_lines_of_its_column_cannot_hold_it():
    """`critical-path` of the FSDP1 H200 trace: `FullyShardedDataParallel._pre_backward_prefetch`
    (47 characters) was elided to 44, `_pre_ba…rd_prefetch`, in a column of 28 whose two lines
    hold it whole (issue 27, item 5); now whole, and every name the json gives that two lines
    of the column hold is shown whole."""
    path = DATA / "h200x2-small" / "fsdp1" / "rank0.trace.json.gz"
    text = run("critical-path", path)
    names = {i["name"] for t in json.loads(run("critical-path", "--format", "json", path))["traces"]
             for s in t["steps"] for i in s["items"]}
    assert "FullyShardedDataParallel._pre_backward_prefetch" in names
    cells = ["".join(p) for p in column_pieces(text, "name")]
    items = next(block for block in text.split("\n\n") if "name" in block.splitlines()[0].split()).splitlines()
    width = len(next(r for h, r in zip(items[0].split(), items[1].split()) if h == "name"))
    assert "FullyShardedDataParallel._pre_backward_prefetch" in cells
    assert not [c for c in cells if "…" in c and len(c) <= 2 * width - 4]


def test_an_identifier_stays_whole_where_column_names_can_make_room():
    """`critical-path` of HTA's simple-add trace: its host spends most time in
    `cudaDeviceGetStreamPriorityRange` (32 characters), printed `cudaDeviceGetStreamPrior` over
    `ityRange` in a column of 24 (issue 27, item 5); column names break after their underscore
    instead and the runtime calls are whole on their line, the table within 100 columns."""
    path = DATA / "external" / "hta-simple-add" / "benchmark_result_493459_1694039959_trace.json.gz"
    text = run("critical-path", path)
    cells = column_pieces(text, "name")
    for name in ("cudaDeviceGetStreamPriorityRange", "cudaStreamCreateWithFlags"):
        assert [name] in cells, [c for c in cells if len(c) > 1]
    assert max(map(len, text.splitlines())) <= 100


def test_the_critical_path_table_shows_the_shares_that_add_up_to_its_span():
    """The default critical-path table's shares add up to 100 % of the span in every row (each
    rounded to 0.1): `runtime_pct` and `copy_pct` were not shown, so DDP's rank 0 read 84.2 %
    (its launches' 15.8 % hidden; 55 % on an MoE trace: issue 67, item 11). One row per step
    with its shares, then the items: both fit 100 columns, the runs' names and `--agg median`
    too (142 columns when the shares and the items shared one table)."""
    import polars as pl

    from tracekit.front.views import VIEWS, Layout, chosen

    doc = json.loads(run("critical-path", "--format", "json", DATA / "h200x2-small" / "ddp"))
    frame = pl.DataFrame([{k: v for k, v in s.items() if k != "items"} for t in doc["traces"] for s in t["steps"]])
    shares = [c for c in chosen(frame, VIEWS["critical-path"], Layout()).columns if c.endswith("_pct")]
    table = chosen(frame, VIEWS["critical-path"], Layout()).select(total=pl.sum_horizontal(shares))
    assert "runtime_pct" in shares and table["total"].is_between(99.7, 100.3).all(), (shares, table)
    lines = run("critical-path", DATA / "h200x2-small" / "ddp").splitlines()
    header = lines[0].split()
    assert header[:3] == ["rank", "span_ms", "host_pct"] and "runtime_pct" in header
    assert float(lines[2].split()[header.index("runtime_pct")]) > 10  # the launches' share, shown
    zero = [c for c in ("host_pct", "runtime_pct", "gpu_pct", "comm_pct", "copy_pct", "wait_pct") if c not in header]
    assert lines[4] == f"(not shown, 0.0 in every row: {', '.join(zero)})"
    assert max(map(len, run("critical-path", "--agg", "median", DATA / "h200x2-small").splitlines())) <= 100


def test_a_cpu_only_critical_path_leaves_out_its_zero_shares_saying_so():
    """The gloo CPU run's critical path is all host and waiting: the shares that are 0.0 in every
    row are left out with a line naming them, so the shown shares still add up to 100 % and the
    names have room (`c10d::allgather_` was broken over two lines: issue 67, items 11 and 13)."""
    lines = run("critical-path", DATA / "gloo-cpu").splitlines()
    assert lines[0].split() == ["rank", "step", "span_ms", "host_pct", "wait_pct"]
    assert lines[6] == "(not shown, 0.0 in every row: runtime_pct, gpu_pct, comm_pct, copy_pct)"
    assert lines[8].split() == ["rank", "step", "category", "name", "ms"]  # then the steps' items
    assert any(line.split()[-2:-1] == ["c10d::allgather_"] for line in lines)


@pytest.mark.parametrize("args, note", [
    (("kernels", DATA / "external" / "hta-tests-data" / "triton_example" / "triton_example.json.gz"),
     "(not shown, blank in every row: pct_peak: no FLOPs from recorded shapes)"),
    (("kernels", "--by", "op", DATA / "wild" / "tracelens" / "mi210" / "gpu_only_trace" / "gpu_only_trace.json.gz"),
     # the op column is not blank: it says why no op launched them (issue 67, item 7)
     "(not shown, blank in every row: pct_peak: no FLOPs from recorded shapes)")], ids=["triton", "gpu-only"])
def test_a_blank_column_s_note_says_why_it_is_blank(args, note):
    """Not "nothing here records them" where the reason is no communication, no enclosing op or
    no FLOPs (issue 67, item 13)."""
    assert note in " ".join(run(*args).splitlines())


def test_a_share_whole_in_every_step_keeps_its_decimal_on_the_statistic_row():
    """`summary --agg mean` of the one-GPU H200 run (no communication): `exposed_comm_pct` reads
    `0.0` on every row, the mean's too (it read `0` there: issue 67, item 13)."""
    lines = run("summary", "--agg", "mean", DATA / "h200x1-device").splitlines()
    mean = next(line for line in lines if " mean " in line)
    assert mean.split()[-1] == "0.0" and all(line.split()[-2] == "0.0" for line in lines[2:5])


def test_a_rate_too_small_for_its_decimals_is_not_shown_as_0():
    """A bus bandwidth of 0.004 GB/s beside 12.5 reads `<0.01`, not `0.0` (issue 67, item 13: 0.0065
    GB/s read `0.0`)."""
    import polars as pl

    from tracekit.front.views import table_text

    text = table_text(pl.DataFrame({"kind": ["a", "b", "c"], "busbw_gbps": [0.004, 12.5, 0.0]}))
    assert [line.split()[-1] for line in text.splitlines()[2:]] == ["<0.01", "12.50", "0.00"]


def test_diff_plot_labels_two_kernels_apart():
    """`diff --plot` labelled an item `kind: name` cut at 60 characters: the BERT H100 trace's
    three `cutlass::Kernel2<cutlass_80_…>` GEMMs (two alike for 60 characters) got one label.
    Now each is named as the diff's table names it, short and told apart (issue 67, item 12)."""
    import gzip

    import polars as pl

    from tracekit.front.plot import item_labels

    path = WILD / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"
    names = sorted({e["name"] for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
                    if e.get("cat") == "kernel" and "cutlass::Kernel2<" in e["name"]})
    assert len(names) == 3 and len({f"compute: {n}"[:60] for n in names}) == 2  # the old labels: two alike
    labels = item_labels(pl.DataFrame({"kind": "compute", "name": names, "op": "aten::addmm", "phase": "forward"}))
    assert len(set(labels)) == 3 and all(label.startswith("compute: cutlass::Kernel2<") for label in labels), labels


def test_an_identifier_longer_than_its_line_breaks_between_its_camel_case_words():
    """Megatron's `LinearWithGradAccumulationAndAsyncCommunication` (48 characters, no `_`, `.`
    or `::`) in a 40-character column broke as `…AndAsyn` over `cCommunication`: now between
    its words (issue 67, item 12); a name with a boundary still breaks there."""
    from tracekit.front.views import wrapped

    assert wrapped("LinearWithGradAccumulationAndAsyncCommunication", 40) == [
        "LinearWithGradAccumulationAndAsync", "Communication"]
    assert wrapped("vectorized_elementwise_kernel<AddFunctor>", 33) == ["vectorized_elementwise_kernel<", "AddFunctor>"]


def test_mangled_names_alike_are_told_apart_by_their_words_not_the_mangling():
    """Two (cut) mangled CUTLASS names that no demangler here reads, alike but for their tile
    sizes: told apart by those values (`cutlass::Kernel [128]`, `[64]`), not by a piece of the
    mangling (`[9GemmShapeI…28ELi8EEENS]`: issue 67, item 12)."""
    import polars as pl

    from tracekit.front.views import short_kernel_name

    names = [f"_ZN7cutlass6KernelIN4gemm6kernel10GemmSharedINS1_11threadblock12MmaPipelinedINS1_9GemmShape"
             f"ILi{m}ELi{n}ELi8EEENS_9transform" for m, n in ((128, 128), (64, 32))]
    short = pl.DataFrame({"n": names}).select(short_kernel_name(pl.col("n")))["n"].to_list()
    assert short == ["cutlass::Kernel [128]", "cutlass::Kernel [64]"]


def test_an_interval_of_ms_never_reads_minus_0():
    """A step's interval clipped at 0 (`max(-0.0, 0.0)` is -0.0) read `[-0.000, …]` in `report`
    (issue 67, item 13: `step_ms_ci` can read negative); a bound below 0 still reads so."""
    from tracekit.front.render import interval_text

    assert interval_text([max(-0.0, 0.0), 1.5]) == "[0.000, 1.500]"
    assert interval_text([-0.0004, 2.0], "+") == "[+0.000, +2.000]" and interval_text([-1.0, 2.0], "+") == "[-1.000, +2.000]"


def test_a_decimal_size_stays_with_its_number_when_a_line_wraps():
    """`2048 MB`, `1.5 GB`, `3.5 x`: a wrapped note never ends a line with the number and starts
    the next with its unit (only binary sizes and times were kept together: issue 67, item 13)."""
    from tracekit.front.views import filled

    for width in range(20, 60):
        lines = filled("tracekit: t.json: the trace holds 2048 MB of events and 1.5 GB of strings, "
                       "3.5 x the memory", width, "  ").splitlines()
        assert not [a for a, b in zip(lines, lines[1:]) if a[-1].isdigit() and b.split()[0] in ("MB", "GB", "x")]


def test_a_python_frame_blamed_for_idle_is_named_by_its_file_line_and_function():
    """A diff's idle item blamed on a BERT module's frame (`cpu_op: …/transformers/models/bert/
    modeling_bert.py(181): forward`, as TraceLens' BERT trace names its frames): the table, the
    lead and `--plot` name it `cpu_op: modeling_bert.py(181): forward` — the plot cut the label
    at 60 characters, dropping `(181): forward` (issue 67, item 12)."""
    import polars as pl

    from tracekit.front.plot import item_labels
    from tracekit.front.views import VIEWS, kernel_column

    frame = "cpu_op: /opt/conda/lib/python3.10/site-packages/transformers/models/bert/modeling_bert.py(181): forward"
    items = pl.DataFrame({"kind": ["idle", "compute"], "name": [frame, "void k<int>(int)"], "op": ["", "aten::mm"],
                          "phase": ["forward", "forward"]})
    shown = items.select(kernel_column(pl.col("name"), VIEWS["diff.items"].kernel_kinds))["name"].to_list()
    assert shown == ["cpu_op: modeling_bert.py(181): forward", "k"]
    assert item_labels(items)[0] == "idle: cpu_op: modeling_bert.py(181): forward (forward)"
