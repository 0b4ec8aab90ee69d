"""A profile output (manifest.json and one directory per variant) is found one level down."""

import json

from click.testing import CliRunner
from conftest import DATA

from tracekit.front.cli import main

RUN = DATA / "h200x2-blocks4"
VARIANTS = ["ddp", "fsdp1", "fsdp2", "fsdp2-compile", "fsdp2-fp8"]


def run(*args):
    result = CliRunner(env={"COLUMNS": "100"}).invoke(main, list(map(str, args)))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_variant_of_a_profile_output():
    traces = json.loads(run("summary", "--format", "json", RUN))["traces"]
    assert [(t["path"].split("/")[-2], t["rank"]) for t in traces] == [(v, r) for v in VARIANTS for r in (0, 1)]


def test_the_table_names_each_rows_run():
    lines = run("summary", RUN).splitlines()
    assert lines[0].split()[0] == "run" and [line.split()[0] for line in lines[2:]] == [v for v in VARIANTS
                                                                                       for _ in (0, 1)]


def test_lint_and_kernels_take_it_too():
    doc = json.loads(run("lint", "--format", "json", RUN))
    assert len(doc["traces"]) == 10 and len(doc["runs"]) == 5
    assert len(json.loads(run("kernels", "--format", "json", RUN))["traces"]) == 10
