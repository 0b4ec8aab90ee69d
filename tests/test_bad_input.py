"""Bad input: one clear line on stderr naming the file, exit 2, no traceback, nothing written."""

import gzip
import json

import pytest
import synth
from click.testing import CliRunner
from conftest import messages

from tracekit.front.cli import main

GOOD = synth.doc([synth.step(1, 0.0, 10.0), *synth.launched("k", 1.0, 2.0, 1.0, corr=1)])
GOOD_BYTES = json.dumps(GOOD).encode()

CASES = {
    "truncated.json": (GOOD_BYTES[: len(GOOD_BYTES) // 2], "not valid JSON"),
    "corrupt.json.gz": (b"\x1f\x8b\x08\x00" + b"garbage" * 20, "corrupt or truncated gzip"),
    "truncated.json.gz": (gzip.compress(GOOD_BYTES)[:40], "corrupt or truncated gzip"),
    "not_utf8_metadata.json": (json.dumps({**GOOD, "distributedInfo": {"backend": "nccl"}}).encode().replace(b"nccl", b"n\xff"),
                               "not valid JSON (Invalid UTF-8"),
    "empty.json": (b"", "empty file"),
    "blank.json": (b"  \n", "empty file"),
    "list.json": (b"[1, 2, 3]", "not a Kineto trace"),
    "object.json": (b'{"hello": "world"}', "not a Kineto trace"),
    "no_events.json": (b'{"traceEvents": []}', "no complete ('X') events"),
    "no_ts.json": (json.dumps({"traceEvents": [{"ph": "X", "name": "a", "cat": "cpu_op", "dur": 1}]}).encode(),
                   "(1 events without a numeric ts)"),
    "no_dur.json": (json.dumps({"traceEvents": [{"ph": "X", "name": "a", "cat": "cpu_op", "ts": 1}]}).encode(),
                    "(1 events without a numeric dur)"),
    "wrong_type.json": (json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}).encode(),
                        "(1 events without a numeric ts)"),
}


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


@pytest.mark.parametrize("name", CASES)
def test_bad_file_is_one_line_and_exit_2(tmp_path, name):
    data, reason = CASES[name]
    path = tmp_path / name
    path.write_bytes(data)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run("summary", path)
    assert result.exit_code == 2
    lines = messages(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"tracekit: {path}: ") and reason in lines[0], lines
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before and path.read_bytes() == data


def test_directory_without_traces(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    result = run("summary", tmp_path)
    assert result.exit_code == 2 and "no trace files in this directory" in messages(result.stderr)[0]


def test_two_traces_claiming_one_rank_are_both_shown_named_and_warned(tmp_path):
    """Two files of rank 0 whose steps are the same numbers are not one process's profiling
    cycles (a process numbers its steps on): both are read, each named by its file, and every
    verb warns (issue 27, item 2)."""
    for name in ("a.json", "b.json"):
        synth.write(tmp_path, name, GOOD)
    result = run("summary", "--format", "json", tmp_path)
    assert result.exit_code == 0 and [t["path"] for t in json.loads(result.stdout)["traces"]] == [
        str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert "warning: same_rank" in result.stderr and "a.json, b.json" in result.stderr
    table = run("summary", tmp_path).stdout.splitlines()
    assert [line.split()[0] for line in table[2:] if not line.startswith("(not shown")] == ["a", "b"]  # the run column names each file


def test_missing_rank_selection(tmp_path):
    path = synth.write(tmp_path, "rank0.json", GOOD)
    result = run("summary", "--rank", "3", path)
    assert result.exit_code == 2 and "no trace of rank 3" in messages(result.stderr)[0]


def test_cpu_only_trace_is_valid(tmp_path):
    path = synth.write(tmp_path, "cpu.json", synth.doc([synth.step(1, 0.0, 10.0), synth.op("aten::add", 1.0, 1.0)]))
    result = run("summary", "--format", "json", path)
    assert result.exit_code == 0
    (step,) = json.loads(result.stdout)["traces"][0]["steps"]
    assert step["gpu_span_ns"] is None and step["kernels"] is None


@pytest.mark.parametrize("verb", ["summary", "syncs", "comms", "overlap", "breakdown", "launches"])
def test_every_verb_reports_bad_input_the_same_way(tmp_path, verb):
    path = tmp_path / "truncated.json"
    path.write_bytes(CASES["truncated.json"][0])
    result = run(verb, path)
    assert result.exit_code == 2 and messages(result.stderr)[0].startswith(f"tracekit: {path}: not valid JSON")
    assert "Traceback" not in result.output
