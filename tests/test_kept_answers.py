"""Answers kept per command (`tracekit/core/answers.py`, `tracekit/front/start.py`): a kept answer
is byte for byte what the command computes with the cache off, stderr and exit status included,
and is printed without importing polars, numpy, click or the analyses; a changed input, option,
width, schema or code gives a fresh computation; failures, writing verbs and --no-cache are
never kept; `cache info` and `cache clear` see the answers."""

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import DATA

from tracekit.core import answers, cache
from tracekit.front.start import keepable

HEAVY = ("polars", "numpy", "click", "tracekit.analyses", "tracekit.core.loading")
# The command as installed, run in a fresh interpreter, which writes the heavy modules it
# imported to the file named first (for the test only; the command's own output is untouched).
PROBE = ("import atexit, os, sys\n"
         "seen = sys.argv.pop(1)\n"
         f"def note(): open(seen, 'w').write(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
         "atexit.register(note)\n"
         "end = os._exit  # a read-only verb ends there, past the exit handlers registered before it\n"
         "os._exit = lambda status: (note(), end(status))\n"
         "sys.argv[0] = 'tracekit'\n"
         "from tracekit.front.start import main\n"
         "main()\n")
CUPTI = DATA / "h200x1-cupti"
COMMANDS = {"summary": ["summary", CUPTI / "fsdp2"], "syncs": ["syncs", CUPTI / "fsdp2"],
            "comms": ["comms", CUPTI / "fsdp2"], "overlap": ["overlap", "--scope", "hta", CUPTI / "fsdp2"],
            "breakdown": ["breakdown", "--format", "json", CUPTI / "fsdp2"],
            "kernels": ["kernels", "--top=5", CUPTI / "fsdp2"], "critical-path": ["critical-path", CUPTI / "fsdp2"],
            "lint": ["lint", CUPTI / "fsdp2"], "diff": ["diff", CUPTI, "fsdp1", "fsdp2"], "report": ["report", CUPTI],
            "check": ["check", CUPTI], "summary of the sample": ["summary", "--format", "csv"]}


def tracekit(tmp_path, *args, cache_on: bool = True, prelude: str = "", **env) -> SimpleNamespace:
    """`tracekit ARGS` in a fresh interpreter with the test's cache folder: its stdout and stderr
    (bytes), exit status and the heavy modules it imported."""
    seen, here = tmp_path / "seen.txt", tmp_path / "here"  # the current folder: one nothing is written to
    here.mkdir(exist_ok=True)
    environment = {**os.environ, "TRACEKIT_CACHE_DIR": str(tmp_path / "cache"), **env}
    environment.pop("TRACEKIT_NO_CACHE", None)
    if not cache_on:
        environment["TRACEKIT_NO_CACHE"] = "1"
    result = subprocess.run([sys.executable, "-c", prelude + PROBE, str(seen), *map(str, args)],
                            capture_output=True, env=environment, cwd=here)
    return SimpleNamespace(out=result.stdout, err=result.stderr, status=result.returncode,
                           heavy=set(seen.read_text().split()))


def kept_files(tmp_path) -> list:
    return sorted((tmp_path / "cache" / cache.ANSWERS).glob("*.json"))


@pytest.mark.parametrize("name", COMMANDS)
def test_a_kept_answer_is_the_computed_one_printed_without_polars(tmp_path, name):
    """With the cache off (the oracle), cold (the traces decoded), from the trace cache, and kept."""
    args = COMMANDS[name]
    oracle = tracekit(tmp_path, *args, cache_on=False)
    assert oracle.status == 0, oracle.err
    first = tracekit(tmp_path, *args)
    assert "polars" in first.heavy and len(kept_files(tmp_path)) == 1
    shutil.rmtree(tmp_path / "cache" / cache.ANSWERS)
    cached = tracekit(tmp_path, *args)  # from the trace cache: its tables decoded as used, lint's material kept
    assert "tracekit.core.loading" in cached.heavy and len(kept_files(tmp_path)) == 1
    again = tracekit(tmp_path, *args)
    assert (again.out, again.err, again.status) == (oracle.out, oracle.err, 0)
    assert (first.out, first.err, cached.out, cached.err) == (oracle.out, oracle.err, oracle.out, oracle.err)
    assert again.heavy == set()


def test_warnings_and_notes_on_stderr_are_replayed(tmp_path):
    oracle = tracekit(tmp_path, *COMMANDS["diff"], cache_on=False)
    assert b"warning:" in oracle.err
    tracekit(tmp_path, *COMMANDS["diff"])
    again = tracekit(tmp_path, *COMMANDS["diff"])
    assert again.heavy == set() and again.err == oracle.err and again.out == oracle.out


def test_a_touched_or_replaced_trace_is_computed_again(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA / "gloo-cpu", run)
    trace = run / "rank0.pt.trace.json.gz"
    tracekit(tmp_path, "summary", run)
    assert tracekit(tmp_path, "summary", run).heavy == set()
    os.utime(trace)
    assert "polars" in tracekit(tmp_path, "summary", run).heavy
    assert tracekit(tmp_path, "summary", run).heavy == set()
    before = os.stat(trace)
    other = run / "other.gz"
    shutil.copy(run / "rank1.pt.trace.json.gz", other)
    os.replace(other, trace)  # another inode at the same path, size and times put back where they can be
    os.utime(trace, ns=(before.st_atime_ns, before.st_mtime_ns))
    replaced = tracekit(tmp_path, "summary", run)
    assert "polars" in replaced.heavy and replaced.status == 0


def test_an_option_the_width_or_the_schema_gives_a_fresh_computation(tmp_path):
    args = ["summary", DATA / "gloo-cpu"]
    tracekit(tmp_path, *args)
    assert tracekit(tmp_path, *args).heavy == set()
    assert "polars" in tracekit(tmp_path, *args, "--scope", "trace").heavy
    assert "polars" in tracekit(tmp_path, *args, COLUMNS="61").heavy
    assert "polars" in tracekit(tmp_path, *args, prelude="import tracekit.core.answers as a; c = a.code; "
                                                        "a.code = lambda: {**c(), 'python': 'another'}\n").heavy
    assert tracekit(tmp_path, *args).heavy == set()  # the first answer is still kept


def test_the_key_follows_the_inputs_beside_a_trace_and_the_environment(tmp_path, monkeypatch):
    """What a verb reads beside a trace (a naming step in names/, a profile manifest) and what
    shapes the output are in the key, also where they were not there before."""
    variant = tmp_path / "out" / "fsdp2"
    variant.mkdir(parents=True)
    shutil.copy(CUPTI / "fsdp2" / "rank0.pt.trace.json.gz", variant)
    argv = ["tracekit", "summary", str(variant / "rank0.pt.trace.json.gz")]
    monkeypatch.chdir(tmp_path)
    keys = [answers.key(argv)]
    assert answers.key(argv) == keys[0]
    shutil.copytree(CUPTI / "fsdp2" / "names", variant / "names")
    keys.append(answers.key(argv))
    shutil.copy(CUPTI / "manifest.json", tmp_path / "out")
    keys.append(answers.key(argv))
    monkeypatch.setenv("COLUMNS", "61")
    keys.append(answers.key(argv))
    monkeypatch.setenv("NO_COLOR", "1")
    keys.append(answers.key(argv))
    monkeypatch.setattr(answers, "code", lambda real=answers.code: {**real(), "python": "another"})
    keys.append(answers.key(argv))
    keys.append(answers.key(["tracekit", "summary", "--format", "json", argv[-1]]))
    assert len(set(keys)) == len(keys)
    assert answers.key(["tracekit", "summary", "--format=json", argv[-1]]) == keys[-1]
    assert answers.key(["tracekit", "summary", "s3://bucket/rank0.json"]) is None


def test_failures_are_computed_every_time(tmp_path):
    for _ in range(2):
        failed = tracekit(tmp_path, "summary", "--rank", "7", DATA / "gloo-cpu")
        assert failed.status == 2 and failed.err.startswith(b"tracekit: ") and "click" in failed.heavy
    assert kept_files(tmp_path) == []


def test_no_cache_keeps_nothing(tmp_path):
    tracekit(tmp_path, "summary", DATA / "gloo-cpu", cache_on=False)
    tracekit(tmp_path, "summary", "--no-cache", DATA / "gloo-cpu")
    assert kept_files(tmp_path) == []


@pytest.mark.parametrize("words, kept", [
    (["summary", "x.json"], True), (["report", "out"], True), (["diff", "a", "b"], True),
    (["diff", "--plot", "p.png", "a", "b"], False), (["report", "--plot=p.png", "out"], False),
    (["summary", "--no-cache", "x.json"], False), (["export", "-o", "t.pftrace", "x.json"], False),
    (["plot", "timeline", "-o", "t.png", "x.json"], False), (["profile"], False), (["capacity"], False),
    (["open", "t.pftrace"], False), (["cache", "info"], False), (["--version"], False), ([], False)])
def test_only_verbs_that_only_read_are_kept(words, kept):
    assert keepable(words) is kept


def test_cache_info_and_clear_see_the_answers_and_the_bound_holds(tmp_path):
    tracekit(tmp_path, "summary", DATA / "gloo-cpu")
    info = tracekit(tmp_path, "cache", "info", "--format", "json")
    assert json.loads(info.out)["answers"] == 1
    cleared = tracekit(tmp_path, "cache", "clear")
    assert b"and 1 kept answer" in cleared.err and b"answer(s)" not in cleared.err and kept_files(tmp_path) == []
    tracekit(tmp_path, "summary", DATA / "gloo-cpu", TRACEKIT_CACHE_MAX_GB="0")
    assert kept_files(tmp_path) == []


def test_a_read_only_verb_ends_without_the_teardown_its_output_and_cache_whole(tmp_path):
    """`python -m tracekit` of a read-only verb ends by `os._exit` after the exit handlers
    (`start.ended`): a report's JSON (~100 KB, more than a pipe holds) arrives whole — what the
    command gives in this process —, the trace cache it wrote serves the next run, and a
    mistake still exits 2; a handler registered before `main` (coverage, an embedding program)
    still runs."""
    import json

    from click.testing import CliRunner

    from tracekit.front.cli import main

    def plain(*args, code=None):
        environment = {**os.environ, "TRACEKIT_CACHE_DIR": str(tmp_path / "cache")}
        environment.pop("TRACEKIT_NO_CACHE", None)
        command = [sys.executable, "-m", "tracekit", *map(str, args)] if code is None else \
            [sys.executable, "-c", code, *map(str, args)]
        return subprocess.run(command, capture_output=True, env=environment, cwd=tmp_path)

    run = DATA / "h200x2-blocks4"
    first = plain("report", "--format", "json", run)
    assert first.returncode == 0 and len(first.stdout) > 65536
    here = CliRunner(env={"TRACEKIT_NO_CACHE": "1"}).invoke(main, ["report", "--format", "json", str(run)])
    assert json.loads(first.stdout) == json.loads(here.stdout)
    entries = [p for p in (tmp_path / "cache").iterdir() if p.name != cache.ANSWERS]
    assert len(entries) == 10 and all((p / "trace.json").is_file() for p in entries)
    shutil.rmtree(tmp_path / "cache" / cache.ANSWERS)
    assert plain("report", "--format", "json", run).stdout == first.stdout
    mistake = plain("summary", tmp_path / "nothing.json")
    assert mistake.returncode == 2 and mistake.stderr.decode().count("\n") == 1
    marker = tmp_path / "ran"
    embedded = ("import atexit, sys\n"
                f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
                "sys.argv[0] = 'tracekit'\n"
                "from tracekit.front.start import main\n"
                "main()\n")
    assert plain("summary", code=embedded).returncode == 0 and marker.read_text() == "ran"
