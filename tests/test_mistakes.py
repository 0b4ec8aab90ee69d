"""A user's mistake: one message on stderr (wrapped at the terminal), exit 2, nothing written — or the right output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import synth
from click.testing import CliRunner
from conftest import DATA, messages

from tracekit.front.cli import main

RUN = DATA / "h200x2-blocks4"
FSDP1, FSDP2 = RUN / "fsdp1", RUN / "fsdp2"


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def one_line(result, *words):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    (line,) = messages(result.stderr)
    assert line.startswith("tracekit: ") and all(w in line for w in words), line


@pytest.mark.parametrize("verb", ["summary", "syncs", "comms", "overlap", "breakdown", "kernels"])
@pytest.mark.parametrize("steps", ["999", "0", "1,2"])
def test_a_step_the_trace_has_not(verb, steps):
    one_line(cli(verb, "--steps", steps, FSDP2), "no step", "its steps: 1")


@pytest.mark.parametrize("args, words", [
    (["critical-path", "--rank", "9", "trace_filter"], ["no trace of rank 9", "(ranks here: 0, 1)"]),
    (["summary", "--steps", "99999", "trace_diff"], ["no step 99999", "its steps: 1009"]),
])
def test_a_mistake_found_after_loading_is_one_line_without_the_traces_notes(args, words):
    """HTA's traces whose lint notes (missing ranks, clock skew; same-rank files) go to stderr on
    every verb: where the command then fails, they are not printed before its one line."""
    external = Path(__file__).parent / "data" / "external" / "hta-tests-data"
    one_line(cli(*args[:-1], external / args[-1]), *words)
    assert cli("summary", external / args[-1]).stderr.count("tracekit: ") >= 2  # the notes, on success


@pytest.mark.parametrize("args", [["plot", "timeline", FSDP2, "-o"], ["diff", FSDP1, FSDP2, "--plot"]])
def test_a_picture_of_a_format_matplotlib_cannot_write(tmp_path, args):
    """A picture is PNG or HTML: another suffix is one line before anything is loaded (a
    matplotlib ValueError traceback after the work, before), and no file is written."""
    out = tmp_path / "w.xyz"
    one_line(cli(*args, out), "w.xyz", "FILE.png or FILE.html")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, words", [
    (["diff", FSDP1, FSDP2, "--steps", "3"], ["fsdp1", "no step 3 with GPU work (its steps: 1); nor has B"]),
])
def test_a_step_to_compare_that_the_traces_have_not(args, words, tmp_path, monkeypatch):
    """The side that lacks the step is named once, with its steps (not both paths and Python
    lists)."""
    monkeypatch.chdir(tmp_path)
    result = cli(*args)
    one_line(result, *words)
    assert "[" not in result.stderr


def test_a_backwards_range():
    one_line(cli("summary", "--steps", "3-1", FSDP2), "3-1", "N ≤ M")


def test_a_missing_file_is_one_line_not_clicks_usage():
    one_line(cli("summary", "no-such.json"), "no-such.json: no such file or directory")


def test_outputs_into_a_missing_folder(tmp_path):
    one_line(cli("diff", FSDP1, FSDP2, "--plot", tmp_path / "nope" / "x.png"), "nope", "does not exist")
    one_line(cli("export", FSDP2, "-o", tmp_path / "nope" / "x.pftrace"), "nope", "does not exist")
    one_line(cli("plot", "timeline", FSDP2, "-o", tmp_path / "nope" / "t.png"), "nope", "does not exist")
    assert not (tmp_path / "nope").exists()


def test_a_plot_without_suffix_says_the_file_it_wrote(tmp_path):
    pytest.importorskip("matplotlib")
    result = cli("diff", FSDP1, FSDP2, "--plot", tmp_path / "wf")
    assert result.exit_code == 0 and (tmp_path / "wf.png").exists()
    assert messages(result.stderr)[-1] == f"tracekit: wrote {tmp_path / 'wf.png'}"
    again = cli("diff", FSDP1, FSDP2, "--plot", tmp_path / "wf.png")
    assert messages(again.stderr)[-1].endswith("(replacing the file that was there)")


def test_plot_timeline_of_a_step_that_is_not_there(tmp_path):
    one_line(cli("plot", "timeline", FSDP2, "--step", 999, "-o", tmp_path / "t.png"), "--steps 999",
             "no step 999 (its steps: 1)")
    assert not (tmp_path / "t.png").exists()


def test_ranks_that_are_not_there(tmp_path):
    one_line(cli("lint", "--rank", 9, FSDP2), "no trace of rank 9")
    one_line(cli("export", "--rank", 9, FSDP2, "-o", tmp_path / "x.pftrace"), "no trace of rank 9")
    assert not (tmp_path / "x.pftrace").exists()


def test_export_of_one_rank_holds_that_rank_only(tmp_path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace as PerfettoTrace

    for rank, want in ((None, {"rank 0", "rank 1"}), (0, {"rank 0"})):
        out = tmp_path / f"r{rank}.pftrace"
        result = cli("export", FSDP2, "-o", out, *(["--rank", rank] if rank is not None else []))
        assert result.exit_code == 0, result.output
        packets = PerfettoTrace.FromString(out.read_bytes()).packet
        names = {p.track_descriptor.process.process_name for p in packets
                 if p.HasField("track_descriptor") and p.track_descriptor.HasField("process")}
        assert {n.split(" · ")[0] for n in names} == want


def test_warnings_of_other_ranks_are_not_printed(tmp_path):
    """Rank 1 launches a kernel after its step: orphan device work is warned about on rank 1 only."""
    events = [synth.step(1, 0.0, 10.0), *synth.launched("k", 1.0, 2.0, 1.0, corr=1)]
    late = [*events, *synth.launched("k", 15.0, 16.0, 1.0, corr=2)]
    synth.write(tmp_path, "rank0.json", synth.doc(events, rank=0))
    synth.write(tmp_path, "rank1.json", synth.doc(late, rank=1))
    both = cli("summary", tmp_path)
    assert "rank1.json" in both.stderr
    only = cli("summary", "--rank", 0, tmp_path)
    assert only.exit_code == 0 and "rank1.json" not in only.stderr
    assert [t["rank"] for t in json.loads(cli("summary", "--rank", 0, "--format", "json", tmp_path).stdout)[
        "traces"]] == [0]


def test_diff_of_variants_a_run_does_not_have():
    one_line(cli("diff", RUN, "fsdp1", "fsdp9"), "no variant fsdp9", "fsdp2")
    one_line(cli("diff", RUN, "fsdp1", "fsdp2", "ddp"), "diff takes A B, or OUT A B")
    one_line(cli("diff", FSDP1), "diff takes A B")
    one_line(cli("diff", RUN / "nothing", "fsdp1", "fsdp2"), "no such file or directory")


@pytest.mark.parametrize("args, words", [
    (["diff", RUN, FSDP2], ["A: ", "profile output of 5 variants", f"tracekit diff {RUN} ddp fsdp2"]),
    (["diff", FSDP1, RUN], ["B: ", f"tracekit diff {RUN} fsdp1 ddp"]),
    (["diff", RUN, RUN], ["A: ", f"tracekit diff {RUN} ddp fsdp1"]),
    (["export", "--diff", "-o", "x.pftrace", RUN, FSDP1], [f"tracekit export --diff -o x.pftrace {RUN} ddp fsdp1"]),
])
def test_a_side_that_is_a_whole_profile_output_is_refused(tmp_path, monkeypatch, args, words):
    """A profile output of several variants is not one side: its rank 0 traces are five
    variants' (before, the first found was compared, under "5 traces claim rank 0" warnings),
    and the fix names two of its variants, the one given kept on its side."""
    monkeypatch.chdir(tmp_path)
    one_line(cli(*args), *words)
    assert list(tmp_path.iterdir()) == []


def test_report_baseline_and_plot_mistakes(tmp_path):
    one_line(cli("report", "--baseline", "fsdp9", RUN), "--baseline fsdp9", "ran: ddp, fsdp1")
    one_line(cli("report", "--plot", tmp_path / "no" / "r.png", RUN), "the folder", "does not exist")


@pytest.mark.parametrize("entry, words", [
    ({"status": "skipped", "message": "needs CUDA"}, ["fsdp2-fp8 was skipped (needs CUDA): no trace to compare"]),
    ({"status": "oom", "message": "CUDA out of memory"}, ["fsdp2-fp8 failed (oom: CUDA out of memory)"]),
])
def test_diff_of_a_variant_without_a_trace_says_why(tmp_path, entry, words):
    """A variant the manifest lists as skipped or failed is not one that "ran but has no trace"."""
    out = tmp_path / "p2"
    (out / "fsdp2").mkdir(parents=True)
    manifest = {"config": {}, "variants": {"fsdp2": {"status": "ok", "ranks": []}, "fsdp2-fp8": entry}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = cli("diff", out, "fsdp2", "fsdp2-fp8")
    one_line(result, *words)
    assert "ran but has no trace" not in result.stderr


def _command(*args):
    return [sys.executable, "-m", "tracekit", *map(str, args)]


NO_CACHE = {**os.environ, "TRACEKIT_NO_CACHE": "1"}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("summary", FSDP1), ("report", RUN), ("report", RUN, "--format", "json"),
                                  ("--help",), ("--version",), ("summary", "--help")])
def test_an_answer_that_cannot_be_written_is_one_line(args, tmp_path):
    """stdout on a full disk (/dev/full refuses every write with ENOSPC): exit 2, one line."""
    with open("/dev/full", "w") as full:
        result = subprocess.run(_command(*args), stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env=NO_CACHE)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert messages(result.stderr)[-1] == "tracekit: cannot write to standard output: No space left on device"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_kept_answer_that_cannot_be_written_is_one_line(tmp_path):
    """The answer kept by a first run (`start.replay`), printed again onto a full disk."""
    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run(_command("summary", FSDP2), capture_output=True, text=True, cwd=tmp_path, env=env)
    assert first.returncode == 0 and list((tmp_path / "cache" / "answers").iterdir()), first.stderr
    with open("/dev/full", "w") as full:
        again = subprocess.run(_command("summary", FSDP2), stdout=full, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path, env=env)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert messages(again.stderr)[-1] == "tracekit: cannot write to standard output: No space left on device"


@pytest.mark.parametrize("kept", [False, True])
def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path, kept):
    """`tracekit report … | head -c 0`: the pipe closed before the answer is written, computed
    or kept."""
    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(tmp_path / "cache")} if kept else NO_CACHE
    if kept:
        assert subprocess.run(_command("report", RUN), capture_output=True, cwd=tmp_path, env=env).returncode == 0
    reader, writer = os.pipe()
    os.close(reader)
    result = subprocess.run(_command("report", RUN), stdout=writer, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    os.close(writer)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "Exception" not in result.stderr, \
        result.stderr
