"""The run's plan on one rank (`worker_main`): which runs come in which order, and what each
agreed outcome puts into the run's results; rank 0 writes the manifest after each run.

In the interleaved design (`--compare`, `runners/interleave.py`) the plan's first run measures
every variant side by side; the variants one by one follow, run only if it failed (the
sequential fallback). In the sequential design each variant runs in turn, `--repeats` times in
alternated order. Each run is measured on a process group of its own and its outcome agreed by
every rank (`worker.run_agreed`); where a worker keeps its place (`worker.Place`), a hard death
is charged to the run it was in (`launch.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from tracekit.core.timing import step_time

from . import worker
from .interleave import run_interleaved
from .manifest import INTERLEAVED, write_manifest
from .parallelize import why_skipped
from .variants import CONTROL, base_variant
from .worker import STUCK_EXIT, TEARDOWN_S, Place, end_group, log, rendezvous_store, run_agreed


def compared(cfg: dict) -> list[str]:
    """The variants the run compares: `--variants`, then with `--control` the A/A control, a
    second copy of the first (the baseline)."""
    return list(cfg["variants"]) + ([CONTROL.format(cfg["variants"][0])] if cfg.get("control") else [])


def runs(cfg: dict) -> list[tuple[int, int, str]]:
    """The run's plan: (repeat, position, variant) in the order they run. In the interleaved
    design (`compare`) one run of every variant at once (`INTERLEAVED`) comes first; the
    variants one by one follow, run only if it failed (the sequential fallback)."""
    sequential = [(repeat, position, variant)
                  for repeat, order in enumerate(repeat_orders(compared(cfg), cfg["repeats"]))
                  for position, variant in enumerate(order)]
    return ([(0, 0, INTERLEAVED)] if cfg.get("compare") == "interleaved" else []) + sequential


def record_outcome(results: dict, cfg: dict, repeat: int, position: int, variant: str, entry: dict) -> None:
    """Put one run's agreed `entry` into `results` (the last repeat's entry is the variant's).
    The interleaved run's entry, when ok, holds per rank every variant's measurements: each
    variant gets its own entry; `results[INTERLEAVED]` keeps its status."""
    if variant == INTERLEAVED:
        results[INTERLEAVED] = {k: v for k, v in entry.items() if k != "ranks"}
        for name in (entry["ranks"][0] if entry["status"] == "ok" else {}):
            results[name] = with_control({"status": "ok", "message": "", "ranks": [r[name] for r in entry["ranks"]]},
                                         name)
        return
    repeats = results.get(variant, {}).get("repeats", []) + [repeat_record(repeat, position, entry)]
    results[variant] = with_control({**entry, "repeats": repeats} if repeat == cfg["repeats"] - 1
                                    else {"repeats": repeats}, variant)


def with_control(entry: dict, variant: str) -> dict:
    """`entry`, naming the variant an A/A control copies (`control_of`) where it is one."""
    return {**entry, "control_of": base_variant(variant)} if base_variant(variant) != variant else entry


def interleaved_done(results: dict) -> bool:
    """Whether the interleaved run measured every variant (the sequential runs then do not run)."""
    return results.get(INTERLEAVED, {}).get("status") == "ok"


def worker_main(cfg: dict, start: int = 0, results: dict | None = None, state: str | None = None) -> dict:
    """Entry point of one rank (spawned by `tracekit profile`, or under torchrun/srun): the
    plan's runs from `start` on, added to `results` (what earlier workers of this run
    measured); rank 0 writes the manifest after each. `state`: the launcher's folder where
    this rank keeps its place in the plan and its fault dump (module docstring)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    place = Place(Path(state), rank) if state else None
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
    store = rendezvous_store(rank, world)
    out, prefix = Path(cfg["out"]), f"tracekit/{cfg['run_id']}"
    teardown_s = min(TEARDOWN_S, cfg["collective_timeout_s"])
    results = dict(results or {})
    plan = runs(cfg)
    for index in range(start, len(plan)):
        repeat, position, variant = plan[index]
        if variant != INTERLEAVED and interleaved_done(results):
            continue  # measured side by side: no fallback needed
        if variant == INTERLEAVED:
            run_side_by_side(cfg, rank, world, device, out, store, f"{prefix}/{INTERLEAVED}", backend, teardown_s,
                             results, place, index)
            if rank == 0:
                write_manifest(cfg, results, index + 1, len(plan))
            continue
        last = repeat == cfg["repeats"] - 1  # the repeat that records traces
        where = f"[{position + 1}/{len(compared(cfg))}] {variant}" + (
            f" (repeat {repeat + 1}/{cfg['repeats']})" if cfg["repeats"] > 1 else "")
        reason = why_skipped(variant, device)
        if reason:
            log(rank, f"{where}: skipped ({reason})")
            results[variant] = {"status": "skipped", "message": reason}
            if place:
                place.done(index + 1, results)
        else:
            log(rank, f"{where}: building, {cfg['warmup']} warm-up + {cfg['steps']} timed steps"
                      + (f", then {cfg['profile_steps']} recorded step(s)" if last else ""))
            if place:
                place.doing(index)
            entry = run_agreed(lambda built, say: worker.run_variant(variant, cfg, rank, device, out, last, say, built),
                               cfg, rank, world, device, store, f"{prefix}/{repeat}/{variant}", backend,
                               lambda line: log(rank, f"{where}: {line}"))
            record_outcome(results, cfg, repeat, position, variant, entry)
            if place:
                place.done(index + 1, results)  # before the teardown: what a death from here on cannot undo
            ended = end_group(entry["status"] != "ok", teardown_s)
            detail = f"step time {step_time([entry['ranks']]):.1f} ms" \
                if entry["status"] == "ok" else entry["message"]
            log(rank, f"{where}: {entry['status']} ({detail})")
            if not ended:
                stuck(cfg, rank, variant, teardown_s, results, index + 1, len(plan), place)
        if rank == 0:
            write_manifest(cfg, results, index + 1, len(plan))
    return results


def run_side_by_side(cfg: dict, rank: int, world: int, device: torch.device, out: Path, store, prefix: str,
                     backend: str, teardown_s: float, results: dict, place, index: int) -> None:
    """The interleaved run (`runners/interleave.py`) of every variant that can run here, its
    outcome put into `results`; a variant that cannot run on this device is skipped. If it
    fails (out of memory with every variant built, an error), the plan's sequential runs follow."""
    names = []
    for variant in compared(cfg):
        reason = why_skipped(variant, device)
        if reason:
            log(rank, f"{variant}: skipped ({reason})")
            results[variant] = {"status": "skipped", "message": reason}
        else:
            names.append(variant)
    where = f"{', '.join(names)} side by side"
    log(rank, f"{where}: building, {cfg['warmup']} warm-up steps each, {cfg['rounds']} rounds of blocks of "
              f"{cfg['block_steps']} steps, then {cfg['profile_steps']} recorded step(s) a round")
    if place:
        place.doing(index)
    entry = run_agreed(lambda built, say: run_interleaved(names, cfg, rank, device, out, True, say, built),
                       cfg, rank, world, device, store, prefix, backend, lambda line: log(rank, f"{where}: {line}"))
    record_outcome(results, cfg, 0, 0, INTERLEAVED, entry)
    if place:
        place.done(index + 1, results)
    ended = end_group(entry["status"] != "ok", teardown_s)
    if entry["status"] == "ok":
        for variant in names:
            log(rank, f"{variant}: ok (step time {step_time([results[variant]['ranks']]):.1f} ms)")
    else:
        log(rank, f"{where}: {entry['status']} ({entry['message']}); the variants run one after another instead")
    if not ended:
        stuck(cfg, rank, INTERLEAVED, teardown_s, results, index + 1, len(runs(cfg)), place)


def stuck(cfg: dict, rank: int, variant: str, teardown_s: float, results: dict, done: int, planned: int, place) -> None:
    """A run whose process group did not end within `teardown_s`: under the launcher this
    worker ends (`STUCK_EXIT`) and fresh workers go on from the next run; otherwise the group is
    left behind."""
    if place:
        if rank == 0:
            write_manifest(cfg, results, done, planned)
        print(f"tracekit profile: rank {rank}: {variant}'s process group did not end within "
              f"{teardown_s:g} s", file=sys.stderr, flush=True)
        os._exit(STUCK_EXIT)
    log(rank, f"{variant}: its process group did not end within {teardown_s:g} s; left behind")


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
