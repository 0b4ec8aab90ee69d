"""`tracekit profile`: start the workers (or be one), then write OUT/manifest.json.

Under torchrun or srun (RANK and WORLD_SIZE set) this process is one worker. Otherwise it
starts `nproc` workers on this node through torch's elastic launch API.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import uuid
from pathlib import Path

from tracekit.errors import TracekitError

# NVLink multicast off: NCCL NVLS, PyTorch symmetric memory, NVSHMEM (shared machines).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MANIFEST = "manifest.json"


class ProfileError(TracekitError):
    """A profile run that cannot start (bad options, OUT exists)."""


def make_config(options: dict) -> dict:
    """The run's configuration from the command's options, every one checked before any
    worker starts (a bad one raises ProfileError: one line). `global_batch` sets the batch per
    rank (strong scaling) and must divide by the world size."""
    import torch

    from .checkpoint import MODES
    from .inputs import parse_inputs
    from .model import model_config
    from .parallelize import check_variants

    o = dict(options)
    device = o["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProfileError("no CUDA device here; use --device cpu")
    world = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else \
        o["nproc"] or (torch.cuda.device_count() if device == "cuda" else 2)
    if o["global_batch"] is not None:
        if o["overrides"].get("batch") is not None:
            raise ProfileError("--batch (per rank) and --global-batch (in total) exclude each other")
        if o["global_batch"] < 1 or o["global_batch"] % world:
            raise ProfileError(f"--global-batch {o['global_batch']} does not divide by the world size {world}")
        o["overrides"] = {**o["overrides"], "batch": o["global_batch"] // world}
    try:
        check_variants(o["variants"])
        config = model_config(o["preset"], **o["overrides"])
        parse_inputs(o["inputs"], config.seq)
    except ValueError as e:
        raise ProfileError(str(e)) from None
    rules = [(o["warmup"] >= 1 and o["steps"] >= 1, "--warmup and --steps must be at least 1"),
             (o["profile_steps"] >= 0, "--profile-steps must be 0 or more"),
             (o["repeats"] >= 1, "--repeats must be at least 1"),
             (o["checkpoint"] in (None, *MODES), f"--checkpoint: {' or '.join(MODES)}"),
             (o["checkpoint_every"] >= 1, "--checkpoint-every must be at least 1"),
             (o["memory_fraction"] is None or 0 < o["memory_fraction"] <= 1, "--memory-fraction lies in (0, 1]"),
             (o["memory_fraction"] is None or device == "cuda", "--memory-fraction needs --device cuda")]
    for ok, message in rules:
        if not ok:
            raise ProfileError(message)
    return {**o, "device": device, "nproc": world, "global_batch": config.batch * world,
            "precision": o["precision"] or ("bf16" if device == "cuda" else "fp32")}


def prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise ProfileError(f"{out} exists; pass --overwrite to write into it")
    out.mkdir(parents=True, exist_ok=True)


def versions() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda and hasattr(torch.cuda, "nccl") else None
    try:
        import torchao
        torchao_version = torchao.__version__
    except ImportError:
        torchao_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": nccl, "torchao": torchao_version,
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "host": platform.node()}


def write_json_atomically(path: Path, document: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokens_per_s(ranks: list[dict]) -> float:
    """Real tokens (targets the loss counts: no padding) trained per second, all ranks
    together, over the timed steps that did not save a checkpoint: Σ over ranks of the mean
    real tokens per such step ÷ the slowest rank's median such step."""
    tokens, slowest = 0.0, 0.0
    for r in ranks:
        kept = [i for i in range(len(r["step_ms"]["all"])) if i not in set(r.get("saved_steps", []))]
        tokens += statistics.mean(r["real_tokens"][i] for i in kept)
        slowest = max(slowest, statistics.median(r["step_ms"]["all"][i] for i in kept))
    return round(tokens / (slowest / 1000), 1)


def profile(cfg: dict) -> dict | None:
    """Run every variant; returns the manifest (None on ranks other than 0 under torchrun)."""
    from .worker import worker_main

    out = Path(cfg["out"])
    os.environ.update(MULTICAST_OFF)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        results = worker_main(cfg)
        if int(os.environ["RANK"]) != 0:
            return None
    else:
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=cfg["nproc"], run_id=uuid.uuid4().hex[:8],
                              rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                              monitor_interval=0.5)
        results = elastic_launch(launch, worker_main)(cfg)[0]
    manifest = {"config": cfg, "versions": versions(), "variants": results}
    for entry in results.values():
        if entry.get("status") == "ok":
            entry["tokens_per_s"] = tokens_per_s(entry["ranks"])
    write_json_atomically(out / MANIFEST, manifest)
    return manifest
