"""Recording steps with torch.profiler, in one of four capture modes (docs/profile.md); the
default, `cupti`, records without torch.profiler (`cupti_capture.py`) and falls back to `device`.

- `device`: CUDA activities alone (runtime calls, kernels, copies, memsets; not
  CUPTI's synchronization records), no CPU side at all: the runner writes its own step and
  phase marks into the trace afterwards (`with_marks`: `ProfilerStep#N` and
  `tracekit#<phase>` from the phase clocks' wall-clock readings). The cheapest capture that
  still gives kernels and runtime calls; these steps are what `diff` attributes. Off CUDA
  there is no device activity: it records as `lean`.
- `lean`: CUDA activities as `device` and, of the CPU side, user annotations only —
  `ProfilerStep#N`, the runner's `tracekit#<phase>`, the libraries' own (`FSDP::…`,
  `Optimizer.step#…`) — no per-op records, no shapes. Nor does it tell Python libraries that
  a profiler runs (`torch.autograd.profiler._is_profiler_enabled` stays false): inductor would
  otherwise wrap every compiled kernel's launch in an annotation built in Python. On the H200
  large/16 step it cost 1.24–1.31× where `device` cost 1.13–1.19× (docs/runs/README.md).
- `light`: every CPU op, no shapes or stacks, CUPTI synchronization records.
- `full`: every CPU op with shapes (and stacks with `--with-stack`), CUPTI synchronization
  records: names and blame.

Kineto leaves CUPTI attached to the process after a recording unless `TEARDOWN_CUPTI=1`
(pytorch/pytorch#144455; kineto turned it on by default only for newer releases): every later
CUDA call then still pays CUPTI's callbacks, 10–20 % of a host-bound step, so every step after
the first recording — the control steps, the next variants' timed steps — would run slower
than before it. `profiler` sets `TEARDOWN_CUPTI=1` unless the environment says otherwise
(torch sets 0 itself for CUDA graphs under inductor, where a teardown crashed).
"""

from __future__ import annotations

import os

import torch
from torch._C._profiler import RecordScope
from torch.autograd import _enable_profiler
from torch.profiler import ProfilerActivity, profile, schedule

MODES = ("cupti", "device", "lean", "light", "full")  # cupti: runners/cupti_capture.py


def profiler(device: torch.device, mode: str, steps: int, with_stack: bool, on_trace_ready):
    """A torch.profiler that warms up for one step, then records `steps` steps
    (ProfilerStep#1..steps) in `mode` and hands itself to `on_trace_ready`."""
    cuda = device.type == "cuda"
    if cuda:
        os.environ.setdefault("TEARDOWN_CUPTI", "1")  # detach CUPTI when the recording ends
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if marks_written(mode, device):  # no CPU side: the runner's marks go in afterwards
        activities = [ProfilerActivity.CUDA]
    kwargs = {}
    config_type = getattr(torch._C._profiler, "_ExperimentalConfig", None)
    quiet = mode in ("device", "lean")
    if not quiet and cuda and config_type and "enable_cuda_sync_events" in (config_type.__init__.__doc__ or ""):
        kwargs["experimental_config"] = config_type(enable_cuda_sync_events=True)
    cls = Quiet if quiet else profile
    return cls(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
               on_trace_ready=on_trace_ready, record_shapes=mode == "full",
               with_stack=mode == "full" and with_stack, **kwargs)


def marks_written(mode: str, device: torch.device) -> bool:
    """Whether a recording in `mode` needs the runner's marks written into it (`with_marks`):
    it has no CPU side to hold `ProfilerStep#N` and `tracekit#<phase>`."""
    return mode == "device" and device.type == "cuda"


def with_marks(trace: dict, steps: list[tuple[int, tuple[int, int], list[tuple[str, int, int]]]]) -> dict:
    """`trace` (a Kineto trace, as JSON) with the runner's marks added as user annotations on
    the thread that ran the steps: per step (number, (start, end), [(phase name, start, end)]),
    wall-clock ns, `ProfilerStep#<number>` and each `tracekit#<phase>`. Kineto's timestamps are
    µs since `baseTimeNanoseconds` on the wall clock; each added event says where it came from
    (`args.source`)."""
    import threading

    base = trace.get("baseTimeNanoseconds", 0)
    pid, tid = os.getpid(), threading.get_native_id()

    def event(name, start, end):
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": tid,
                "ts": round((start - base) / 1000, 3), "dur": round((end - start) / 1000, 3),
                "args": {"source": "tracekit runner (phase clocks, wall clock)"}}
    added = [event(f"ProfilerStep#{number}", *span) for number, span, _ in steps]
    added += [event(name, start, end) for _, _, phases in steps for name, start, end in phases]
    return {**trace, "traceEvents": trace.get("traceEvents", []) + added}


def write_marks(path, clocks) -> None:
    """Adds the marks of `clocks` (`PhaseClock`s of the recorded steps ProfilerStep#1, #2, …) to
    the gzipped trace at `path` (`with_marks`)."""
    import gzip
    import json

    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    trace = with_marks(trace, [(i + 1, c.span(), c.spans()) for i, c in enumerate(clocks)])
    with gzip.open(path, "wt", compresslevel=6) as f:
        json.dump(trace, f, separators=(",", ":"))


class Quiet(profile):
    """A profiler whose CPU side records `RecordScope.USER_SCOPE` only (what
    `record_function` and `ProfilerStep#` record), through the scopes argument of torch's
    `_enable_profiler`, which `torch.profiler.profile` does not expose; Python libraries are
    not told that it runs (torch's own start hook, which sets that flag, is not called)."""

    def prepare_trace(self):
        super().prepare_trace()
        inner = self.profiler

        def start_trace():
            inner.entered = True
            _enable_profiler(inner.config(create_trace_id=False), inner.kineto_activities,
                             {RecordScope.USER_SCOPE})

        inner._start_trace = start_trace
