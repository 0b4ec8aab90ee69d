"""CLI shape: formats, --step/--rank filters, the embedded default."""

import json

import synth
from click.testing import CliRunner
from conftest import DATA

from tracekit.front.cli import main

FSDP2 = DATA / "h200x2-small" / "fsdp2"


def run(*args):
    result = CliRunner().invoke(main, list(map(str, args)))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_default_input_is_the_embedded_trace():
    (trace,) = json.loads(run("summary", "--format", "json"))["traces"]
    assert trace["rank"] == 0 and trace["steps"][0]["syncs"]["cudaEventSynchronize"] == 25


def test_run_directory_gives_every_rank_and_rank_filter_one():
    doc = json.loads(run("summary", "--format", "json", FSDP2))
    assert [t["rank"] for t in doc["traces"]] == [0, 1]
    doc = json.loads(run("summary", "--format", "json", "--rank", 1, FSDP2))
    assert [t["rank"] for t in doc["traces"]] == [1]


def test_step_filter(tmp_path):
    events = [synth.step(1, 0.0, 10.0), synth.step(2, 10.0, 10.0)]
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    doc = json.loads(run("summary", "--format", "json", "--steps", 2, path))
    assert [s["step"] for s in doc["traces"][0]["steps"]] == [2]


def test_steps_and_a_statistic_row(tmp_path):
    """Three steps whose kernels take 10, 30, 20 µs: median 20, p90 28 (linear), n_steps 3."""
    events = []
    for i, dur in enumerate([10.0, 30.0, 20.0]):
        events += [synth.step(i + 1, 100.0 * i, 100.0), *synth.launched("k", 100.0 * i + 1, 100.0 * i + 5, dur, corr=i)]
    path = synth.write(tmp_path, "t.json", synth.doc(events))
    for agg, want in (("median", 20_000), ("p90", 28_000), ("min", 10_000), ("mean", 20_000)):
        steps = json.loads(run("summary", "--format", "json", "--agg", agg, path))["traces"][0]["steps"]
        assert [s["step"] for s in steps] == [1, 2, 3, None]
        assert (steps[-1]["agg"], steps[-1]["n_steps"], steps[-1]["gpu_span_ns"]) == (agg, 3, want)
    parts = json.loads(run("breakdown", "--format", "json", "--agg", "max", "--steps", "1-2", path))
    (last,) = [s for s in parts["traces"][0]["steps"] if s["step"] is None]
    assert last["parts"] == [{"category": "compute", "cause": None, "ns": 30_000, "pct": 100.0}] and last["n_steps"] == 2


def test_csv_and_md_and_table():
    csv = run("summary", "--format", "csv", FSDP2).splitlines()
    assert csv[0].startswith("path,rank,step,device,cpu_ns") and len(csv) == 3
    md = run("summary", "--format", "md", FSDP2).splitlines()
    assert md[0].startswith("| path") and len(md) == 4
    assert "collectives.all_gather" in run("summary", "--wide", FSDP2)
    assert "collectives.all_gather" not in run("summary", FSDP2)


def test_profile_help_gives_the_rounds_the_runner_uses():
    """`--profile-rounds`' help states the default the launcher applies (`PROFILE_ROUNDS`)."""
    from tracekit.runners.launch import PROFILE_ROUNDS

    result = CliRunner().invoke(main, ["profile", "--help"], terminal_width=400)
    assert f"[default: {PROFILE_ROUNDS} in cupti mode" in " ".join(result.output.split())


TRACE_FILTER = DATA / "external" / "hta-tests-data" / "trace_filter"


def test_a_lint_error_on_a_verb_is_a_warning_not_the_error_prefix():
    """HTA's trace_filter traces say world size 128 and hold ranks 0 and 1: lint's
    `missing_ranks` error. Every verb answers (exit 0) and says so as a warning: the
    `tracekit: error:` prefix is that of a command that failed (exit 2)."""
    import gzip

    worlds = {json.loads(gzip.decompress(p.read_bytes()))["distributedInfo"]["world_size"]
              for p in TRACE_FILTER.glob("*.json.gz")}
    assert worlds == {128} and len(list(TRACE_FILTER.glob("*.json.gz"))) == 2
    for verb in ("summary", "syncs", "comms", "overlap", "breakdown", "kernels", "launches", "critical-path"):
        result = CliRunner(env={"COLUMNS": "100"}).invoke(main, [verb, str(TRACE_FILTER)])
        assert result.exit_code == 0, (verb, result.output)
        assert not [line for line in result.stderr.splitlines() if line.startswith("tracekit: error")], verb
        assert "tracekit: warning: missing_ranks (a lint error): 126 of 128 ranks" in result.stderr, verb
    lint = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["lint", "--format", "json", str(TRACE_FILTER)])
    assert lint.exit_code == 0 and "tracekit: error" not in lint.stderr
    assert [f["severity"] for r in json.loads(lint.stdout)["runs"] for f in r["findings"]
            if f["kind"] == "missing_ranks"] == ["error"]  # lint itself still counts it an error


def test_a_self_diff_says_each_note_once():
    """`diff X X` of TraceLens' Qwen H100 trace (device work outside every step): its two sides
    find the same lint note; it is said once (issue 27, D7)."""
    path = DATA / "wild" / "tracelens" / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["diff", str(path), str(path)])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("orphan_gpu_work") == 1


def test_errors_and_notes_fit_the_terminal_and_keep_a_number_with_its_unit(capsys):
    """A long mistake (`--columns` of a name the table has not, which lists every column) is one
    line to a pipe (a script reads one line) and, at a terminal, wrapped at 100 columns as the
    notes are; a note never ends a line between a number and its unit (issue 27, D7)."""
    from tracekit.front.cli.common import shout

    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["summary", "--columns", "nope", str(FSDP2)])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1  # to a pipe: one line
    shout(result.stderr.strip().removeprefix("tracekit: "))  # at a terminal
    lines = capsys.readouterr().err.splitlines()
    assert max(map(len, lines)) <= 100 and len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    shout("x" * 82 + " 13.742 ms of device work and 1.20 × the step, 3.53 GiB")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("x" * 82) and lines[1] == "  13.742 ms of device work and 1.20 × the step, 3.53 GiB"


def test_counts_of_things_read_in_the_singular_and_the_plural():
    """`diff` of one path said `got 1 argument(s)` (issue 27, item 7): one argument, two
    arguments, never `(s)`."""
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["diff", str(FSDP2)])
    assert result.exit_code == 2 and result.stderr.strip().endswith("got 1 argument")
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, ["diff", *[str(FSDP2)] * 4])
    assert result.exit_code == 2 and "got 4 arguments" in result.stderr


def test_a_diff_of_two_single_files_is_not_warned_that_they_claim_one_rank():
    """A and B of `diff` are the two sides, not two ranks of one run: the rank-0 traces of DDP
    and FSDP1 compared gave `same_rank` on every such diff (issue 67, item 10)."""
    a, b = (DATA / "h200x2-small" / v / "rank0.trace.json.gz" for v in ("ddp", "fsdp1"))
    result = CliRunner().invoke(main, ["diff", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "B − A: +67.312 ms" in result.stdout and "same_rank" not in result.stderr


def test_files_of_one_rank_in_folders_of_one_name_are_rows_named_apart(tmp_path):
    """`summary a/ddp/rank0… b/ddp/rank0…` (two real rank-0 traces, DDP and FSDP1): the warning,
    and two rows named by as many folders as tell them apart, not two unnamed `rank 0` rows
    (issue 67, item 10)."""
    import shutil

    paths = []
    for side, variant in (("a", "ddp"), ("b", "fsdp1")):
        (tmp_path / side / "ddp").mkdir(parents=True)
        paths.append(shutil.copy(DATA / "h200x2-small" / variant / "rank0.trace.json.gz", tmp_path / side / "ddp"))
    result = CliRunner().invoke(main, ["summary", *paths])
    assert result.exit_code == 0, result.output
    assert "same_rank: 2 traces claim rank 0" in result.stderr
    rows = result.stdout.splitlines()[2:]
    assert [row.split()[:2] for row in rows] == [["a/ddp/rank0", "0"], ["b/ddp/rank0", "0"], ["(not", "shown,"]]


def test_a_table_of_one_step_names_it():
    """HTA's trace_diff control trace has steps 1009-1014: `summary --steps 1011` shows no step
    column (one value), so a line names the step (issue 67, item 13: no table said which)."""
    path = DATA / "external" / "hta-tests-data" / "trace_diff" / "control" / "control.json.gz"
    lines = run("summary", "--steps", 1011, path).splitlines()
    assert "step" not in lines[0].split() and lines[-1] == "(not shown, the same in every row: step 1011)"
    assert "every row: step" not in run("summary", "--steps", "1011-1012", path)
