"""What each capture mode costs a training step, measured in one process (GPU).

One rank, FSDP2 per block (`runners/parallelize.py`) on a preset, bf16, the runner's default
optimizer (fused AdamW). A period is the mean step over `--steps` consecutive steps (drained
before the first and after the last, never between: the steady-state period; Python's cycle
collector off, as in the runner). This machine's step time wanders by tens of percent within
a process, so the periods alternate bare, mode, bare, mode, … and each mode's period is
divided by the mean of the two `bare` periods around it; `--rounds` rounds, the modes' order
alternated:
- `bare`: no phase marks, no profiler; `timers`: the runner's phase clocks (CUDA events and
  host clock at each phase boundary);
- `device`, `lean`, `light`, `full`: the capture modes of `runners/recording.py`, with the
  phase clocks (`device`'s marks are written into its trace after the recording, outside
  the period).
Prints one JSON object: per mode, each round's (bare before, mode, bare after) periods (ms),
each round's ratio and their median.

    torchrun --nproc-per-node 1 benchmarks/capture_cost.py --preset large --batch 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from tracekit.runners.clock import PhaseClock
from tracekit.runners.model import Transformer, model_config
from tracekit.runners.parallelize import parallelize
from tracekit.runners.recording import profiler
from tracekit.runners.worker import without_gc_pauses
from tracekit.runners.workload import fused_adamw

MODES = ("timers", "device", "lean", "light", "full")


class NoClock(PhaseClock):
    """Phase boundaries without marks (the `bare` step)."""

    def _mark(self, phase):
        pass

    @contextlib.contextmanager
    def phase(self, name):
        yield


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="large")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("TEARDOWN_CUPTI", "1")  # as the runner's recorder: no CUPTI left attached in later periods
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    cfg = model_config(args.preset, batch=args.batch)
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    model = parallelize(model, list(model.blocks), "fsdp2", device, True).model
    optimizer = fused_adamw(model.parameters())
    tokens = torch.randint(1, cfg.vocab, (cfg.batch, cfg.seq), device=device)

    def step(clock):
        clock.start()
        with clock.phase("forward"):
            loss = torch.nn.functional.cross_entropy(model(tokens).float().flatten(0, 1), tokens.flatten())
        with clock.phase("backward"):
            loss.backward()
        with clock.phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def period(mode: str) -> float:
        clock = NoClock if mode == "bare" else PhaseClock
        if mode in ("bare", "timers"):
            prof = contextlib.nullcontext()
        else:
            prof = profiler(device, mode, args.steps, False, lambda p: None)
        with without_gc_pauses(), prof as p:
            step(clock(device))  # the profiler's warm-up step
            torch.cuda.synchronize()
            if p is not None:
                p.step()
            t = time.perf_counter()
            for _ in range(args.steps):
                step(clock(device))
                if p is not None and _ < args.steps - 1:
                    p.step()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1000 / args.steps
            if p is not None:
                p.step()
        return ms

    for _ in range(3):
        period("bare")
    rounds = {m: [] for m in MODES}
    previous = period("bare")
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else reversed(MODES)):
            during = period(mode)
            after = period("bare")
            rounds[mode].append([round(previous, 3), round(during, 3), round(after, 3)])
            previous = after
    print(json.dumps({"preset": args.preset, "batch": args.batch, "steps": args.steps, "gpu": torch.cuda.get_device_name(),
                      "torch": torch.__version__,
                      "modes": {m: {"bare_mode_bare_ms": v,
                                    "ratios": [round(b / ((a + c) / 2), 3) for a, b, c in v],
                                    "ratio_to_bare": round(statistics.median(b / ((a + c) / 2) for a, b, c in v), 3)}
                                for m, v in rounds.items()}}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
