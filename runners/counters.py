"""What the runtime itself counts during the recorded step, without reading the trace.

`RuntimeCounts` wraps, for the duration of a `with` block, `torch.cuda.Event.synchronize`,
`torch.cuda.Stream.synchronize` and the `torch.distributed` collective functions, and counts
calls made from Python. Calls made inside C++ (DDP's all-reduces from its reducer,
`cudaDeviceSynchronize` from `torch.cuda.synchronize`, the stream sync of `.item()`) are not seen.
"""

from __future__ import annotations

import collections
import functools

import torch
import torch.distributed as dist

# torch ≥ 2.13 names the tensor collectives all_gather_single / reduce_scatter_single.
COLLECTIVES = ("all_gather_into_tensor", "all_gather_single", "all_gather", "reduce_scatter_tensor",
               "reduce_scatter_single", "reduce_scatter",
               "all_reduce", "broadcast", "reduce", "all_to_all_single", "all_to_all", "send", "recv",
               "isend", "irecv", "barrier")


class RuntimeCounts:
    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self._saved: list = []

    def _wrap(self, owner, attr: str, key: str) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def counted(*args, **kwargs):
            self.counts[key] += 1
            return original(*args, **kwargs)

        self._saved.append((owner, attr, original))
        setattr(owner, attr, counted)

    def __enter__(self):
        if torch.cuda.is_available():
            self._wrap(torch.cuda.Event, "synchronize", "Event.synchronize")
            self._wrap(torch.cuda.Stream, "synchronize", "Stream.synchronize")
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._wrap(dist, name, name)
        return self

    def __exit__(self, *exc):
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()
        return False
