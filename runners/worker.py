"""One worker process: every variant on this rank, one after the other.

Per variant: build and wrap (timed), memory after wrap, warm-up steps, timed unprofiled
steps, peak memory, local parameter fraction, loss and grad norm of the first step, then
exactly one step recorded with torch.profiler, with the runtime's own counts of it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .counters import RuntimeCounts
from .model import Transformer, model_config, synthetic_batch
from .parallelize import after_optimizer_step, parallelize, why_skipped

TRACE_NAME = "rank{rank}.pt.trace.json.gz"


def log(rank: int, message: str) -> None:
    if rank == 0:
        print(f"tracekit profile: {message}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    """Collect the previous variant's modules (they sit in reference cycles through hooks, so
    only the cycle collector frees them) and return cached blocks to the device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def memory(device: torch.device, kind: str) -> int | None:
    if device.type != "cuda":
        return None
    return getattr(torch.cuda, kind)(device)


def local_numel(model) -> int:
    """Elements of the parameters this rank holds (DTensor shards, FSDP1 shard views)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())


def grad_norm(model, wrap: str) -> float:
    if wrap == "fsdp1":
        return float(model.clip_grad_norm_(float("inf")))
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def profiler(device: torch.device, with_stack: bool, path: Path):
    """torch.profiler recording the second of two steps (ProfilerStep#1) into `path`."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    kwargs = {}
    config_type = getattr(torch._C._profiler, "_ExperimentalConfig", None)
    if device.type == "cuda" and config_type and "enable_cuda_sync_events" in (config_type.__init__.__doc__ or ""):
        kwargs["experimental_config"] = config_type(enable_cuda_sync_events=True)
    return profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                   on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
                   record_shapes=True, with_stack=with_stack, **kwargs)


def run_variant(variant: str, cfg: dict, rank: int, device: torch.device, out: Path) -> dict:
    """Measure and record one variant on this rank; returns its measurements."""
    from .parallelize import VARIANTS

    mixed = cfg["precision"] == "bf16"
    wrap = VARIANTS[variant]["wrap"]
    model_cfg = model_config(cfg["preset"], **cfg["overrides"])
    release_memory(device)  # what earlier variants left must not count in this one's figures
    torch.manual_seed(cfg["seed"])
    t0 = time.perf_counter()
    model = Transformer(model_cfg).to(device)
    total_numel = sum(p.numel() for p in model.parameters())
    model = parallelize(model, variant, device, mixed)
    synchronize(device)
    build_s = time.perf_counter() - t0
    mem_after_wrap = memory(device, "memory_allocated")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens, targets = synthetic_batch(model_cfg, cfg["seed"], rank, device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if mixed and wrap == "ddp"
                else contextlib.nullcontext())

    def step(record_grad_norm: bool = False):
        with autocast:
            logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        norm = grad_norm(model, wrap) if record_grad_norm else None
        optimizer.step()
        after_optimizer_step(model, variant)
        optimizer.zero_grad(set_to_none=True)
        return loss, norm

    loss, norm = step(record_grad_norm=True)
    first = {"loss": loss.detach().item(), "grad_norm": norm}
    for _ in range(cfg["warmup"] - 1):
        step()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(cfg["steps"]):
        synchronize(device)
        t = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - t) * 1000)

    trace_path = out / variant / TRACE_NAME.format(rank=rank)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    counts = RuntimeCounts()
    tmp = trace_path.with_name(f".{trace_path.name}.{os.getpid()}.tmp.json.gz")
    with profiler(device, cfg["with_stack"], tmp) as prof:
        for i in range(2):
            with counts if i == 1 else contextlib.nullcontext():
                step()
                synchronize(device)
            prof.step()
    os.replace(tmp, trace_path)
    return {
        "rank": rank, "build_s": round(build_s, 3), "memory_after_wrap_bytes": mem_after_wrap,
        "step_ms": {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times},
        "peak_allocated_bytes": memory(device, "max_memory_allocated"),
        "peak_reserved_bytes": memory(device, "max_memory_reserved"),
        "local_param_fraction": local_numel(model) / total_numel,
        "first_step": first,
        "runtime_counts": dict(counts.counts),
        "trace": str(trace_path.relative_to(out)),
    }


def worker_main(cfg: dict) -> dict:
    """Entry point of one rank (spawned by `tracekit profile`, or under torchrun/srun)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cfg["device"] == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
        backend = "gloo"
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    out = Path(cfg["out"])
    results = {}
    try:
        for i, variant in enumerate(cfg["variants"], 1):
            reason = why_skipped(variant, device)
            if reason:
                log(rank, f"[{i}/{len(cfg['variants'])}] {variant}: skipped ({reason})")
                results[variant] = {"status": "skipped", "message": reason}
                continue
            log(rank, f"[{i}/{len(cfg['variants'])}] {variant}: building, {cfg['warmup']} warm-up + "
                      f"{cfg['steps']} timed steps, then 1 profiled step")
            try:
                results[variant] = {"status": "ok", "message": "", "ranks": [run_variant(variant, cfg, rank, device, out)]}
            except torch.OutOfMemoryError as e:
                results[variant] = {"status": "oom", "message": str(e).splitlines()[0]}
            except Exception as e:  # recorded; the other variants still run
                results[variant] = {"status": "error", "message": f"{type(e).__name__}: {e}".splitlines()[0],
                                    "traceback": traceback.format_exc()}
            gathered = [None] * world
            dist.all_gather_object(gathered, results[variant])
            results[variant] = merge_ranks(gathered)
            entry = results[variant]
            detail = f"median {statistics.median([r['step_ms']['median'] for r in entry['ranks']]):.1f} ms" \
                if entry["status"] == "ok" else entry["message"]
            log(rank, f"[{i}/{len(cfg['variants'])}] {variant}: {entry['status']} ({detail})")
    finally:
        dist.destroy_process_group()
    return results


def merge_ranks(per_rank: list[dict]) -> dict:
    """One variant's entry from every rank's: ok only if every rank is ok."""
    bad = [r for r in per_rank if r["status"] != "ok"]
    if bad:
        return dict(bad[0])
    return {"status": "ok", "message": "", "ranks": [r["ranks"][0] for r in per_rank]}
