"""Every JSON the CLI writes is strict JSON: an undefined figure is null, never NaN or Infinity."""

import json
import math

import polars as pl
import pytest
import synth
from click.testing import CliRunner
from conftest import DATA

from tracekit.front.cli import main
from tracekit.front.render import json_text, render_frame


def strict(text: str):
    """`text` parsed by a parser that refuses NaN, Infinity and -Infinity."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def test_an_undefined_figure_is_null():
    doc = {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}], "d": (2, None)}
    assert strict(json_text(doc)) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2, None]}
    frame = pl.DataFrame({"x": [1.0, float("nan"), float("inf")], "l": [[1.0], [float("nan")], []]})
    assert strict(render_frame(frame, "json")) == [{"x": 1.0, "l": [1.0]}, {"x": None, "l": [None]},
                                                    {"x": None, "l": []}]
    assert render_frame(frame, "csv").splitlines()[2].endswith(',[null]')  # nested JSON text in csv too


def zero_duration_collective(tmp_path):
    """A step whose first all-gather takes 0 µs: its bandwidth is undefined."""
    events = [synth.step(1, 0.0, 100.0), *synth.nccl("all_gather", 1.0, 10.0, 0.0, corr=1),
              *synth.nccl("all_gather", 2.0, 20.0, 10.0, corr=2), *synth.launched("k", 3.0, 40.0, 5.0, corr=3)]
    return synth.write(tmp_path, "rank0.json", synth.doc(events))


VERBS = [["summary"], ["summary", "--scope", "trace"], ["syncs"], ["comms"], ["overlap"],
         ["overlap", "--scope", "hta"], ["breakdown"], ["kernels"], ["launches"], ["lint"]]


@pytest.mark.parametrize("where", ["h200x2-small/fsdp1", "wild/tracelens/mi300", "synthetic"])
def test_every_verb_writes_strict_json(tmp_path, where):
    path = zero_duration_collective(tmp_path) if where == "synthetic" else DATA / where
    for verb in VERBS:
        result = CliRunner().invoke(main, [*verb, "--format", "json", str(path)])
        assert result.exit_code == 0, (verb, result.output)
        assert strict(result.stdout)["traces"], verb
    result = CliRunner().invoke(main, ["diff", "--format", "json", str(path), str(path)])
    assert result.exit_code == 0, result.output
    strict(result.stdout)
    result = CliRunner().invoke(main, ["cache", "info", "--format", "json"])
    assert result.exit_code == 0 and strict(result.stdout)["folder"]
