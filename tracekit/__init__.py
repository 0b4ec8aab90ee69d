"""tracekit: profiler-centric trace analysis for distributed PyTorch training.

`load`, `load_run`, `load_trace`, `Trace`, `Run` are imported on first use, so that the
runners (`tracekit.runners`) work where only torch is installed.
"""

import importlib
import os

from .core.errors import TraceError

# polars' allocator (jemalloc) keeps the pages of freed buffers for 10 s by default, so that a
# cold load's transients (each piece's columns, each table replaced by its classified or
# stepped one) stay in the process's memory to its end: 0.1 s returns them while a load runs
# (a 195 MB trace's peak 431 -> ~380 MB; no time measured lost). It takes effect where tracekit
# is imported before polars (the command) and where the user has not set it.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:100,muzzy_decay_ms:0")

__all__ = ["TraceError", "Run", "Trace", "load", "load_run", "load_trace"]
__version__ = "0.1.0"


_LAZY = {"load": "tracekit.core.loading", "load_run": "tracekit.core.loading", "load_trace": "tracekit.core.loading",
         "Run": "tracekit.core.model", "Trace": "tracekit.core.model"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = getattr(module, name)
    globals()[name] = value
    return value
