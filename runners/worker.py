"""One worker process: every variant on this rank, one after the other.

Per variant: build and wrap (timed), memory after wrap, warm-up steps (the first records loss
and grad norm), timed unprofiled steps (with checkpoint saves when asked), peak memory, then
`profile_steps` steps recorded with torch.profiler, each timed and with the runtime's own
counts of it.

Each variant gets a process group of its own, made from the launcher's store under the
variant's prefix and destroyed after it, with a timeout (`collective_timeout_s`). The ranks
agree on a variant's outcome through that store, not through a collective: a rank that
raises or runs out of memory reports so at once, its peers' pending collectives end at the
timeout and they report too, and every rank goes on with the next variant on a fresh group.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import Checkpointer
from .counters import RuntimeCounts
from .inputs import batch, parse_inputs
from .model import Transformer, model_config
from .parallelize import VARIANTS, after_optimizer_step, parallelize, precision_path, why_skipped

TRACE_NAME = "rank{rank}.pt.trace.json.gz"
# Test hooks: "<rank>:<variant>" makes that rank raise in the variant's timed steps;
# "<variant>@<preset>:<batch>" makes the variant run out of memory at that preset from that batch on.
FAILURE_HOOK, OOM_HOOK = "TRACEKIT_FAIL", "TRACEKIT_OOM"


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


def profiler(device: torch.device, cfg: dict, path: Path):
    """torch.profiler recording `profile_steps` steps after one warm-up step (ProfilerStep#1..K)
    into `path`. Mode `full`: shapes (and stacks with --with-stack); `light`: neither."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    kwargs = {}
    config_type = getattr(torch._C._profiler, "_ExperimentalConfig", None)
    if device.type == "cuda" and config_type and "enable_cuda_sync_events" in (config_type.__init__.__doc__ or ""):
        kwargs["experimental_config"] = config_type(enable_cuda_sync_events=True)
    full = cfg["profile_mode"] == "full"
    return profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=cfg["profile_steps"], repeat=1),
                   on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
                   record_shapes=full, with_stack=full and cfg["with_stack"], **kwargs)


def compiled_frames() -> int:
    """Frames torch.compile has compiled so far in this process (its own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def run_variant(variant: str, cfg: dict, rank: int, device: torch.device, out: Path) -> dict:
    """Measure and record one variant on this rank; returns its measurements."""
    mixed = cfg["precision"] == "bf16"
    wrap = VARIANTS[variant]["wrap"]
    model_cfg = model_config(cfg["preset"], **cfg["overrides"])
    inputs = parse_inputs(cfg["inputs"], model_cfg.seq)
    release_memory(device)  # what earlier variants left must not count in this one's figures
    oom = os.environ.get(OOM_HOOK, "")
    if oom.startswith(f"{variant}@{cfg['preset']}:") and model_cfg.batch >= int(oom.rsplit(":", 1)[1]):
        raise torch.OutOfMemoryError(f"injected out of memory ({OOM_HOOK}) at batch {model_cfg.batch}")
    torch.manual_seed(cfg["seed"])
    t0 = time.perf_counter()
    model = Transformer(model_cfg).to(device)
    total_numel = sum(p.numel() for p in model.parameters())
    parallel = parallelize(model, variant, device, mixed)
    model = parallel.model
    synchronize(device)
    build_s = time.perf_counter() - t0
    mem_after_wrap = memory(device, "memory_allocated")
    optimizer = parallel.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    native_ddp = wrap == "ddp" and not VARIANTS[variant].get("lightning")  # Lightning autocasts itself
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if mixed and native_ddp
                else contextlib.nullcontext())
    seq_lens, step_index = [], 0
    fail_here = os.environ.get(FAILURE_HOOK) == f"{rank}:{variant}"

    def step(record_grad_norm: bool = False):
        nonlocal step_index
        tokens, targets, length = batch(model_cfg, inputs, cfg["seed"], rank, step_index, device)
        seq_lens.append(length)
        step_index += 1
        with autocast:
            logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        parallel.backward(loss)
        norm = grad_norm(model, wrap) if record_grad_norm else None
        optimizer.step()
        after_optimizer_step(model, variant)
        optimizer.zero_grad(set_to_none=True)
        return loss, norm

    def timed(work) -> float:
        synchronize(device)
        t = time.perf_counter()
        work()
        synchronize(device)
        return (time.perf_counter() - t) * 1000

    loss, norm = step(record_grad_norm=True)
    first = {"loss": loss.detach().item(), "grad_norm": norm}
    first_compiled = compiled_frames()  # compiling for the first step is compiling, not recompiling
    warmup_ms, warmup_recompiled = [], []
    for _ in range(cfg["warmup"] - 1):
        frames = compiled_frames()
        warmup_ms.append(timed(step))
        warmup_recompiled.append(compiled_frames() > frames)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    checkpoint = Checkpointer(cfg["checkpoint"], cfg["checkpoint_every"], out / variant / "ckpt") \
        if cfg["checkpoint"] else None
    times, saved, recompiled = [], [], []
    for i in range(cfg["steps"]):
        if fail_here:
            raise RuntimeError(f"injected failure on rank {rank} ({FAILURE_HOOK})")
        frames = compiled_frames()
        save = checkpoint is not None and checkpoint.due(i)

        def work():
            step()
            if save:
                checkpoint.save(model, optimizer, i)
        times.append(timed(work))
        saved.append(save)
        recompiled.append(compiled_frames() > frames)
    timed_lens = seq_lens[cfg["warmup"]:]
    peak_allocated, peak_reserved = memory(device, "max_memory_allocated"), memory(device, "max_memory_reserved")
    result = {
        "rank": rank, "build_s": round(build_s, 3), "memory_after_wrap_bytes": mem_after_wrap,
        "step_ms": {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times},
        "peak_allocated_bytes": peak_allocated, "peak_reserved_bytes": peak_reserved,
        "local_param_fraction": local_numel(model) / total_numel,
        "model_state_bytes": model_state_bytes(local_numel(model)),
        "precision_path": precision_path(variant, mixed),
        "first_step": first, "seq_lens": timed_lens,
        "batch_per_rank": model_cfg.batch,
        "recompiles": compiled_frames() - first_compiled,
        "recompiled_steps": [i for i, r in enumerate(recompiled) if r],
        "warmup_step_ms": warmup_ms, "recompiled_warmup_steps": [i for i, r in enumerate(warmup_recompiled) if r],
    }
    if checkpoint:
        checkpoint.finish()
        dist.barrier()
        result["checkpoint"] = {**checkpoint.record(),
                                "step_ms_with_save": [t for t, s in zip(times, saved) if s],
                                "step_ms_without_save": [t for t, s in zip(times, saved) if not s]}
        if not cfg["keep_checkpoints"]:
            dist.barrier()
            if rank == 0:
                checkpoint.remove()
    if cfg["profile_steps"]:
        result.update(profiled(step, timed, cfg, rank, device, out / variant / TRACE_NAME.format(rank=rank)))
        result["trace"] = str((out / variant / TRACE_NAME.format(rank=rank)).relative_to(out))
    return result


def model_state_bytes(local_params: int) -> dict:
    """Estimate of the model state this rank holds (bytes): fp32 parameters and gradients and
    AdamW's two fp32 moments, 16 bytes per parameter element held."""
    return {"params": 4 * local_params, "grads": 4 * local_params, "optimizer": 8 * local_params,
            "total": 16 * local_params}


def profiled(step, timed, cfg: dict, rank: int, device: torch.device, path: Path) -> dict:
    """The profiled steps: their wall times and the runtime's counts of each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.json.gz")
    times, counts = [], []
    with profiler(device, cfg, tmp) as prof:
        timed(step)  # the profiler's warm-up step
        prof.step()
        for _ in range(cfg["profile_steps"]):
            with RuntimeCounts() as runtime:
                times.append(timed(step))
            counts.append(dict(runtime.counts))
            prof.step()
    os.replace(tmp, path)
    return {"profiled_step_ms": times, "runtime_counts_per_step": counts, "runtime_counts": counts[-1]}


def init_group(store, prefix: str, backend: str, rank: int, world: int, device: torch.device, timeout_s: float):
    dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)


def agreed(store, key: str, rank: int, world: int, result: dict, timeout_s: float) -> list[dict]:
    """Every rank's result for `key`, exchanged through the store (works when collectives do not)."""
    store.set(f"{key}/{rank}", json.dumps(result))
    keys = [f"{key}/{r}" for r in range(world)]
    store.wait(keys, datetime.timedelta(seconds=timeout_s))
    return [json.loads(store.get(k)) for k in keys]


def worker_main(cfg: dict) -> dict:
    """Entry point of one rank (spawned by `tracekit profile`, or under torchrun/srun)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cfg["device"] == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        if cfg["memory_fraction"]:
            torch.cuda.set_per_process_memory_fraction(cfg["memory_fraction"], device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
        backend = "gloo"
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")  # a timed-out collective raises, not kills
    store, _, _ = next(dist.rendezvous("env://", rank, world))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    out, timeout = Path(cfg["out"]), cfg["collective_timeout_s"]
    results = {}
    for i, variant in enumerate(cfg["variants"], 1):
        where = f"[{i}/{len(cfg['variants'])}] {variant}"
        reason = why_skipped(variant, device)
        if reason:
            log(rank, f"{where}: skipped ({reason})")
            results[variant] = {"status": "skipped", "message": reason}
            continue
        log(rank, f"{where}: building, {cfg['warmup']} warm-up + {cfg['steps']} timed steps, then "
                  f"{cfg['profile_steps']} profiled step(s)")
        init_group(store, f"tracekit/{run_id}/{variant}", backend, rank, world, device, timeout)
        try:
            mine = {"status": "ok", "message": "", "ranks": [run_variant(variant, cfg, rank, device, out)]}
        except torch.OutOfMemoryError as e:
            mine = {"status": "oom", "message": str(e).splitlines()[0], "at": time.time()}
        except Exception as e:  # recorded; the other variants still run
            mine = {"status": "error", "message": f"{type(e).__name__}: {e}".splitlines()[0],
                    "traceback": traceback.format_exc(), "at": time.time()}
        entry = merge_ranks(agreed(store, f"tracekit/{run_id}/status/{variant}", rank, world, mine, 2 * timeout))
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        results[variant] = entry
        detail = f"median {statistics.median([r['step_ms']['median'] for r in entry['ranks']]):.1f} ms" \
            if entry["status"] == "ok" else entry["message"]
        log(rank, f"{where}: {entry['status']} ({detail})")
    return results


def merge_ranks(per_rank: list[dict]) -> dict:
    """One variant's entry from every rank's: ok only if every rank is; else the status and
    message of the rank that failed first (its peers' failures — collectives timing out while
    waiting for it — follow from it), naming the rank, and every failing rank's message."""
    bad = sorted(((e["at"], r, e) for r, e in enumerate(per_rank) if e["status"] != "ok"), key=lambda x: x[:2])
    if bad:
        _, rank, entry = bad[0]
        return {**entry, "message": f"rank {rank}: {entry['message']}", "failed_ranks": sorted(r for _, r, _ in bad),
                "messages": {str(r): e["message"] for _, r, e in bad}}
    return {"status": "ok", "message": "", "ranks": [e["ranks"][0] for e in per_rank]}
