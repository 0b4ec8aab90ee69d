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
- `cupti`: CUPTI's Activity API directly (`runners/cupti_capture.py`): enabled before the
  warm-up step (as the runner does), the phase clocks marking the stream; disabled, flushed and written as a trace
  after the period (outside it; the records per step are reported);
- `cupti-bare`: the same capture without phase clocks or stream markers (CUPTI's three activity
  kinds alone, as `shared/experiments/cupti-capture` measured them): `cupti` against
  `cupti-bare` is what the runner's marks add under CUPTI;
- `device`, `lean`, `light`, `full`: the capture modes of `runners/recording.py`, with the
  phase clocks (`device`'s marks are written into its trace after the recording, outside
  the period).
`--modes` picks them (default: all), `--variant` the runner's variant (default fsdp2),
`--budget-s` stops early (fewer rounds) to fit a device-time budget. Prints
one JSON object: per mode, each round's (bare before, mode, bare after) periods (ms), each
round's ratio, their median, the median's distribution-free 95 % interval (`median_interval`)
and their quartiles.

Rounds: on a host-paced step a single round's ratio wanders ±5–10 % around the mode's cost
(the bare periods around it move that much), so a median of 6 rounds can be several per cent
off; the default, 20 rounds, puts the median's 95 % interval within about ±2–3 %.

    torchrun --nproc-per-node 1 benchmarks/capture_cost.py --preset large --batch 16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist

from tracekit.runners.clock import PhaseClock
from tracekit.runners.cupti_capture import DeviceCapture, kineto_trace
from tracekit.runners.model import Transformer, model_config
from tracekit.runners.parallelize import parallelize
from tracekit.runners.recording import profiler
from tracekit.runners.worker import without_gc_pauses
from tracekit.runners.workload import fused_adamw

MODES = ("timers", "cupti-bare", "cupti", "device", "lean", "light", "full")


class NoClock(PhaseClock):
    """Phase boundaries without marks (the `bare` step)."""

    def _mark(self, phase):
        pass

    @contextlib.contextmanager
    def phase(self, name):
        yield


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The distribution-free interval of the median of `values` (order statistics whose ranks a
    Binomial(n, 1/2) puts around the middle with at least `level` coverage); the whole range
    when there are too few values for that coverage."""
    xs, n = sorted(values), len(values)
    tail = (1 - level) / 2
    k, below = 0, 0.0  # largest k with P(Binomial(n, 1/2) < k) <= tail
    while k < n // 2 and below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    return (xs[k - 1], xs[n - k]) if k else (xs[0], xs[-1])


def summary(rounds: list[list[float]]) -> dict:
    """Per mode: each round's ratio (mode's period ÷ the mean of the bare periods around it),
    their median, its 95 % interval and the quartiles."""
    ratios = [b / ((a + c) / 2) for a, b, c in rounds]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {"bare_mode_bare_ms": rounds, "ratios": [round(r, 3) for r in ratios],
            "ratio_to_bare": round(statistics.median(ratios), 3),
            "median_95": [round(x, 3) for x in median_interval(ratios)], "quartiles": [round(q[0], 3), round(q[2], 3)]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="large")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--variant", default="fsdp2", help="the runner's variant (fsdp2, fsdp2-compile, ...)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no round that would end past this many seconds of rounds (device time)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    os.environ.setdefault("TEARDOWN_CUPTI", "1")  # as the runner's recorder: no CUPTI left attached in later periods
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    cfg = model_config(args.preset, batch=args.batch)
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    model = parallelize(model, list(model.blocks), args.variant, device, True).model
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

    records = {}

    def period(mode: str) -> float:
        clock, capture = NoClock if mode in ("bare", "cupti-bare") else PhaseClock, None
        if mode in ("bare", "timers", "cupti", "cupti-bare"):
            prof = contextlib.nullcontext()
            capture = DeviceCapture(device) if mode.startswith("cupti") else None
        else:
            prof = profiler(device, mode, args.steps, False, lambda p: None)
        clocks = []
        with without_gc_pauses(), prof as p:
            if capture is not None:  # as the runner: before the warm-up step
                capture.start()
            step(clock(device))  # the profiler's warm-up step
            torch.cuda.synchronize()
            if p is not None:
                p.step()
            t = time.perf_counter()
            for _ in range(args.steps):
                clocks.append(clock(device, capture.mark) if mode == "cupti" else clock(device))
                step(clocks[-1])
                if p is not None and _ < args.steps - 1:
                    p.step()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1000 / args.steps
            if p is not None:
                p.step()
        if capture is not None:
            capture.stop()
        if mode == "cupti":
            trace = kineto_trace(capture.records, [[(i + 1, c.wall_marks()) for i, c in enumerate(clocks)]],
                                 pid=0, tid=0, base_ns=0)
            records.setdefault(mode, []).append(round(sum(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                                                          for e in trace["traceEvents"]) / args.steps, 1))
        elif mode == "cupti-bare":  # no markers to cut the warm-up step out: records per step of the whole period
            records.setdefault(mode, []).append(round(len(capture.records) / (args.steps + 1), 1))
        return ms

    for _ in range(3):
        period("bare")
    rounds = {m: [] for m in modes}
    previous = period("bare")
    began = time.monotonic()
    for r in range(args.rounds):
        if args.budget_s and r and (time.monotonic() - began) * (r + 1) / r > args.budget_s:
            break
        for mode in (modes if r % 2 == 0 else reversed(modes)):
            during = period(mode)
            after = period("bare")
            rounds[mode].append([round(previous, 3), round(during, 3), round(after, 3)])
            previous = after
    print(json.dumps({"preset": args.preset, "batch": args.batch, "variant": args.variant, "steps": args.steps,
                      "rounds": len(rounds[modes[0]]), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "activities_per_step": records, "modes": {m: summary(v) for m, v in rounds.items()}}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
