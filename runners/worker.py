"""One worker process's measurements (the run's plan is `plan.py`'s): a variant built and
trained step by step (`Trainee`), measured alone (`run_variant`) or side by side with others
(`interleave.py`), its recorded steps (`Recording`), and the agreement of the ranks on each
run's outcome.

Per variant: build (the `--model` factory, `runners/factories.py`) and wrap (timed), memory
after wrap, warm-up steps (the first records loss and grad norm), timed unprofiled steps
(with checkpoint saves when asked), the parameter checksum, peak memory, then `profile_steps`
steps recorded with torch.profiler (in the last repeat) with the runtime's own counts of each.
Every step carries phase timers (`clock.py`); the steps of each loop run back to back,
drained only before the first and after the last.

Each variant gets a process group of its own, made from the launcher's store under the
variant's prefix and destroyed after it, with a timeout (`collective_timeout_s`). The ranks
agree on a variant's outcome through that store, not through a collective: a rank that
raises or runs out of memory reports so at once and ends its group (on gloo its peers'
pending collectives then fail at once; on NCCL they end at the timeout), its peers report
too, and every rank goes on with the next variant on a fresh group. Before the model's first
collective the ranks also agree, through the store, that each has built it (`Built`): a rank
whose factory fails ends the variant on every rank at once, on any backend.

Started by the launcher, each rank also keeps, in the launcher's state folder, where it is in
the plan (`rank<r>.json`: the runs agreed so far with their results, and the run it is in),
Python's fault dump (`rank<r>.faults`) and a copy of its stderr (`rank<r>.stderr`): a worker
that dies hard is charged to the run it was in, not to one that finished or never began
(`launch.py`), with the last words of every rank. A group whose teardown does
not end within `teardown_s` ends the worker (`STUCK_EXIT`): fresh workers go on.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import functools
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import Checkpointer
from .counters import RuntimeCounts
from .clock import PHASES, PhaseClock, columns
from .cupti_capture import DeviceCapture, why_unavailable, write_trace
from .manifest import write_json_atomically
from .memory_record import memory_step
from .parallelize import after_optimizer_step, parallelize, precision_path
from .recording import marks_written, profiler, write_marks
from .variants import VARIANTS, base_variant
from .factories import build_workload, load_factory
from .workload import Workload

TRACE_NAME = "rank{rank}.pt.trace.json.gz"
NAMES_TRACE_NAME = "names/rank{rank}.pt.trace.json.gz"  # the `full` step that names a device/lean recording
# Test hooks: "<rank>:<variant>" makes that rank raise in the variant's timed steps;
# "<variant>@<preset>:<batch>" makes the variant run out of memory at that preset from that batch on.
FAILURE_HOOK, OOM_HOOK = "TRACEKIT_FAIL", "TRACEKIT_OOM"
TEARDOWN_S = 30  # the longest wait for a variant's process group to end (or the collective timeout, if shorter)
STUCK_EXIT = 75  # a worker's exit status when its process group did not end: fresh workers go on


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


def forward(model, inputs):
    """`model(inputs)`; a tuple is passed as positional arguments, a dict as keywords."""
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def token_count(targets) -> int | None:
    """The padded sequence length of a batch of token targets ([batch, seq] integers), else None."""
    if isinstance(targets, torch.Tensor) and targets.dim() == 2 and not targets.is_floating_point():
        return targets.shape[1]
    return None


def param_checksum(model: torch.nn.Module, wrapped: torch.nn.Module, wrap: str) -> dict:
    """A fingerprint of the full parameters (gathered from the shards: FSDP1
    `summon_full_params`, FSDP2 `full_tensor()`), in fp64: `sum` and `sum_sq` (Σθ, Σθ²) over
    every element, `numel`, and `samples` [name[index], value] — the first, middle and last
    element of the first and last parameter. `model` is the unwrapped model (the same
    parameters `wrapped` trains); names lose the wrappers' `_fsdp_wrapped_module.` and
    `_orig_mod.` parts."""
    from torch.distributed.tensor import DTensor

    full = contextlib.nullcontext()
    if wrap == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        full = FullyShardedDataParallel.summon_full_params(wrapped, writeback=False)
    with torch.no_grad(), full:
        params = list(model.named_parameters())
        sums, samples, numel = [], [], 0
        for i, (name, p) in enumerate(params):
            t = (p.full_tensor() if isinstance(p, DTensor) else p).detach().double().flatten()
            sums.append(torch.stack([t.sum(), (t * t).sum()]))
            numel += t.numel()
            if i in (0, len(params) - 1):
                clean = name.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", "")
                samples += [[f"{clean}[{j}]", t[j]] for j in sorted({0, t.numel() // 2, t.numel() - 1})]
        total, total_sq = torch.stack(sums).sum(0).tolist()
    return {"sum": total, "sum_sq": total_sq, "numel": numel, "samples": [[n, float(v)] for n, v in samples]}


class Trainee:
    """One variant built on this rank and trained step by step: its workload, wrapped model and
    optimizer, the batches it has taken, and its figures so far. `step(clock)` is one training
    step with its phases marked; `run_steps` a loop of them as training runs them. Several
    trainees can live in one process (the interleaved comparison, `runners/interleave.py`):
    each keeps its own model, optimizer, batch position and compile state."""

    def __init__(self, variant: str, cfg: dict, rank: int, device: torch.device, say=None, built=lambda: None):
        """Build and wrap `variant` (timed: `build_s`); `built()` is called once the model is
        built, before its first collective (`Built.here`)."""
        self.variant, self.cfg, self.rank, self.device = variant, cfg, rank, device
        self.progress = Progress(say)
        self.mixed = cfg["precision"] == "bf16"
        self.wrap = VARIANTS[base_variant(variant)]["wrap"]
        torch.manual_seed(cfg["seed"])
        before = memory(device, "memory_allocated")
        t0 = time.perf_counter()
        self.workload: Workload = build_workload(load_factory(cfg["model"], cfg), cfg["model"])
        oom = os.environ.get(OOM_HOOK, "")
        batch_size = self.workload.info.get("batch")
        if oom.startswith(f"{variant}@{cfg['preset']}:") and batch_size is not None \
                and batch_size >= int(oom.rsplit(":", 1)[1]):
            raise torch.OutOfMemoryError(f"injected out of memory ({OOM_HOOK}) at batch {batch_size}")
        model = self.workload.model.to(device)
        built()
        self.total_numel = sum(p.numel() for p in model.parameters())
        self.parallel = parallelize(model, self.workload.blocks, variant, device, self.mixed)
        self.model = self.parallel.model
        synchronize(device)
        self.build_s = time.perf_counter() - t0
        after = memory(device, "memory_allocated")
        self.memory_after_wrap = None if after is None else after - before
        self.optimizer = self.parallel.setup_optimizer(self.workload.optimizer(self.model.parameters()))
        native_ddp = self.wrap == "ddp" and not VARIANTS[base_variant(variant)].get("lightning")  # Lightning autocasts
        self.autocast = (functools.partial(torch.autocast, device.type, dtype=torch.bfloat16)
                         if self.mixed and native_ddp else contextlib.nullcontext)  # a context per step
        self.seq_lens, self.real_tokens, self.batch_sizes, self.step_index = [], [], [], 0
        self.fail_here = os.environ.get(FAILURE_HOOK) == f"{rank}:{variant}"

    def step(self, clock: PhaseClock, record_grad_norm: bool = False):
        """One training step, its phases marked on `clock`; returns (loss, grad norm or None)."""
        clock.start()
        with clock.phase("forward"):
            inputs, targets, *real = self.workload.batch(self.step_index, self.rank, self.device)
            self.seq_lens.append(token_count(targets))
            self.real_tokens.append(real[0] if real else None)
            self.batch_sizes.append(len(targets))
            self.step_index += 1
            with self.autocast():
                outputs = forward(self.model, inputs)
            loss = self.workload.loss(outputs, targets)
        with clock.phase("backward"):
            self.parallel.backward(loss)
        norm = grad_norm(self.model, self.wrap) if record_grad_norm else None
        with clock.phase("optimizer"):
            self.optimizer.step()
            after_optimizer_step(self.model, self.variant)
            self.optimizer.zero_grad(set_to_none=True)
        return loss, norm

    def run_steps(self, works, label: str) -> tuple[list[float], list[dict], float]:
        """Run `work(clock)` for each of `works` back to back, as training does: the device is
        drained before the first and after the last, never between. Returns each step's time
        (ms: its span on the device clock, first phase mark to last; the host clock off CUDA),
        its phase readings (`PhaseClock.ms`), and the wall time of the whole loop (ms, drained
        at both ends). Python's cycle collector does not run inside the loop."""
        clocks = [PhaseClock(self.device) for _ in works]
        with without_gc_pauses():
            synchronize(self.device)
            t = time.perf_counter()
            for i, (work, clock) in enumerate(zip(works, clocks)):
                work(clock)
                self.progress.at(label, i + 1, len(works))
            synchronize(self.device)
            wall = (time.perf_counter() - t) * 1000
        readings = [c.ms() for c in clocks]
        return [r["device" if self.device.type == "cuda" else "host"]["step"] for r in readings], readings, wall

    def bookmark(self):
        """A function that makes the next step take the batch the next step would take now
        (the control steps replay the recorded steps' batches)."""
        here = self.step_index

        def back():
            self.step_index = here
        return back

    def warm_up(self) -> None:
        """The first step (its loss and grad norm kept: `check` compares them across variants)
        and the other warm-up steps; what the first compiled is compiling, not recompiling
        (`recompiles`: the frames torch compiled in this variant's later steps)."""
        first_clock = PhaseClock(self.device)
        loss, norm = self.step(first_clock, record_grad_norm=True)
        self.first = {"loss": loss.detach().item(), "grad_norm": norm}
        synchronize(self.device)
        self.first["phase_ms"] = first_clock.ms()
        self.warmup_recompiled, self.recompiles = [], 0

        def warmup_step(clock):
            frames = compiled_frames()
            self.step(clock)
            self.recompiles += compiled_frames() - frames
            self.warmup_recompiled.append(compiled_frames() > frames)
        self.warmup_ms, self.warmup_readings, _ = self.run_steps([warmup_step] * (self.cfg["warmup"] - 1),
                                                                 "warm-up step")

    def timed_work(self, recompiled: list[bool], saved: list[bool], checkpoint=None, index: int = 0):
        """One timed step as a `run_steps` work: whether it recompiled and saved a checkpoint
        (step `index` of the timed ones) appended to `recompiled` and `saved`."""
        def work(clock):
            if self.fail_here:
                raise RuntimeError(f"injected failure on rank {self.rank} ({FAILURE_HOOK})")
            frames = compiled_frames()
            save = checkpoint is not None and checkpoint.due(index)
            self.step(clock)
            if save:
                with clock.phase("checkpoint"):
                    checkpoint.save(self.model, self.optimizer, index)
            saved.append(save)
            self.recompiles += compiled_frames() - frames
            recompiled.append(compiled_frames() > frames)
        return work

    def figures(self, times: list[float], readings: list[dict], wall: float, phases: tuple[str, ...],
                saved: list[bool], recompiled: list[bool]) -> dict:
        """This rank's measurements of the variant (the manifest's per-rank entry) from its
        timed steps (`times`, `readings`, `wall`: `run_steps`'), after them."""
        steps = len(times)
        timed_from = len(self.seq_lens) - steps
        local = local_numel(self.model)
        return {
            "rank": self.rank, "build_s": round(self.build_s, 3), "memory_after_wrap_bytes": self.memory_after_wrap,
            "step_ms": {"median": statistics.median(times), "min": min(times), "max": max(times), "all": times},
            "timed_wall_ms": round(wall, 3),
            "phase_ms": columns(readings, phases), "saved_steps": [i for i, s in enumerate(saved) if s],
            "local_param_fraction": local / self.total_numel,
            "model_state_bytes": model_state_bytes(local),
            "precision_path": precision_path(self.variant, self.mixed),
            "first_step": self.first, "seq_lens": self.seq_lens[timed_from:],
            "real_tokens": self.real_tokens[timed_from:],
            "batch_per_rank": self.batch_sizes[-1], "param_checksum": param_checksum(self.workload.model, self.model,
                                                                                     self.wrap),
            "recompiles": self.recompiles,  # its own steps' (torch's counter is the process's: other variants')
            "recompiled_steps": [i for i, r in enumerate(recompiled) if r],
            "warmup_step_ms": self.warmup_ms, "warmup_phase_ms": columns(self.warmup_readings, phases[:3]),
            "recompiled_warmup_steps": [i for i, r in enumerate(self.warmup_recompiled) if r],
        }

    def resident_bytes(self) -> int:
        """Bytes this variant holds between steps on this rank: its parameters (the local shards)
        and its optimizer's state tensors (gradients are freed by `zero_grad(set_to_none=True)`)."""
        def size(t) -> int:
            t = t.to_local() if hasattr(t, "to_local") else t
            return t.numel() * t.element_size()
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return sum(size(p) for p in self.model.parameters()) + sum(size(v) for v in state)


def run_variant(variant: str, cfg: dict, rank: int, device: torch.device, out: Path, record: bool,
                say=None, built=lambda: None) -> dict:
    """Measure one variant on this rank (and record it when `record`); returns its measurements.
    `say(line)` gives a sign of life (`Progress`); `built()` is called once the model is built,
    before its first collective (`Built.here`)."""
    release_memory(device)  # what earlier variants left must not count in this one's figures
    trainee = Trainee(variant, cfg, rank, device, say, built)
    trainee.warm_up()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    checkpoint = Checkpointer(cfg["checkpoint"], cfg["checkpoint_every"], out / variant / "ckpt") \
        if cfg["checkpoint"] else None
    phases = PHASES if checkpoint else PHASES[:-1]
    saved, recompiled = [], []
    times, readings, wall = trainee.run_steps(
        [trainee.timed_work(recompiled, saved, checkpoint, i) for i in range(cfg["steps"])], "timed step")
    result = trainee.figures(times, readings, wall, phases, saved, recompiled)
    result["peak_allocated_bytes"] = memory(device, "max_memory_allocated")
    result["peak_reserved_bytes"] = memory(device, "max_memory_reserved")
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
        trainee.progress.now(f"recording {cfg['profile_steps']} step(s)")
        result.update(recorded_figures(trainee.step, trainee.bookmark(), cfg, device, out, variant, rank))
        result["recorded_to_timed"] = round(statistics.median(result["profiled_step_ms"]) / statistics.median(times), 3)
    if record and cfg.get("memory"):  # one more step, its allocations recorded (memory_record.py)
        result.update(memory_step(trainee.step, trainee.optimizer, device, out / variant, rank, variant))
    return result


PROGRESS_S = 5.0  # a progress line once this long has passed without one


class Progress:
    """Signs of life in a variant's long loops: `at(label, i, n)` says "label i/n" when
    `PROGRESS_S` seconds have passed since the last line (or the variant began), so a short
    run stays quiet and a long one says where it is."""

    def __init__(self, say, clock=time.monotonic):
        self.say, self.clock, self.last = say, clock, clock()

    def at(self, label: str, i: int, n: int) -> None:
        self.now(f"{label} {i}/{n}")

    def now(self, line: str) -> None:
        if self.say and self.clock() - self.last >= PROGRESS_S:
            self.say(line)
            self.last = self.clock()


class Recording:
    """One variant's recorded steps on this rank: `--profile-steps` steps in `--profile-mode`
    (the trace `diff` attributes), each with its times, phases and runtime counts, alternated
    with the same procedure without the profiler, the control blocks (`control()`, then
    `record()` and `control()` again for each round): C R C in `device`, `lean`, `light` and
    `full` modes, C R C R … C with `--profile-rounds` R blocks in `cupti` mode, whose capture
    is restarted at no cost and whose one trace holds every round's steps (`control_step_ms`,
    their phases `control_phase_ms`; `profiler_overhead`, round by round). `finish()` writes
    the trace and, in `cupti`, `device` and `lean` modes, records one `full` step into `names/`
    (names and blame); it returns the figures. Every block trains on the same batches
    (`back()` before each). Where a `cupti` capture cannot run (`capture_mode`), the steps are
    recorded in `device` mode, in one round, and `capture_note` says why. The interleaved
    comparison runs the blocks of every variant's recording in its rotation
    (`runners/interleave.py`); `recorded_figures` runs one variant's alone."""

    def __init__(self, step, back, cfg: dict, device: torch.device, out: Path, variant: str, rank: int):
        self.step, self.back, self.cfg, self.device, self.out = step, back, cfg, device, out
        self.variant, self.rank = variant, rank
        self.path = out / variant / TRACE_NAME.format(rank=rank)
        self.mode, self.note = capture_mode(cfg["profile_mode"], device)
        self.capture = DeviceCapture(device) if self.mode == "cupti" else None
        self.recorded, self.controls = [], []

    @property
    def rounds(self) -> int:
        """The recorded blocks this recording takes: `--profile-rounds` in `cupti` mode, else 1."""
        return self.cfg["profile_rounds"] if self.mode == "cupti" else 1

    def _block(self, mode: str | None) -> dict:
        self.back()
        return record_steps(self.step, self.cfg, self.device, mode, self.cfg["profile_steps"], self.path,
                            self.capture if mode == "cupti" else None)

    def control(self) -> None:
        self.controls.append(self._block(None))

    def record(self) -> None:
        """One recorded block, if this recording takes another (`rounds`)."""
        if len(self.recorded) >= self.rounds:
            return
        try:
            self.recorded.append(self._block(self.mode))
        except CaptureUnavailable as e:  # CUPTI refused (another client holds it)
            if self.recorded:
                raise
            self.mode, self.note = "device", str(e)
            self.recorded.append(self._block(self.mode))

    def finish(self) -> dict:
        if self.note:
            log(self.rank, f"{self.variant}: recorded in device mode, not cupti: {self.note}")
        steps, out, lost = self.cfg["profile_steps"], self.out, {}
        if self.mode == "cupti":
            tmp = temporary(self.path)
            numbers = iter(range(1, steps * len(self.recorded) + 1))
            lost = write_trace(tmp, self.capture, [[(next(numbers), marks) for marks in r["wall_marks"]]
                                                   for r in self.recorded], self.device)
            os.replace(tmp, self.path)
        main = {**joined(self.recorded), "trace": str(self.path.relative_to(out)), "rounds": len(self.recorded),
                "steps_per_round": steps, **({"capture_note": self.note} if self.note else {}),
                **({"dropped_records": lost["dropped_records"]} if lost else {})}
        control = joined(self.controls)
        kept = [main]
        if self.mode in ("cupti", "device", "lean"):
            self.back()
            names = out / self.variant / NAMES_TRACE_NAME.format(rank=self.rank)
            named = record_steps(self.step, self.cfg, self.device, "full", 1, names)
            kept.append({**{k: v for k, v in named.items() if k != "wall_marks"}, "trace": str(names.relative_to(out))})
        return {"recorded": kept, "trace": main["trace"], "profile_mode": main["mode"],
                "profiled_step_ms": main["step_ms"], "runtime_counts_per_step": main["runtime_counts_per_step"],
                "runtime_counts": main["runtime_counts_per_step"][-1], "control_step_ms": control["step_ms"],
                "control_phase_ms": control["phase_ms"],
                **profiler_overhead([r["step_ms"] for r in self.recorded], [c["step_ms"] for c in self.controls])}


def recorded_figures(step, back, cfg: dict, device: torch.device, out: Path, variant: str, rank: int) -> dict:
    """One variant's `Recording` alone: C R C R … C, then its trace and naming step."""
    recording = Recording(step, back, cfg, device, out, variant, rank)
    recording.control()
    while len(recording.recorded) < recording.rounds:
        recording.record()
        recording.control()
    return recording.finish()


def joined(blocks: list[dict]) -> dict:
    """The blocks' (`record_steps`) figures as one: their steps' times, phases and runtime
    counts, block after block."""
    phases = {clock: None if blocks[0]["phase_ms"][clock] is None else
              {p: [x for b in blocks for x in b["phase_ms"][clock][p]] for p in blocks[0]["phase_ms"][clock]}
              for clock in blocks[0]["phase_ms"]}
    return {"mode": blocks[0]["mode"], "step_ms": [x for b in blocks for x in b["step_ms"]], "phase_ms": phases,
            "runtime_counts_per_step": [x for b in blocks for x in b["runtime_counts_per_step"]]}


def profiler_overhead(recorded: list[list[float]], controls: list[list[float]]) -> dict:
    """What the recording cost (docs/metrics.md): for round i, its recorded block's median step
    (ms) ÷ the mean of the median steps of the control blocks right before (i) and after (i + 1)
    it (`profiler_overhead_by_round`); `profiler_overhead` is the median of those. A host whose
    speed drifts for seconds moves a round's recorded block and its two neighbours together,
    so each round's ratio cancels the drift that pooling every step would keep."""
    rounds = [statistics.median(r) / ((statistics.median(controls[i]) + statistics.median(controls[i + 1])) / 2)
              for i, r in enumerate(recorded)]
    return {"profiler_overhead": round(statistics.median(rounds), 3),
            "profiler_overhead_by_round": [round(x, 3) for x in rounds]}


def capture_mode(mode: str, device: torch.device) -> tuple[str, str | None]:
    """The mode a recording asked in `mode` runs in, and why it differs: `cupti` needs CUDA
    (off CUDA it records as `device`, which records as `lean` there, silently) and an
    importable cupti-python of torch's CUDA major version (`cupti_capture.why_unavailable`)."""
    if mode != "cupti":
        return mode, None
    if device.type != "cuda":
        return "device", None
    why = why_unavailable()
    return ("device", why) if why else ("cupti", None)


def model_state_bytes(local_params: int) -> dict:
    """Estimate of the model state this rank holds (bytes): fp32 parameters and gradients and
    AdamW's two fp32 moments, 16 bytes per parameter element held."""
    return {"params": 4 * local_params, "grads": 4 * local_params, "optimizer": 8 * local_params,
            "total": 16 * local_params}


def record_steps(step, cfg: dict, device: torch.device, mode: str | None, steps: int, path: Path | None = None,
                 capture: DeviceCapture | None = None) -> dict:
    """`steps` training steps recorded in `mode` (into `path`; in `cupti` mode into `capture`,
    whose trace the caller writes), after one warm-up step of the profiler; with `mode` None,
    the same procedure without a profiler (the control). The GPU is drained before the first
    step and after the last, never between them (as in training); a step's time (`step_ms`) is
    its span on the device clock (the host clock off CUDA), first phase mark to last; its
    phase clock's wall marks are `wall_marks`. Python's cycle collector does not run inside. In
    `cupti` mode CUPTI records from before the warm-up step (its first launches after being
    enabled cost hundreds of ms: the warm-up step pays them) and the trace keeps what was
    launched from the first step's start mark on; the phase clocks mark the stream at each mark."""
    prof = contextlib.nullcontext()
    kineto = mode not in (None, "cupti")
    if kineto:
        tmp = temporary(path)
        prof = profiler(device, mode, steps, cfg["with_stack"], lambda p: p.export_chrome_trace(str(tmp)))
    clocks, counts = [], []
    with without_gc_pauses(), prof:
        if capture is not None:  # enabled before the warm-up step, which pays CUPTI's first-launch cost
            try:
                capture.start()
            except Exception as e:  # cupti.cuptiError: CUPTI held by another client, …
                raise CaptureUnavailable(f"CUPTI refused the capture ({type(e).__name__}: {e})".splitlines()[0])
        step(PhaseClock(device))  # the profiler's warm-up step
        synchronize(device)
        advance = prof.step if kineto else lambda: None
        advance()
        try:
            for _ in range(steps):
                clock = PhaseClock(device, capture.mark if capture is not None else None)
                with RuntimeCounts() as runtime:
                    step(clock)
                clocks.append(clock)
                counts.append(dict(runtime.counts))
                advance()
        finally:
            if capture is not None:  # also when a step raised: no later step pays for CUPTI
                synchronize(device)
                capture.stop()
    synchronize(device)
    if kineto:
        if marks_written(mode, device):
            write_marks(tmp, clocks)
        os.replace(tmp, path)
    phases = columns([c.ms() for c in clocks], PHASES[:3])
    return {"mode": mode, "step_ms": phases["device" if device.type == "cuda" else "host"]["step"],
            "phase_ms": phases, "runtime_counts_per_step": counts, "wall_marks": [c.wall_marks() for c in clocks]}


def temporary(path: Path) -> Path:
    """Where a trace is written before it is renamed to `path` (its folder made): a reader never
    sees half a trace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp.json.gz")


class CaptureUnavailable(Exception):
    """A `cupti` capture that CUPTI refused to start."""


@contextlib.contextmanager
def without_gc_pauses():
    """Python's cycle collector off for a loop of steps (run once before it), as torchtitan's
    trainer does: its pauses would otherwise land in random steps."""
    gc.collect(1)
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


@functools.cache
def rendezvous_store(rank: int, world: int):
    """The store of this process's rendezvous (`env://`), made once: every profile run of a
    process (capacity probes) shares it, each under a prefix of its own."""
    return next(dist.rendezvous("env://", rank, world))[0]


def end_group(failed: bool, wait_s: float) -> bool:
    """Destroy the variant's process group, waiting at most `wait_s` for the teardown; after a
    failure, abort it first (NCCL: a communicator stuck in a timed-out collective is aborted,
    not waited for). The variant's modules, which hold the group, are collected first, so the
    group ends here, not at whatever later moment the cycle collector runs (with a gloo
    group, its connections closing then, in the middle of the next variant). Returns whether
    it ended in time (True when there was no group)."""
    import threading

    gc.collect()
    if not dist.is_initialized():
        return True

    def teardown():
        with contextlib.suppress(Exception):
            if failed and dist.get_backend() == "nccl":
                dist.distributed_c10d._abort_process_group()
            dist.destroy_process_group()
    thread = threading.Thread(target=teardown, daemon=True)
    thread.start()
    thread.join(wait_s)
    return not thread.is_alive()


def copy_stderr_to(path: Path) -> None:
    """From now on, what this process writes to stderr (fd 2: Python's lines and C++'s, such as
    the "terminate called after throwing …  what(): …" that precedes an abort no Python handler
    sees) also goes to `path`, through `tee`: a process of its own, so the last lines before a
    hard death are kept whole. `tee -i`: a Ctrl-C does not end it before the worker. Without a
    `tee` on PATH, stderr stays as it is."""
    tee = shutil.which("tee")
    if tee is None:
        return
    read, write = os.pipe()
    subprocess.Popen([tee, "-i", str(path)], stdin=read, stdout=sys.stderr.fileno(), stderr=subprocess.DEVNULL)
    os.close(read)
    sys.stderr.flush()
    os.dup2(write, sys.stderr.fileno())
    os.close(write)


class Place:
    """Where one rank is in the run's plan, kept in the launcher's state folder: `rank<r>.json`
    {"done": runs agreed, "doing": the run it is in or None, "results": what the agreed runs
    measured}, Python's fault dump of a hard death, `rank<r>.faults` (every thread's stack), and
    a copy of what the worker wrote to stderr, `rank<r>.stderr` (`copy_stderr_to`)."""

    def __init__(self, folder: Path, rank: int):
        self.path = folder / f"rank{rank}.json"
        self.faults = open(folder / f"rank{rank}.faults", "w")  # kept open: faulthandler writes into it on a crash
        faulthandler.enable(self.faults, all_threads=True)
        copy_stderr_to(folder / f"rank{rank}.stderr")
        self.state = {"done": None, "doing": None, "results": None}
        write_json_atomically(self.path, self.state)  # not the place of the worker before it

    def doing(self, index: int) -> None:
        self.state["doing"] = index
        write_json_atomically(self.path, self.state)

    def done(self, count: int, results: dict) -> None:
        self.state = {"done": count, "doing": None, "results": results}
        write_json_atomically(self.path, self.state)


def run_agreed(measure, cfg: dict, rank: int, world: int, device: torch.device, store, prefix: str, backend: str,
               say=None) -> dict:
    """`measure(built, say)` (this rank's measurements) on a process group of its own (under
    `prefix` of the store); its outcome agreed by every rank through the store. A rank that
    fails ends its group before it waits for the others (module docstring); the caller ends the
    group of a run that did not fail."""
    timeout = cfg["collective_timeout_s"]
    built = Built(store, f"{prefix}/built", rank, world, timeout)
    try:
        init_group(store, prefix, backend, rank, world, device, timeout)
        mine = {"status": "ok", "message": "", "ranks": [measure(built.here, say)]}
    except torch.OutOfMemoryError as e:
        mine = {"status": "oom", "message": str(e).splitlines()[0], "at": time.time()}
    except Exception as e:  # recorded; the other variants still run
        mine = {"status": "error", "message": f"{type(e).__name__}: {e}".splitlines()[0],
                "traceback": traceback.format_exc(), "at": time.time()}
    if mine["status"] != "ok":
        built.failed(mine["message"])
        end_group(True, min(TEARDOWN_S, timeout))
    return merge_ranks(agreed(store, f"{prefix}/status", rank, world, mine, 2 * timeout))


class BuildFailedElsewhere(RuntimeError):
    """Another rank failed while building the model: this one never wraps it."""


class Built:
    """The ranks' agreement, through the store, that each has built the model, before its first
    collective (wrapping: DDP's and FSDP's constructors talk to every rank). A rank that fails
    while building says so there at once (`failed`): its peers end the variant with its error
    instead of waiting in a collective for the timeout, whatever the backend (on NCCL a peer's
    death does not end a pending collective)."""

    def __init__(self, store, key: str, rank: int, world: int, timeout_s: float):
        self.store, self.key, self.rank, self.world, self.timeout_s = store, key, rank, world, timeout_s
        self.arrived = False

    def here(self) -> None:
        """This rank built its model; raises BuildFailedElsewhere if another rank failed to."""
        self.arrived = True
        peers = agreed(self.store, self.key, self.rank, self.world, {"error": ""}, self.timeout_s)
        failed = [(r, p["error"]) for r, p in enumerate(peers) if p["error"]]
        if failed:
            raise BuildFailedElsewhere(f"rank {failed[0][0]} failed while building: {failed[0][1]}")

    def failed(self, message: str) -> None:
        """This rank failed before it built its model (after, its peers are past the agreement)."""
        if not self.arrived:
            self.store.set(f"{self.key}/{self.rank}", json.dumps({"error": message}))


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
