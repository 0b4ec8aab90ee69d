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

from .variants import mirrored

MANIFEST = "manifest.json"
INTERLEAVED = "interleaved"  # the plan's one run of every variant side by side (`runners/interleave.py`)


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
    """The manifest of a run that has finished `done` of its `planned` runs (a variant once
    per repeat; in the interleaved design first every variant at once): `config`, `model`
    (what `--model` built), `versions`, `progress` {done, of}, `comparison` (how the variants
    were compared: `comparison`), `variants` (with `step_ms`, the step time over every repeat
    (docs/metrics.md, "Step time"), and `tokens_per_s` for those that are ok)."""
    variants = {k: v for k, v in results.items() if k != INTERLEAVED}
    for entry in variants.values():
        if entry.get("status") == "ok":
            ran = [record["ranks"] for record in entry.get("repeats", []) if record["status"] == "ok"]
            entry["step_ms"] = round(step_time(ran or [entry["ranks"]]), 3)
            entry["tokens_per_s"] = tokens_per_s(entry["ranks"])
    return {"config": {k: v for k, v in cfg.items() if k != "model_info"},
            "model": cfg["model_info"], "versions": versions(), "progress": {"done": done, "of": planned},
            "comparison": comparison(cfg, results), "variants": variants}


def comparison(cfg: dict, results: dict) -> dict:
    """How the variants were compared (docs/profile.md, "Comparing variants"): `design`
    `interleaved` (side by side in one process, in `rounds` rounds of blocks of `block_steps`
    steps, `order`: each round's blocks) or `sequential` (each variant in turn, `--repeats`
    times), `note` saying why sequential where interleaved was the default, `control` the A/A
    control's variant or None."""
    side_by_side = results.get(INTERLEAVED)
    interleaved = cfg.get("compare") == "interleaved" and (side_by_side is None or side_by_side["status"] == "ok")
    note = cfg.get("compare_note") or ""
    if cfg.get("compare") == "interleaved" and side_by_side is not None and side_by_side["status"] != "ok":
        note = (f"the interleaved run failed ({side_by_side['status']}: {side_by_side['message']}); "
                "the variants ran one after another")
    names = [v for v in results if v != INTERLEAVED and results[v].get("status") == "ok"]
    control = next((v for v in results if results[v].get("control_of")), None)
    document = {"design": "interleaved" if interleaved else "sequential", "note": note, "control": control}
    if interleaved:
        document.update(block_steps=cfg["block_steps"], rounds=cfg["rounds"],
                        order=[mirrored(names, r) for r in range(cfg["rounds"])])
    return document


def write_manifest(cfg: dict, results: dict, done: int, planned: int) -> dict:
    document = manifest(cfg, results, done, planned)
    write_json_atomically(Path(cfg["out"]) / MANIFEST, document)
    return document
