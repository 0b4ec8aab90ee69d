"""tracekit: profiler-centric trace analysis for distributed PyTorch training.

`load`, `load_run`, `load_trace`, `Trace`, `Run` are imported on first use, so that the
runners (`tracekit.runners`) work where only torch is installed.
"""

import importlib

from .core.errors import TraceError

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
