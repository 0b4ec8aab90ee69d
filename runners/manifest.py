"""OUT/manifest.json: written (atomically) after every variant, so a run that dies keeps what
finished; `progress` says how far it got."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from importlib import metadata
from pathlib import Path

from tracekit.core.timing import step_time

MANIFEST = "manifest.json"


def source_revision(folder: Path) -> str | None:
    """The git commit of the checkout holding `folder`, with "-dirty" when tracked files differ
    from it; None outside a git checkout (an installed wheel) or without git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def versions() -> dict:
    """What ran the run: python, torch, cuda, nccl, torchao, the GPU, the host, and tracekit's
    version and source revision (`source_revision` of the runners' folder)."""
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
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "host": platform.node(),
            "tracekit": metadata.version("torch-tracekit"), "tracekit_revision": source_revision(Path(__file__).parent)}


def write_json_atomically(path: Path, document: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, path)


def tokens_per_s(ranks: list[dict]) -> float | None:
    """Real tokens (targets the loss counts: no padding) trained per second, all ranks
    together, over the timed steps that did not save a checkpoint: Σ over ranks of the mean
    real tokens per such step ÷ the step time (`tracekit.core.timing`). None when the model's
    batches do not say how many real tokens they hold."""
    tokens = 0.0
    for r in ranks:
        kept = [i for i in range(len(r["step_ms"]["all"])) if i not in set(r.get("saved_steps", []))]
        if any(r["real_tokens"][i] is None for i in kept):
            return None
        tokens += statistics.mean(r["real_tokens"][i] for i in kept)
    return round(tokens / (step_time([ranks]) / 1000), 1)


def manifest(cfg: dict, results: dict, done: int, planned: int) -> dict:
    """The manifest of a run that has finished `done` of its `planned` variant runs (a
    variant once per repeat): `config`, `model` (what `--model` built), `versions`,
    `progress` {done, of}, `variants` (with `step_ms`, the step time over every repeat
    (docs/metrics.md, "Step time"), and `tokens_per_s` for those that are ok)."""
    for entry in results.values():
        if entry.get("status") == "ok":
            ran = [record["ranks"] for record in entry.get("repeats", []) if record["status"] == "ok"]
            entry["step_ms"] = round(step_time(ran or [entry["ranks"]]), 3)
            entry["tokens_per_s"] = tokens_per_s(entry["ranks"])
    return {"config": {k: v for k, v in cfg.items() if k != "model_info"},
            "model": cfg["model_info"], "versions": versions(), "progress": {"done": done, "of": planned},
            "variants": results}


def write_manifest(cfg: dict, results: dict, done: int, planned: int) -> dict:
    document = manifest(cfg, results, done, planned)
    write_json_atomically(Path(cfg["out"]) / MANIFEST, document)
    return document
