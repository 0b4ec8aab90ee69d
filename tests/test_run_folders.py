"""A profile output (manifest.json and one directory per variant) is found one level down; a folder
of traces at mixed depths is read whole."""

import json

from click.testing import CliRunner
from conftest import DATA, messages

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
    lines = [line for line in run("summary", RUN).splitlines() if not line.startswith("(not shown")]
    assert lines[0].split()[0] == "run" and [line.split()[0] for line in lines[2:]] == [v for v in VARIANTS
                                                                                       for _ in (0, 1)]


def test_lint_and_kernels_take_it_too():
    doc = json.loads(run("lint", "--format", "json", RUN))
    assert len(doc["traces"]) == 10 and len(doc["runs"]) == 5
    assert len(json.loads(run("kernels", "--format", "json", RUN))["traces"]) == 10


WILD = DATA / "wild"


def test_a_folder_of_traces_at_mixed_depths_is_read_each_trace_named(tmp_path):
    """`tests/data/wild` holds traces one, two and three levels down, and a folder
    (`tensorboard-plugin/`) whose own JSON is `published.json`, not a trace, above two run
    folders: every trace is read (each rank's last profiling cycle: the plugin's
    `resnet50_num_workers_0` holds two of one worker, named by their time), and the table tells
    the files of one name in two folders apart."""
    files = sorted(str(p) for p in WILD.rglob("*.json.gz"))
    earlier = str(WILD / "tensorboard-plugin" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz")
    assert earlier in files and len({p.split("/")[-3] for p in files}) > 2
    traces = json.loads(run("summary", "--format", "json", WILD))["traces"]
    assert sorted(t["path"] for t in traces) == [f for f in files if f != earlier]
    shown = [line.split()[0] for line in run("summary", "--columns", "run,device", WILD).splitlines()[2:]]
    assert {"h100/Qwen_Qwen1.5-0.5B-Chat__1016005", "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005"} <= set(shown)
    empty = tmp_path / "nothing" / "deeper"
    empty.mkdir(parents=True)
    (empty / "published.json").write_text("{}")
    result = CliRunner().invoke(main, ["summary", str(tmp_path / "nothing")])
    assert result.exit_code == 2
    assert messages(result.stderr) == [f"tracekit: {tmp_path / 'nothing'}: no trace files in this directory or the " \
                                      "folders below it"]
