"""CLI shape: formats, --step/--rank filters, the embedded default."""

import json

import synth
from click.testing import CliRunner
from conftest import DATA

from tracekit.cli import main

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
    doc = json.loads(run("summary", "--format", "json", "--step", 2, path))
    assert [s["step"] for s in doc["traces"][0]["steps"]] == [2]


def test_csv_and_md_and_table():
    csv = run("summary", "--format", "csv", FSDP2).splitlines()
    assert csv[0].startswith("path,rank,step,cpu_ns") and len(csv) == 3
    md = run("summary", "--format", "md", FSDP2).splitlines()
    assert md[0].startswith("| path") and len(md) == 4
    assert "collectives.all_gather" in run("summary", FSDP2)
