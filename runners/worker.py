"""One worker process: every variant on this rank, one after the other, `repeats` times.

Per variant: build and wrap (timed), memory after wrap, warm-up steps (the first records loss
and grad norm), timed unprofiled steps (with checkpoint saves when asked), peak memory, then
(in the last repeat) `profile_steps` steps recorded with torch.profiler with the runtime's
own counts of each. Every step carries phase timers (`clock.py`); the steps of each loop run
back to back, drained only before the first and after the last.

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
from .clock import PHASES, PhaseClock, columns
from .model import Transformer, model_config
from .parallelize import VARIANTS, after_optimizer_step, parallelize, precision_path, why_skipped
from .recording import profiler

TRACE_NAME = "rank{rank}.pt.trace.json.gz"
NAMES_TRACE_NAME = "names/rank{rank}.pt.trace.json.gz"  # the `full` step that names a `lean` recording
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


def compiled_frames() -> int:
    """Frames torch.compile has compiled so far in this process (its own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def run_variant(variant: str, cfg: dict, rank: int, device: torch.device, out: Path, record: bool) -> dict:
    """Measure one variant on this rank (and record it when `record`); returns its measurements."""
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
    seq_lens, real_tokens, step_index = [], [], 0
    fail_here = os.environ.get(FAILURE_HOOK) == f"{rank}:{variant}"

    def step(clock: PhaseClock, record_grad_norm: bool = False):
        """One training step, its phases marked on `clock`."""
        nonlocal step_index
        clock.start()
        with clock.phase("forward"):
            tokens, targets, length, real = batch(model_cfg, inputs, cfg["seed"], rank, step_index, device)
            seq_lens.append(length)
            real_tokens.append(real)
            step_index += 1
            with autocast:
                logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        with clock.phase("backward"):
            parallel.backward(loss)
        norm = grad_norm(model, wrap) if record_grad_norm else None
        with clock.phase("optimizer"):
            optimizer.step()
            after_optimizer_step(model, variant)
            optimizer.zero_grad(set_to_none=True)
        return loss, norm

    def run_steps(works) -> tuple[list[float], list[PhaseClock], float]:
        """Run `work(clock)` for each of `works` back to back, as training does: the device is
        drained before the first and after the last, never between. Returns each step's time
        (ms: its span on the device clock, first phase mark to last; the host clock off CUDA),
        the clocks, and the wall time of the whole loop (ms, drained at both ends)."""
        clocks = [PhaseClock(device) for _ in works]
        synchronize(device)
        t = time.perf_counter()
        for work, clock in zip(works, clocks):
            work(clock)
        synchronize(device)
        wall = (time.perf_counter() - t) * 1000
        return [c.ms()["device" if device.type == "cuda" else "host"]["step"] for c in clocks], clocks, wall

    loss, norm = step(PhaseClock(device), record_grad_norm=True)
    first = {"loss": loss.detach().item(), "grad_norm": norm}
    first_compiled = compiled_frames()  # compiling for the first step is compiling, not recompiling
    warmup_recompiled = []

    def warmup_step(clock):
        frames = compiled_frames()
        step(clock)
        warmup_recompiled.append(compiled_frames() > frames)
    warmup_ms, warmup_clocks, _ = run_steps([warmup_step] * (cfg["warmup"] - 1))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    checkpoint = Checkpointer(cfg["checkpoint"], cfg["checkpoint_every"], out / variant / "ckpt") \
        if cfg["checkpoint"] else None
    phases = PHASES if checkpoint else PHASES[:-1]
    saved, recompiled = [], []

    def timed_step(i: int):
        def work(clock):
            if fail_here:
                raise RuntimeError(f"injected failure on rank {rank} ({FAILURE_HOOK})")
            frames = compiled_frames()
            save = checkpoint is not None and checkpoint.due(i)
            step(clock)
            if save:
                with clock.phase("checkpoint"):
                    checkpoint.save(model, optimizer, i)
            saved.append(save)
            recompiled.append(compiled_frames() > frames)
        return work
    times, clocks, wall = run_steps([timed_step(i) for i in range(cfg["steps"])])
    timed_from = len(seq_lens) - cfg["steps"]
    peak_allocated, peak_reserved = memory(device, "max_memory_allocated"), memory(device, "max_memory_reserved")
    result = {
        "rank": rank, "build_s": round(build_s, 3), "memory_after_wrap_bytes": mem_after_wrap,
        "step_ms": {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times},
        "timed_wall_ms": round(wall, 3),
        "phase_ms": columns(clocks, phases), "saved_steps": [i for i, s in enumerate(saved) if s],
        "peak_allocated_bytes": peak_allocated, "peak_reserved_bytes": peak_reserved,
        "local_param_fraction": local_numel(model) / total_numel,
        "model_state_bytes": model_state_bytes(local_numel(model)),
        "precision_path": precision_path(variant, mixed),
        "first_step": first, "seq_lens": seq_lens[timed_from:], "real_tokens": real_tokens[timed_from:],
        "batch_per_rank": model_cfg.batch,
        "recompiles": compiled_frames() - first_compiled,
        "recompiled_steps": [i for i, r in enumerate(recompiled) if r],
        "warmup_step_ms": warmup_ms, "warmup_phase_ms": columns(warmup_clocks, phases[:3]),
        "recompiled_warmup_steps": [i for i, r in enumerate(warmup_recompiled) if r],
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
    if record and cfg["profile_steps"]:
        result.update(recorded_figures(step, cfg, device, out, variant, rank))
        result["profiler_overhead"] = round(statistics.median(result["profiled_step_ms"]) / statistics.median(times), 3)
    return result


def recorded_figures(step, cfg: dict, device: torch.device, out: Path, variant: str, rank: int) -> dict:
    """The recorded steps: `--profile-steps` steps in `--profile-mode` (the trace `diff`
    attributes), then, in `lean` mode, one `full` step into `names/` (names and blame), each
    with its times, phases and runtime counts."""
    modes = [(cfg["profile_mode"], cfg["profile_steps"], TRACE_NAME)]
    if cfg["profile_mode"] == "lean":
        modes.append(("full", 1, NAMES_TRACE_NAME))
    recorded = []
    for mode, steps, name in modes:
        path = out / variant / name.format(rank=rank)
        recorded.append({**record_steps(step, cfg, device, mode, steps, path), "trace": str(path.relative_to(out))})
    main = recorded[0]
    return {"recorded": recorded, "trace": main["trace"], "profile_mode": main["mode"],
            "profiled_step_ms": main["step_ms"], "runtime_counts_per_step": main["runtime_counts_per_step"],
            "runtime_counts": main["runtime_counts_per_step"][-1]}


def model_state_bytes(local_params: int) -> dict:
    """Estimate of the model state this rank holds (bytes): fp32 parameters and gradients and
    AdamW's two fp32 moments, 16 bytes per parameter element held."""
    return {"params": 4 * local_params, "grads": 4 * local_params, "optimizer": 8 * local_params,
            "total": 16 * local_params}


def record_steps(step, cfg: dict, device: torch.device, mode: str, steps: int, path: Path) -> dict:
    """`steps` training steps recorded in `mode` into `path`, after one warm-up step of the
    profiler. The GPU is drained before the first recorded step and after the last, never
    between them (as in training): a recorded step's time (`step_ms`) is its span on the
    device clock (the host clock off CUDA), first phase mark to last."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.json.gz")
    clocks, counts = [], []
    with profiler(device, mode, steps, cfg["with_stack"], lambda prof: prof.export_chrome_trace(str(tmp))) as prof:
        step(PhaseClock(device))  # the profiler's warm-up step
        synchronize(device)
        prof.step()
        for _ in range(steps):
            clock = PhaseClock(device)
            with RuntimeCounts() as runtime:
                step(clock)
            clocks.append(clock)
            counts.append(dict(runtime.counts))
            prof.step()
    synchronize(device)
    os.replace(tmp, path)
    phases = columns(clocks, PHASES[:3])
    return {"mode": mode, "step_ms": phases["device" if device.type == "cuda" else "host"]["step"],
            "phase_ms": phases, "runtime_counts_per_step": counts}


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
    for repeat, order in enumerate(repeat_orders(cfg["variants"], cfg["repeats"])):
        last = repeat == cfg["repeats"] - 1  # the repeat that records traces
        for i, variant in enumerate(order, 1):
            where = f"[{i}/{len(order)}] {variant}" + (f" (repeat {repeat + 1}/{cfg['repeats']})"
                                                       if cfg["repeats"] > 1 else "")
            reason = why_skipped(variant, device)
            if reason:
                log(rank, f"{where}: skipped ({reason})")
                results[variant] = {"status": "skipped", "message": reason}
                continue
            log(rank, f"{where}: building, {cfg['warmup']} warm-up + {cfg['steps']} timed steps"
                      + (f", then {cfg['profile_steps']} recorded step(s)" if last else ""))
            init_group(store, f"tracekit/{run_id}/{repeat}/{variant}", backend, rank, world, device, timeout)
            try:
                mine = {"status": "ok", "message": "",
                        "ranks": [run_variant(variant, cfg, rank, device, out, record=last)]}
            except torch.OutOfMemoryError as e:
                mine = {"status": "oom", "message": str(e).splitlines()[0], "at": time.time()}
            except Exception as e:  # recorded; the other variants still run
                mine = {"status": "error", "message": f"{type(e).__name__}: {e}".splitlines()[0],
                        "traceback": traceback.format_exc(), "at": time.time()}
            entry = merge_ranks(agreed(store, f"tracekit/{run_id}/status/{repeat}/{variant}", rank, world, mine,
                                       2 * timeout))
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            repeats = results.get(variant, {}).get("repeats", []) + [repeat_record(repeat, i - 1, entry)]
            if last:
                results[variant] = {**entry, "repeats": repeats}
            else:
                results[variant] = {"repeats": repeats}
            detail = f"median {statistics.median([r['step_ms']['median'] for r in entry['ranks']]):.1f} ms" \
                if entry["status"] == "ok" else entry["message"]
            log(rank, f"{where}: {entry['status']} ({detail})")
    return results


def repeat_orders(variants: list[str], repeats: int) -> list[list[str]]:
    """The variants' order in each repeat, alternated (A B C, C B A, A B C, …) so that no
    variant always runs first, or right after the same one."""
    return [list(variants) if r % 2 == 0 else list(reversed(variants)) for r in range(repeats)]


def repeat_record(repeat: int, position: int, entry: dict) -> dict:
    """What one repeat of a variant measured: per rank its timed steps and their phases."""
    ranks = [{"rank": r["rank"], "step_ms": r["step_ms"]["all"], "phase_ms": r["phase_ms"],
              "saved_steps": r["saved_steps"]} for r in entry.get("ranks", [])]
    return {"repeat": repeat, "position": position, "status": entry["status"], "message": entry["message"],
            "ranks": ranks}


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
