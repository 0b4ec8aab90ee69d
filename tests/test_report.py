"""`tracekit report`: --baseline, its JSON object, and the picture's figures (`step_split`)."""

import json

import pytest

import synth
from click.testing import CliRunner
from conftest import DATA

import tracekit
from tracekit.analyses.variants import step_split
from tracekit.front.cli import main

RUN = DATA / "h200x2-blocks4"
US = 1000


def test_report_json_holds_rows_phases_diffs_and_warnings():
    result = CliRunner().invoke(main, ["report", "--baseline", "fsdp1", "--format", "json", str(RUN)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"comparison", "variants", "phases", "critical_path", "diffs", "warnings"}
    assert (doc["comparison"]["design"], doc["comparison"]["control"]) == ("sequential", None)
    manifest = json.loads((RUN / "manifest.json").read_text())
    ran = [v for v, e in manifest["variants"].items() if e["status"] == "ok"]
    assert {r["variant"] for r in doc["variants"] if r["verdict"] == "base"} == {"fsdp1"}
    assert [(d["a"], d["b"]) for d in doc["diffs"]] == [("fsdp1", v) for v in ran if v != "fsdp1"]
    for d in doc["diffs"]:
        assert d["rank"] is None and d["rank_agg"] == "sum" and len(d["ranks"]) == 2 and d["lead"]
        assert sum(i["delta_ns"] for i in d["items"]) == d["step_delta_ns"]
        assert d["step_delta_ns"] == sum(r["step_delta_ns"] for r in d["ranks"])
    assert all(isinstance(w, str) for w in doc["warnings"])
    assert [r["variant"] for r in doc["critical_path"]] == ran
    for r in doc["critical_path"]:  # the path's parts add up to the step's span (each rounded to µs)
        parts = sum(r[f"{c}_ms"] for c in ("host", "runtime", "compute", "comm", "copy", "waiting"))
        assert parts == pytest.approx(r["span_ms"], abs=0.004)


def test_report_plot_writes_a_png(tmp_path):
    out = tmp_path / "r.png"
    result = CliRunner().invoke(main, ["report", "--plot", str(out), str(RUN)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stderr.strip().splitlines()[-1] == f"tracekit: wrote {out}"


def test_step_split_by_hand(tmp_path):
    """One rank per variant. a: k1 [0,100) and an all-gather [50,150) µs → compute 100,
    exposed comm 50. b: k1 [0,100), the all-gather [100,130) → compute 100, exposed comm 30,
    and k2 [130,140) → compute 110."""
    a = [synth.step(1, 0.0, 500.0), *synth.launched("k1", 1.0, 0.0, 100.0, corr=1),
         *synth.nccl("all_gather", 2.0, 50.0, 100.0, corr=2)]
    b = [synth.step(1, 0.0, 500.0), *synth.launched("k1", 1.0, 0.0, 100.0, corr=1),
         *synth.nccl("all_gather", 2.0, 100.0, 30.0, corr=2), *synth.launched("k2", 3.0, 130.0, 10.0, corr=3)]
    runs = {}
    for name, events in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        synth.write(tmp_path / name, "rank0.json", synth.doc(events))
        runs[name] = tracekit.load(tmp_path / name)
    got = {(v, p): ms for v, p, ms in step_split(runs).iter_rows()}
    assert got == {("a", "compute"): 0.1, ("a", "exposed comm"): 0.05,
                   ("b", "compute"): 0.11, ("b", "exposed comm"): 0.03}


def test_a_folder_with_trace_less_variants_reports_every_variant():
    """tests/data/h200x1-device keeps fsdp2's trace only, its manifest lists fsdp1 and
    fsdp2-compile as ok too: every variant's timed step time is shown (the step time of
    docs/metrics.md, computed here from the manifest's per-rank steps over the 3 repeats), a
    warning names the variants without a trace, and the table shows peak memory and recompiles."""
    import numpy as np

    out = DATA / "h200x1-device"
    result = CliRunner().invoke(main, ["report", "--format", "json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {r["variant"] for r in doc["variants"]} == {"fsdp1", "fsdp2", "fsdp2-compile"}
    for r in doc["variants"]:
        repeats = manifest["variants"][r["variant"]]["repeats"]
        steps = np.concatenate([np.max([x["step_ms"] for x in rep["ranks"]], axis=0) for rep in repeats])
        assert r["step_ms"] == round(float(np.median(steps)), 3)
    assert "no trace here for fsdp1, fsdp2-compile (recorded with --profile-steps 0, or not kept): their timed " \
           "figures only" in doc["warnings"]
    table = CliRunner().invoke(main, ["report", str(out)])
    design, header = table.stdout.splitlines()[0], table.stdout.splitlines()[1].split()
    assert design.startswith("compared sequentially: each variant in its own workers, 3 repeats")
    assert table.exit_code == 0 and {"peak_mem", "recompiles"} <= set(header)
    assert max(len(line) for line in table.stdout.splitlines()) <= 100


def test_variants_loaded_in_threads_give_the_serial_report(tmp_path, monkeypatch):
    """A report's variants are loaded and analysed in a pool of threads, as many as the cores:
    the JSON, the table and the warnings of four threads (more threads than this 2-core
    machine's cores) are those of one (`TRACEKIT_CORES=1`), the cache off; and where
    two variants' traces are broken, the error is the first one's in the manifest's order, as
    loading them one by one gives."""
    import shutil

    def report(cores, *extra):
        monkeypatch.setenv("TRACEKIT_CORES", str(cores))
        result = CliRunner().invoke(main, ["report", *extra, str(RUN)])
        assert result.exit_code == 0, result.output
        return result.stdout, result.stderr

    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    for extra in ([], ["--format", "json"]):
        assert report(1, *extra) == report(4, *extra)
    broken = tmp_path / "run"
    shutil.copytree(RUN, broken)
    for variant in ("fsdp2", "fsdp1"):  # the manifest lists ddp, fsdp1, fsdp2, …
        (broken / variant / "rank1.pt.trace.json.gz").write_bytes(b"\x1f\x8b not gzip")
    said = set()
    for cores in (1, 4):
        monkeypatch.setenv("TRACEKIT_CORES", str(cores))
        result = CliRunner().invoke(main, ["report", str(broken)])
        assert result.exit_code == 2 and "fsdp1" in result.stderr and "fsdp2" not in result.stderr, result.stderr
        said.add(result.stderr)
    assert len(said) == 1


def test_an_interleaved_report_says_its_design_and_the_controls_delta(tmp_path):
    """A profile output made to the runner's contract for the interleaved comparison (no traces:
    timed figures only; `test_interleaved.interleaved`, the H100 experiment's rounds): the table
    starts with the design and the A/A control's Δ, fits 100 columns, and fsdp2's verdict is over
    10 rounds; the JSON carries `comparison` with the control's interval."""
    from test_interleaved import CONTROL, FSDP2, interleaved

    (tmp_path / "manifest.json").write_text(json.dumps(interleaved()))
    table = CliRunner().invoke(main, ["report", str(tmp_path)], env={"COLUMNS": "100"})
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0] == "compared interleaved in one process: 10 rounds of blocks of 5 steps, mirrored;"
    assert lines[2] == f"A/A control fsdp1-control − fsdp1: +{CONTROL[0]:.3f} ms [-3.044, +{CONTROL[1][1]:.3f}]"
    assert max(len(line) for line in lines) <= 100
    assert any(line.startswith("fsdp2 ") and "slower in 10 rounds" in line for line in lines)
    doc = json.loads(CliRunner().invoke(main, ["report", "--format", "json", str(tmp_path)]).stdout)
    assert doc["comparison"]["design"] == "interleaved" and doc["comparison"]["control_d_ms"] == CONTROL[0]
    fsdp2 = next(r for r in doc["variants"] if r["variant"] == "fsdp2")
    assert fsdp2["d_step_ms"] == FSDP2[0] and fsdp2["rounds"] == 10
