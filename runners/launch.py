"""`tracekit profile`: start the workers (or be one), then write OUT/manifest.json.

Under torchrun or srun (RANK and WORLD_SIZE set) this process is one worker. Otherwise it
starts `nproc` workers on this node through torch's elastic launch API.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import multiprocessing
import os
import re
import signal
import socket
import sys
import tempfile
import uuid
from multiprocessing import forkserver
from pathlib import Path

from tracekit.core.errors import TracekitError

# NVLink multicast off: NCCL NVLS, PyTorch symmetric memory, NVSHMEM (shared machines).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# cupti mode's rounds (C R C R … C): a round's recorded block is weighed against the control
# blocks right beside it, which a host whose speed drifts for seconds moves with it. One round's
# ratio still moves ±11 % (sd of 45 rounds on one H200): the median of 5 read > 1.10 by noise alone
# in 8 % of variants, of 9 in 3 % (resampled; docs/profile.md)
PROFILE_ROUNDS = 9
# Workers are forked from one server process that has imported torch, dynamo and the worker
# (seconds of imports, once per run instead of once per worker and per fresh start). The server
# is a fresh interpreter, not this process: nothing of the launcher's state (an initialised CUDA
# driver, a factory module's globals) reaches the workers.
START_METHOD = "forkserver"
WORKER_PRELOAD = ["torch", "torch._dynamo", "tracekit.runners.plan"]


def start_worker_server() -> None:
    """Start the server the workers are forked from (`START_METHOD`), if it is not running; the
    workers get its environment, so multicast is off in it. It ends with this process, at once:
    not after its imports (a mistake found meanwhile) or its teardown of torch (seconds, holding
    this process's stdout and stderr open)."""
    if forkserver._forkserver._forkserver_pid is not None:
        return
    os.environ.update(MULTICAST_OFF)
    multiprocessing.set_forkserver_preload(WORKER_PRELOAD)
    forkserver.ensure_running()
    atexit.register(os.kill, forkserver._forkserver._forkserver_pid, signal.SIGKILL)


class ProfileError(TracekitError):
    """A profile run that cannot start (bad options, OUT exists)."""


def make_config(options: dict) -> dict:
    """The run's configuration from the command's options, every one checked before any
    worker starts (a bad one raises ProfileError: one line) — those that need no torch before
    torch is imported (seconds) — the model factory included: it is built once on the meta
    device (no memory) and checked against the contract (`runners/workload.py`).
    `global_batch` sets the batch per rank (strong scaling) and must divide by the world size."""
    from .checkpoint import MODES
    from .variants import check_variants

    o = {"model": "builtin", **options}
    own = o["model"] != "builtin" and not o["model"].startswith("hf:")
    fixed = ["blocks", "hidden", "heads"] + (["seq", "batch"] if own else [])
    given = [k for k in fixed if o["overrides"].get(k) is not None] + \
        (["global-batch"] if own and o["global_batch"] is not None else []) + \
        (["inputs"] if own and o["inputs"] != "fixed" else [])
    rules = [(o["nproc"] is None or o["nproc"] >= 1, f"--nproc {o['nproc']}: at least 1 worker"),
             (not given, f"--{', --'.join(given)}: the model of --model {o['model']} has its own shapes"),
             (o["global_batch"] is None or o["overrides"].get("batch") is None,
              "--batch (per rank) and --global-batch (in total) exclude each other"),
             (o["warmup"] >= 1 and o["steps"] >= 1, "--warmup and --steps must be at least 1"),
             (o["profile_steps"] >= 0, "--profile-steps must be 0 or more"),
             (o.get("profile_rounds") is None or o["profile_rounds"] >= 1, "--profile-rounds must be at least 1"),
             (o.get("profile_rounds") in (None, 1) or o["profile_mode"] == "cupti",
              f"--profile-rounds {o.get('profile_rounds')}: only the cupti mode captures in rounds "
              f"(--profile-mode {o['profile_mode']} records one block)"),
             (o["repeats"] >= 1, "--repeats must be at least 1"),
             (o.get("rounds", 1) >= 1 and o.get("block_steps", 1) >= 1, "--rounds and --block-steps must be at least 1"),
             (o.get("compare") != "interleaved" or o["repeats"] == 1,
              f"--repeats {o['repeats']} repeats the sequential comparison; the interleaved one repeats in --rounds"),
             (o.get("compare") != "interleaved" or not o["checkpoint"],
              "--checkpoint times saves in the sequential comparison only (--compare sequential)"),
             (o["checkpoint"] in (None, *MODES), f"--checkpoint: {' or '.join(MODES)}"),
             (o["checkpoint_every"] >= 1, "--checkpoint-every must be at least 1"),
             (o["memory_fraction"] is None or 0 < o["memory_fraction"] <= 1, "--memory-fraction lies in (0, 1]"),
             (o["memory_fraction"] is None or o["device"] != "cpu", "--memory-fraction needs --device cuda")]
    for ok, message in rules:
        if not ok:
            raise ProfileError(message)
    try:
        check_variants(o["variants"])
    except ValueError as e:
        raise ProfileError(str(e)) from None
    o["compare"], o["compare_note"] = comparison_design(o)
    if not under_torchrun():
        start_worker_server()  # its imports overlap this process's own

    import torch

    from .inputs import parse_inputs
    from .model import model_config

    device = o["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfileError("no CUDA device here; use --device cpu")
    if o["memory_fraction"] is not None and device != "cuda":
        raise ProfileError("--memory-fraction needs --device cuda")
    world = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else \
        o["nproc"] or (torch.cuda.device_count() if device == "cuda" else 2)
    if o["global_batch"] is not None:
        if o["global_batch"] < 1 or o["global_batch"] % world:
            raise ProfileError(f"--global-batch {o['global_batch']} does not divide by the world size {world}")
        o["overrides"] = {**o["overrides"], "batch": o["global_batch"] // world}
    try:
        config = model_config(o["preset"], **o["overrides"])
        parse_inputs(o["inputs"], config.seq)
    except ValueError as e:
        raise ProfileError(str(e)) from None
    cfg = {**o, "device": device, "nproc": world, "global_batch": None if own else config.batch * world,
           "precision": o["precision"] or ("bf16" if device == "cuda" else "fp32"),
           "profile_rounds": o.get("profile_rounds") or (PROFILE_ROUNDS if o["profile_mode"] == "cupti" else 1)}
    return {**cfg, "model_info": model_info(cfg)}


def comparison_design(o: dict) -> tuple[str, str]:
    """(design, why) of the run's comparison (docs/profile.md, "Comparing variants"): the one
    asked with `--compare`; by default `interleaved`, except where the variants cannot share a
    process or the options are the sequential design's."""
    from .variants import VARIANTS

    if o.get("compare"):
        return o["compare"], "--compare sequential" if o["compare"] == "sequential" else ""
    lightning = [v for v in o["variants"] if VARIANTS[v].get("lightning")]
    reasons = [(o["repeats"] > 1, f"--repeats {o['repeats']}"), (bool(o["checkpoint"]), "--checkpoint"),
               (bool(lightning), f"Lightning variants ({', '.join(lightning)}) own their process")]
    why = [text for hit, text in reasons if hit]
    return ("sequential", "; ".join(why)) if why else ("interleaved", "")


def model_info(cfg: dict) -> dict:
    """What `--model` builds (the manifest's `model`), built on the meta device: a factory that
    does not fulfil the contract raises ProfileError (one line)."""
    import torch

    from .factories import build_workload, describe, load_factory
    from .workload import WorkloadError

    try:
        with torch.device("meta"):
            return describe(build_workload(load_factory(cfg["model"], cfg), cfg["model"]), cfg["model"])
    except WorkloadError as e:
        raise ProfileError(str(e)) from None


def under_torchrun() -> bool:
    """Whether this process is one rank of a run that torchrun/srun started (not the launcher)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def refuse_existing_out(out: Path, overwrite: bool) -> None:
    """An existing OUT refused at once, before torch is imported (seconds), when this process
    launches the workers; under torchrun/srun `prepare_out` asks every rank."""
    if not under_torchrun() and out.exists() and not overwrite:
        raise ProfileError(f"{out} exists; pass --overwrite to write into it")


def prepare_out(out: Path, overwrite: bool) -> None:
    """Make OUT; an existing one is refused (ProfileError) unless `overwrite`. Under
    torchrun/srun every rank calls this: each says through the store whether it found OUT
    before rank 0 made it, so every rank refuses, or none."""
    if under_torchrun() and not overwrite and out_existed_everywhere(out):
        raise ProfileError(f"{out} exists; pass --overwrite to write into it")
    refuse_existing_out(out, overwrite)
    if os.environ.get("RANK", "0") == "0" or overwrite:
        out.mkdir(parents=True, exist_ok=True)


def out_existed_everywhere(out: Path) -> bool:
    """Whether any rank found `out` before any made it (each rank looks, then they exchange
    what they saw through the rendezvous store)."""
    import datetime

    from .worker import rendezvous_store

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    seen = out.exists()
    store = rendezvous_store(rank, world)
    key = f"tracekit/out/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}:{out}"
    store.set(f"{key}/{rank}", "1" if seen else "0")
    store.wait([f"{key}/{r}" for r in range(world)], datetime.timedelta(minutes=30))
    existed = any(store.get(f"{key}/{r}") == b"1" for r in range(world))
    store.set(f"{key}/read/{rank}", "1")
    if rank == 0:  # rank 0 may host the store (srun): it leaves only once every rank has read
        with contextlib.suppress(Exception):
            store.wait([f"{key}/read/{r}" for r in range(world)], datetime.timedelta(seconds=60))
    return existed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile(cfg: dict) -> dict:
    """Run every variant; returns the manifest (on every rank under torchrun; rank 0 writes it).

    Started here, the workers run the plan until one dies hard (a signal, `os._exit`, the
    out-of-memory killer). Each rank keeps its place in the plan (`worker.Place`), so the death
    is charged to the run the dead rank was in: that run is recorded as `error` naming the rank,
    the cause and where Python was (its fault dump), and fresh workers go on with the rest. A
    death between runs (a teardown, the start of a worker, the interpreter's exit) charges
    nothing: fresh workers go on from the first run not agreed — twice at the same place, and
    that run is charged."""
    from .manifest import write_manifest
    from .plan import record_outcome, runs, worker_main

    os.environ.update(MULTICAST_OFF)
    plan = runs(cfg)
    if under_torchrun():
        # every rank of this process's run must name it alike, without talking: the run and OUT
        cfg = {**cfg, "run_id": f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}:{cfg['out']}"}
        results = worker_main(cfg)
        if int(os.environ["RANK"]) != 0:
            from .manifest import manifest
            return manifest(cfg, results, len(plan), len(plan))
        return write_manifest(cfg, results, len(plan), len(plan))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    cfg = {**cfg, "run_id": uuid.uuid4().hex[:12]}
    start_worker_server()
    results, start, between = {}, 0, None
    with tempfile.TemporaryDirectory(prefix="tracekit-workers-") as state:
        while start < len(plan):
            launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=cfg["nproc"], run_id=cfg["run_id"],
                                  rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                                  monitor_interval=0.5, start_method=START_METHOD)
            try:
                with quiet_elastic():
                    results = elastic_launch(launch, worker_main)(cfg, start, results, state)[0]
                start = len(plan)
            except ChildFailedError as e:
                rank, entry = hard_failure(e, Path(state))
                places = worker_places(Path(state), cfg["nproc"])
                agreed = max(places.values(), key=lambda p: p["done"] or 0, default=None)
                if agreed and (agreed["done"] or 0) > start:
                    results, start = agreed["results"], agreed["done"]
                doing = places.get(rank, {}).get("doing")
                if doing is not None and doing < start:  # it died after its peers agreed on that run
                    doing = None
                if doing is None and start == len(plan):
                    say(f"rank {rank} died after the last variant ({entry['message']}); every variant had finished")
                    break
                if doing is None and between != start:  # between runs: nothing to charge, fresh workers go on
                    between = start
                    say(f"rank {rank} died between variants ({entry['message']}); going on with fresh workers")
                else:
                    repeat, position, variant = plan[start]
                    if doing is None:
                        entry["message"] += " (twice before this variant began)"
                    record_outcome(results, cfg, repeat, position, variant, entry)
                    say(f"{variant}: {entry['status']} ({entry['message']})"
                        + ("; going on with fresh workers" if start + 1 < len(plan) else ""))
                    start += 1
                write_manifest(cfg, results, start, len(plan))
    return write_manifest(cfg, results, len(plan), len(plan))


def say(line: str) -> None:
    print(f"tracekit profile: {line}", file=sys.stderr, flush=True)


def worker_places(state: Path, world: int) -> dict[int, dict]:
    """rank → where that worker was in the plan (`worker.Place`), for the ranks that said."""
    places = {}
    for rank in range(world):
        with contextlib.suppress(OSError, ValueError):
            places[rank] = json.loads((state / f"rank{rank}.json").read_text())
    return places


def hard_failure(error, state: Path) -> tuple[int, dict]:
    """(the rank, a variant entry) for workers that died (torch's ChildFailedError): the first
    to die names the rank and the cause — its exit code or the signal (SIGKILL is what the
    kernel's out-of-memory killer sends) — and where Python was when it died (the innermost
    frame of its fault dump; the whole dump in `fault`)."""
    from .worker import STUCK_EXIT

    rank, first = error.get_first_failure()
    if first.exitcode < 0:
        cause = f"killed by {first.signal_name()}" + (" (the out-of-memory killer sends it)"
                                                      if first.signal_name() == "SIGKILL" else "")
    elif first.exitcode == STUCK_EXIT:
        cause = "ended: its process group did not end in time"
    else:
        cause = f"exited with code {first.exitcode}"
    dump = ""
    with contextlib.suppress(OSError):
        dump = (state / f"rank{rank}.faults").read_text()
    where, tails = fault_frame(dump), stderr_tails(state)
    said = last_words(tails.get(str(rank), ""))
    entry = {"status": "error", "message": f"rank {rank}: the worker {cause}" + (f" ({said})" if said else "")
             + (f", in {where}" if where else ""), "failed_ranks": sorted(error.failures),
             "messages": {str(r): f"exit code {f.exitcode}" for r, f in error.failures.items()}}
    return rank, {**entry, **({"fault": dump} if dump else {}), **({"stderr": tails} if tails else {})}


def stderr_tails(state: Path, size: int = 8192) -> dict[str, str]:
    """rank → the last `size` bytes (whole lines) each worker of the run wrote to stderr
    (`worker.copy_stderr_to`), for the ranks that wrote any."""
    tails = {}
    for path in sorted(state.glob("rank*.stderr")):
        with contextlib.suppress(OSError), open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            text = f.read().decode(errors="replace")
            text = text.split("\n", 1)[1] if f.tell() > size and "\n" in text else text
            if text.strip():
                tails[path.name.removeprefix("rank").removesuffix(".stderr")] = text
    return tails


def last_words(tail: str) -> str | None:
    """What C++ said as it ended the process: the last `what():` of an uncaught exception
    ("terminate called after throwing an instance of 'T'" / "  what():  …"), as "T: …"."""
    lines = tail.splitlines()
    for i in reversed(range(len(lines))):
        if lines[i].lstrip().startswith("what():"):
            thrown = re.search(r"an instance of '(.*)'", lines[i - 1]) if i else None
            return (f"{thrown[1]}: " if thrown else "") + lines[i].split("what():", 1)[1].strip()
    return None


def fault_frame(dump: str) -> str | None:
    """The innermost frame of the crashing thread in a faulthandler dump: "func (file:line)"."""
    lines = dump.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(("Current thread", "Thread"))]
    current = [i for i in starts if lines[i].startswith("Current thread")] or starts
    if not current or current[0] + 1 >= len(lines):
        return None
    found = re.match(r'\s*File "(.*)", line (\d+) in (.*)', lines[current[0] + 1])
    return f"{found[3]} ({found[1]}:{found[2]})" if found else None


@contextlib.contextmanager
def quiet_elastic():
    """torch's elastic launch logs every worker failure at length (a traceback per rank, the
    peers it terminates): the launcher says it in one line instead."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
