"""`tracekit profile` on CPU: 2 processes over gloo, the README's main job, made in the test."""

import json
import subprocess
import sys

import pytest

import tracekit
from tracekit.analyses.summary import summary
from tracekit.analyses.variants import count_check

VARIANTS = ["ddp", "fsdp1", "fsdp2"]


def tracekit_cli(*args):
    return subprocess.run([sys.executable, "-m", "tracekit", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "run"
    result = tracekit_cli("profile", "--device", "cpu", "--nproc", 2, "--preset", "tiny", "--variants",
                          ",".join(VARIANTS), "--warmup", 2, "--steps", 3, "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_every_variant_ran_on_both_ranks(out):
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["variants"]) == VARIANTS
    for variant, entry in manifest["variants"].items():
        assert entry["status"] == "ok", entry
        assert [r["rank"] for r in entry["ranks"]] == [0, 1]
        for rank in (0, 1):
            trace = tracekit.load(out / variant / f"rank{rank}.pt.trace.json.gz")
            assert trace.rank == rank and trace.world_size == 2 and trace.steps["step"].to_list() == [1]


def test_trace_collectives_equal_what_the_runtime_counted(out):
    manifest, runs = tracekit.loading.load_profile(out)
    table = count_check(manifest, runs)
    assert table.height > 0 and table["match"].all(), table
    for variant in ("fsdp1", "fsdp2"):
        for r in manifest["variants"][variant]["ranks"]:
            runtime = r["runtime_counts"]
            gathers = sum(runtime.get(k, 0) for k in ("all_gather_into_tensor", "all_gather_single", "all_gather"))
            step = summary(runs[variant].traces[r["rank"]]).row(0, named=True)
            assert gathers > 0 and step["collectives.all_gather"] == gathers


def test_same_model_and_data_in_every_variant(out):
    """Same seed → same weights and tokens: the first step's loss agrees across variants, per rank."""
    manifest = json.loads((out / "manifest.json").read_text())
    for rank in (0, 1):
        losses = [e["ranks"][rank]["first_step"]["loss"] for e in manifest["variants"].values()]
        assert max(losses) - min(losses) < 1e-4, losses
    fractions = {v: e["ranks"][0]["local_param_fraction"] for v, e in manifest["variants"].items()}
    assert fractions["ddp"] == 1.0 and 0.4 < fractions["fsdp2"] < 0.6


def test_check_passes_and_report_prints(out):
    assert tracekit_cli("check", out).returncode == 0
    report = tracekit_cli("report", "--format", "csv", out)
    assert report.returncode == 0 and report.stdout.splitlines()[0].startswith("variant,rank,status,step_ms")


def test_existing_out_is_not_overwritten(out):
    before = (out / "manifest.json").read_bytes()
    result = tracekit_cli("profile", "--device", "cpu", "--variants", "ddp", "--out", out)
    assert result.returncode == 2 and result.stderr.strip() == f"tracekit: {out} exists; pass --overwrite to write into it"
    assert (out / "manifest.json").read_bytes() == before


def test_unknown_variant_is_rejected(tmp_path):
    result = tracekit_cli("profile", "--device", "cpu", "--variants", "ddp,fsdp3", "--out", tmp_path / "x")
    assert result.returncode == 2 and "unknown variant(s) fsdp3" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()


def test_a_failing_variant_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    """One real worker (world size 1, gloo) where fsdp1 raises and fsdp2 runs out of memory."""
    import socket

    import torch

    from tracekit.runners import worker

    real = worker.run_variant

    def flaky(variant, *args):
        if variant == "fsdp1":
            raise RuntimeError("boom")
        if variant == "fsdp2":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(variant, *args)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(worker, "run_variant", flaky)
    cfg = {"out": str(tmp_path), "variants": ["fsdp1", "fsdp2", "ddp"], "preset": "tiny", "overrides": {},
           "device": "cpu", "nproc": 1, "precision": "fp32", "seed": 0, "warmup": 1, "steps": 1, "with_stack": False}
    results = worker.worker_main(cfg)
    assert results["fsdp1"]["status"] == "error" and results["fsdp1"]["message"] == "RuntimeError: boom"
    assert results["fsdp2"]["status"] == "oom" and "out of memory" in results["fsdp2"]["message"]
    assert results["ddp"]["status"] == "ok" and (tmp_path / "ddp" / "rank0.pt.trace.json.gz").exists()
