"""Recording steps with torch.profiler, in one of three capture modes (docs/profile.md).

- `lean` (the default): CUDA activities (runtime calls, kernels, copies, memsets; not
  CUPTI's synchronization records, which cost per stream wait) and, of the CPU side, user annotations only — `ProfilerStep#N`,
  the runner's `tracekit#<phase>`, the libraries' own (`FSDP::…`, `Optimizer.step#…`,
  `nccl:…`) — no per-op records, no shapes. Nor does it tell Python libraries that a profiler
  runs (`torch.autograd.profiler._is_profiler_enabled` stays false): inductor would otherwise
  wrap every compiled kernel's launch in an annotation built in Python. Its cost is per
  device call, not per op, so its steps are the steps that ran: these are what `diff`
  attributes.
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

MODES = ("lean", "light", "full")


def profiler(device: torch.device, mode: str, steps: int, with_stack: bool, on_trace_ready):
    """A torch.profiler that warms up for one step, then records `steps` steps
    (ProfilerStep#1..steps) in `mode` and hands itself to `on_trace_ready`."""
    cuda = device.type == "cuda"
    if cuda:
        os.environ.setdefault("TEARDOWN_CUPTI", "1")  # detach CUPTI when the recording ends
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    kwargs = {}
    config_type = getattr(torch._C._profiler, "_ExperimentalConfig", None)
    if mode != "lean" and cuda and config_type and "enable_cuda_sync_events" in (config_type.__init__.__doc__ or ""):
        kwargs["experimental_config"] = config_type(enable_cuda_sync_events=True)
    cls = AnnotationsOnly if mode == "lean" else profile
    return cls(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
               on_trace_ready=on_trace_ready, record_shapes=mode == "full",
               with_stack=mode == "full" and with_stack, **kwargs)


class AnnotationsOnly(profile):
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
