"""`tracekit profile`: start the workers (or be one), then write OUT/manifest.json.

Under torchrun or srun (RANK and WORLD_SIZE set) this process is one worker. Otherwise it
starts `nproc` workers on this node through torch's elastic launch API.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import uuid
from pathlib import Path

from tracekit.errors import TracekitError

# NVLink multicast off: NCCL NVLS, PyTorch symmetric memory, NVSHMEM (shared machines).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MANIFEST = "manifest.json"


class ProfileError(TracekitError):
    """A profile run that cannot start (bad options, OUT exists)."""


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
    write_json_atomically(out / MANIFEST, manifest)
    return manifest
