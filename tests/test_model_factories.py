"""`tracekit profile --model`: the user's own model (examples/mlp_stack.py), a Hugging Face
config, factories that break the contract, and workers that die hard."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tracekit

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mlp_stack.py"
VARIANTS = ["ddp", "fsdp1", "fsdp2"]
# every variant that runs on CPU (float8 needs a GPU)
CPU_VARIANTS = [*VARIANTS, "fsdp1-nolimit", "fsdp2-root", "fsdp2-noreshard", "fsdp2-compile", "lightning-ddp",
                "lightning-fsdp2"]
CALLS = []  # factory calls in this process: one per variant in a worker


def tracekit_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tracekit", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def example_workload():
    from tracekit.runners.factories import import_file

    return import_file(str(EXAMPLE)).mlp_stack()


def dies_in_second_variant():
    """The example's workload, whose forward ends rank 1's process (`os._exit(1)`, as the
    out-of-memory killer would) in the second variant this process builds."""
    CALLS.append(1)
    workload = example_workload()
    if os.environ.get("RANK") == "1" and len(CALLS) == 2:
        workload.model.register_forward_pre_hook(lambda *_: os._exit(1))
    return workload


def misbehaving():
    """The example's workload; on rank 1, what `TK_MISBEHAVE` (comma-separated, one per call of
    this factory on rank 1 in the whole run, counted in `TK_MARKS` across fresh workers) says:
    `raise` (the factory fails on this rank only), `abort-after-teardown` (SIGABRT right after
    this variant's process group is destroyed), `abort-at-exit` (SIGABRT as the worker process
    exits: in multiprocessing's exit finalizers, as a forked worker runs no atexit handlers), `stuck-teardown` (destroying the group never returns), `abort` (SIGABRT now), `mismatch`
    (an all-reduce of its own before each forward), `ok`."""
    import multiprocessing.util
    import threading

    import torch.distributed as dist

    if os.environ.get("RANK") != "1":
        return example_workload()
    marks = Path(os.environ["TK_MARKS"])
    call = len(list(marks.iterdir()))
    (marks / str(call)).touch()
    what = os.environ["TK_MISBEHAVE"].split(",")[call]
    if what == "raise":
        raise RuntimeError("the factory broke on rank 1")
    if what == "abort":
        os.abort()
    if what == "mismatch":  # an all-reduce rank 0 does not make, larger than its first gradient bucket
        workload = example_workload()
        workload.model.register_forward_pre_hook(lambda *_: dist.all_reduce(torch.ones(4_000_000)))
        return workload
    if what == "abort-at-exit":
        multiprocessing.util.Finalize(None, os.abort, exitpriority=0)
    destroy = dist.destroy_process_group
    if what == "abort-after-teardown":
        dist.destroy_process_group = lambda *a: (destroy(*a), os.abort())
    if what == "stuck-teardown":
        dist.destroy_process_group = lambda *a: threading.Event().wait()
    return example_workload()


def with_sgd():
    """The example's workload, trained with plain SGD (lr 0.05) instead of the default optimizer."""
    workload = example_workload()
    workload.optimizer = lambda params: torch.optim.SGD(params, lr=0.05)
    workload.optimizer.__name__ = "sgd"
    return workload


def not_a_workload():
    return torch.nn.Linear(2, 2)


def no_blocks():
    workload = example_workload()
    workload.blocks = []
    return workload


@pytest.fixture(scope="session")  # made once, whatever order the tests run in
def example_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "run"
    result = tracekit_cli("profile", "--device", "cpu", "--nproc", 2, "--model", f"{EXAMPLE}:mlp_stack", "--variants",
                          ",".join(CPU_VARIANTS), "--warmup", 2, "--steps", 2, "--rounds", 1, "--block-steps", 1, "--no-report", "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    variants = json.loads((out / "manifest.json").read_text())["variants"]
    failed = {variant: {key: entry.get(key) for key in ("message", "fault", "stderr")}
              for variant, entry in variants.items() if entry["status"] != "ok"}
    assert not failed, failed  # every test of this run shows why: the message, the fault dump, the last lines
    return out


def test_the_example_model_trains_in_every_variant(example_run):
    manifest = json.loads((example_run / "manifest.json").read_text())
    workload = example_workload()
    assert manifest["model"]["parameters"] == sum(p.numel() for p in workload.model.parameters())
    assert manifest["model"]["blocks"] == len(workload.model.blocks)
    assert manifest["progress"] == {"done": len(CPU_VARIANTS), "of": len(CPU_VARIANTS)}
    for variant in CPU_VARIANTS:
        entry = manifest["variants"][variant]
        assert entry["tokens_per_s"] is None  # the batches do not count tokens
        for rank in (0, 1):
            trace = tracekit.load(example_run / variant / f"rank{rank}.pt.trace.json.gz")
            assert trace.rank == rank and trace.world_size == 2 and trace.steps["step"].to_list() == [1]
    result = tracekit_cli("check", "--format", "json", example_run)
    parity = json.loads(result.stdout)["parity"]
    assert result.returncode == 0 and {"params.sum", "params.sum_sq"} <= {r["figure"] for r in parity}


def test_parameter_checksums_equal_one_process_training_on_both_ranks_batches(example_run):
    """Data parallelism over 2 ranks is training on both ranks' batches with the mean of their
    losses: replayed in this process (same seed, AdamW lr 1e-4, warm-up + timed steps), the
    parameters' Σθ² and sampled elements equal every variant's checksum."""
    manifest = json.loads((example_run / "manifest.json").read_text())
    torch.manual_seed(manifest["config"]["seed"])
    workload = example_workload()
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timed = len(manifest["variants"][CPU_VARIANTS[0]]["ranks"][0]["step_ms"]["all"])
    for step in range(manifest["config"]["warmup"] + timed):
        losses = [workload.loss(model(x), y) for x, y in (workload.batch(step, r, "cpu") for r in (0, 1))]
        (sum(losses) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    params = dict(model.named_parameters())
    sum_sq = sum(float((p.detach().double() ** 2).sum()) for p in params.values())
    for variant in CPU_VARIANTS:
        for r in manifest["variants"][variant]["ranks"]:
            checksum = r["param_checksum"]
            assert checksum["sum_sq"] == pytest.approx(sum_sq, rel=1e-6)
            for name, value in checksum["samples"]:
                param, index = name[:-1].split("[")
                assert value == pytest.approx(float(params[param].detach().flatten()[int(index)]), rel=1e-5, abs=1e-7)


def test_a_factory_brings_its_own_optimizer(tmp_path):
    """A `Workload.optimizer` is what trains: the manifest names it, and the parameters after
    the run equal this process's replay of the same steps with SGD (one rank, so DDP is plain
    training), not with the default AdamW."""
    out = tmp_path / "run"
    result = tracekit_cli("profile", "--device", "cpu", "--nproc", 1, "--model", f"{Path(__file__)}:with_sgd",
                          "--variants", "ddp", "--warmup", 1, "--steps", 2, "--rounds", 1, "--block-steps", 1, "--profile-steps", 0, "--no-report",
                          "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["optimizer"] == "sgd"
    torch.manual_seed(manifest["config"]["seed"])
    workload = example_workload()
    optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.05)
    for step in range(3):
        x, y = workload.batch(step, 0, "cpu")
        workload.loss(workload.model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    sum_sq = sum(float((p.detach().double() ** 2).sum()) for p in workload.model.parameters())
    assert manifest["variants"]["ddp"]["ranks"][0]["param_checksum"]["sum_sq"] == pytest.approx(sum_sq, rel=1e-9)


def test_a_hugging_face_config_trains_in_every_variant(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
              "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
              "vocab_size": 512, "max_position_embeddings": 128}
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    result = tracekit_cli("profile", "--device", "cpu", "--nproc", 2, "--model", f"hf:{tmp_path / 'llama'}",
                          "--variants", ",".join(VARIANTS), "--warmup", 1, "--steps", 2, "--rounds", 1, "--block-steps", 1, "--no-report", "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    own = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    assert manifest["model"]["architecture"] == "LlamaForCausalLM"
    assert manifest["model"]["parameters"] == own.num_parameters() and manifest["model"]["blocks"] == 2
    for variant in VARIANTS:
        entry = manifest["variants"][variant]
        assert entry["status"] == "ok" and entry["tokens_per_s"] > 0
        assert all(r["real_tokens"] == [2 * 64] * 2 for r in entry["ranks"])  # batch 2 × seq 64 of the tiny preset
        assert all((out / variant / f"rank{rank}.pt.trace.json.gz").exists() for rank in (0, 1))
    assert tracekit_cli("check", out).returncode == 0


def test_a_worker_that_dies_hard_loses_only_its_variant(tmp_path):
    """Sequentially, rank 1 ends its process in fsdp1's first forward: ddp (before) kept its traces, fsdp1 is
    an error naming rank 1, fsdp2 ran on fresh workers; one line about it, no traceback; with
    --strict the exit status says a variant failed."""
    out = tmp_path / "run"
    result = tracekit_cli("profile", "--device", "cpu", "--nproc", 2, "--model",
                          f"{Path(__file__)}:dies_in_second_variant", "--variants", ",".join(VARIANTS), "--warmup", 1,
                          "--steps", 2, "--compare", "sequential", "--no-report", "--strict", "--out", out)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    statuses = {v: e["status"] for v, e in manifest["variants"].items()}
    assert statuses == {"ddp": "ok", "fsdp1": "error", "fsdp2": "ok"} and manifest["progress"] == {"done": 3, "of": 3}
    failed = manifest["variants"]["fsdp1"]
    assert failed["message"] == "rank 1: the worker exited with code 1" and failed["failed_ranks"] == [1]
    assert [line for line in result.stderr.splitlines() if "fsdp1: error" in line] == \
        ["tracekit profile: fsdp1: error (rank 1: the worker exited with code 1); going on with fresh workers"]
    for variant in ("ddp", "fsdp2"):
        assert all((out / variant / f"rank{rank}.pt.trace.json.gz").exists() for rank in (0, 1))


def misbehaving_run(tmp_path, what: str, *args, variants=VARIANTS):
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "tracekit", "profile", "--device", "cpu", "--nproc", "2",
                             "--model", f"{Path(__file__)}:misbehaving", "--variants", ",".join(variants),
                             "--warmup", "1", "--steps", "2", "--compare", "sequential", "--no-report", "--out", str(out), *args],
                            capture_output=True, text=True, timeout=300,  # not 600 s of a collective's timeout
                            env={**os.environ, "TK_MARKS": str(marks), "TK_MISBEHAVE": what})
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result, json.loads((out / "manifest.json").read_text()), out


def test_deaths_are_charged_to_what_the_rank_was_doing(tmp_path):
    """Rank 1's factory raises in ddp (its peer, built, hears of it through the store and never
    enters DDP's constructor, where on NCCL it would wait for the collective timeout: the variant
    ends at once, with the factory's error); rank 1 aborts right after fsdp1's teardown (fsdp1
    finished: it stays ok, nothing is charged, fresh workers go on) and again at the interpreter's
    exit after fsdp2, the last variant (the run had succeeded: exit 0, the manifest complete)."""
    result, manifest, out = misbehaving_run(tmp_path, "raise,abort-after-teardown,abort-at-exit")
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = {v: e["status"] for v, e in manifest["variants"].items()}
    assert statuses == {"ddp": "error", "fsdp1": "ok", "fsdp2": "ok"} and manifest["progress"] == {"done": 3, "of": 3}
    failed = manifest["variants"]["ddp"]
    assert failed["message"].startswith("rank 1: WorkloadError: ") and failed["failed_ranks"] == [0, 1]
    assert failed["messages"]["0"] == "BuildFailedElsewhere: rank 1 failed while building: " + failed["message"][8:]
    assert failed["message"].endswith("the factory raised RuntimeError: the factory broke on rank 1")
    for variant in ("fsdp1", "fsdp2"):
        assert all((out / variant / f"rank{rank}.pt.trace.json.gz").exists() for rank in (0, 1))
    lines = [line for line in result.stderr.splitlines() if "died" in line]
    assert len(lines) == 2 and "between variants (rank 1: the worker killed by SIGABRT, in " in lines[0]
    assert "going on with fresh workers" in lines[0] and "died after the last variant" in lines[1]


def test_a_stuck_teardown_and_an_abort_are_named(tmp_path):
    """Rank 1's teardown of ddp never returns: after the bound (the collective timeout, 10 s)
    the worker ends and fresh workers go on, ddp kept; then rank 1 aborts while building fsdp1:
    fsdp1 is the error, its message naming the signal and where Python was (the fault dump).
    (With 5 s, once in four runs on a 2-core machine at load 8, ddp's own collectives timed out.)"""
    result, manifest, out = misbehaving_run(tmp_path, "stuck-teardown,abort,ok", "--collective-timeout", "10")
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = {v: e["status"] for v, e in manifest["variants"].items()}
    assert statuses == {"ddp": "ok", "fsdp1": "error", "fsdp2": "ok"}, (manifest["variants"], result.stderr[-3000:])
    assert "rank 1: ddp's process group did not end within 10 s" in result.stderr
    assert "rank 1 died between variants (rank 1: the worker ended: its process group did not end in time)" \
        in result.stderr
    failed = manifest["variants"]["fsdp1"]
    assert failed["message"].startswith("rank 1: the worker killed by SIGABRT, in misbehaving (")
    assert f"{Path(__file__).name}:" in failed["message"] and "Fatal Python error: Aborted" in failed["fault"]
    assert all((out / "ddp" / f"rank{rank}.pt.trace.json.gz").exists() for rank in (0, 1))


def test_a_collective_mismatch_is_named_by_what_gloo_said(tmp_path):
    """Rank 1 makes an all-reduce of its own before its first forward: rank 0's first gradient
    all-reduce receives rank 1's larger message, and gloo's network thread ends rank 0 with an
    uncaught C++ exception (SIGABRT; no Python frame of that thread in the fault dump). The
    variant's message says what gloo said (from the worker's stderr, kept), and each rank's last
    lines are in `stderr` (rank 1 printed none)."""
    result, manifest, _ = misbehaving_run(tmp_path, "mismatch", variants=["ddp"])
    assert result.returncode == 1, result.stderr[-3000:]  # no variant succeeded
    failed = manifest["variants"]["ddp"]
    assert failed["message"].startswith("rank 0: the worker killed by SIGABRT (gloo::EnforceNotMet: [enforce fail at "), \
        failed
    assert "op.preamble.length <= op.nbytes" in failed["message"] and "collective mismatch" in failed["message"]
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in failed["stderr"]["0"]
    assert "ddp: building" in failed["stderr"]["0"]  # rank 0's progress lines before it


@pytest.mark.parametrize("model, problem", [
    ("no_such_module_tk:make", "--model no_such_module_tk:make: cannot import no_such_module_tk "
                               "(ModuleNotFoundError: No module named 'no_such_module_tk')"),
    ("{here}:not_a_workload", "--model {here}:not_a_workload: the factory returned Linear, not a "
                              "tracekit.runners.workload.Workload"),
    ("{here}:no_blocks", "--model {here}:no_blocks: no blocks found (Workload.blocks is empty)"),
    ("{here}:absent", "--model {here}:absent: {here} has no callable 'absent'"),
    ("hf:{tmp}/config.json", "--model hf:{tmp}/config.json: {tmp}/config.json has no model_type (not a "
                             "transformers config.json)"),
    ("hf:{tmp}/none.json", "--model hf:{tmp}/none.json: cannot read {tmp}/none.json (FileNotFoundError: [Errno 2] "
                           "No such file or directory: '{tmp}/none.json')"),
])
def test_a_bad_factory_is_one_line_before_any_worker(tmp_path, model, problem):
    here = Path(__file__)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    result = tracekit_cli("profile", "--device", "cpu", "--model", model.format(here=here, tmp=tmp_path),
                          "--out", tmp_path / "x")
    assert result.returncode == 2
    from conftest import messages  # here: the module is imported as a factory too
    assert messages(result.stderr) == [f"tracekit: {problem.format(here=here, tmp=tmp_path)}"]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, problem", [
    (["--nproc", 0], "--nproc 0: at least 1 worker"),
    (["--nproc", -2], "--nproc -2: at least 1 worker"),
    (["--variants", "ddp,fsdp2,ddp"], "variant(s) named twice: ddp (use --repeats to run a variant again)"),
    (["--steps", 0, "--profile-steps", 0], "--warmup and --steps must be at least 1"),
    (["--profile-rounds", 0], "--profile-rounds must be at least 1"),
    (["--profile-mode", "full", "--profile-rounds", 3], "--profile-rounds 3: only the cupti mode captures in rounds "
                                                        "(--profile-mode full records one block)"),
    (["--model", f"{EXAMPLE}:mlp_stack", "--seq", 8], f"--seq: the model of --model {EXAMPLE}:mlp_stack has its own "
                                                     "shapes"),
])
def test_bad_arguments_are_one_line(tmp_path, args, problem):
    result = tracekit_cli("profile", "--device", "cpu", *args, "--out", tmp_path / "x")
    from conftest import messages  # here: the module is imported as a factory too
    assert result.returncode == 2 and messages(result.stderr) == [f"tracekit: {problem}"]
    assert not (tmp_path / "x").exists()


def test_a_failed_group_is_aborted_and_not_waited_for_past_the_bound(monkeypatch):
    """A teardown that never returns (a communicator stuck in a timed-out collective): the
    NCCL group is aborted first and end_group gives up after its bound."""
    import threading

    import torch.distributed as dist

    from tracekit.runners import worker

    calls, never = [], threading.Event()
    monkeypatch.setattr(dist, "is_initialized", lambda *a: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda *a: calls.append("abort"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: (calls.append("destroy"), never.wait()))
    assert worker.end_group(True, 0.2) is False and calls == ["abort", "destroy"]
    never.set()


@pytest.mark.parametrize("args", [["--nproc", "0"], ["--variants", "ddp,fsdp3"], ["--steps", "0"],
                                  ["--batch", "2", "--global-batch", "4"], ["--repeats", "0"]])
def test_bad_arguments_are_refused_before_torch_is_imported(tmp_path, args):
    """Importing torch takes seconds: a mistake in profile's arguments is one line without it."""
    probe = ("import sys\nfrom tracekit.front.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    print(e.code, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe, "profile", "--device", "cpu", *args, "--out",
                             str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["2", "False"] and result.stderr.startswith("tracekit: "), result.stderr


def test_an_existing_out_is_refused_before_torch_is_imported(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("the user's")
    probe = ("import sys\nfrom tracekit.front.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    print(e.code, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe, "profile", "--device", "cpu", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["2", "False"]
    from conftest import messages  # here: the module is imported as a factory too
    assert messages(result.stderr) == [f"tracekit: {tmp_path / 'x'} exists; pass --overwrite to write into it"]
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["mine.txt"]
