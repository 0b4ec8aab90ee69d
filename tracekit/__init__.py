"""tracekit: profiler-centric trace analysis for distributed PyTorch training."""

from .errors import TraceError
from .load import load, load_run, load_trace
from .model import Run, Trace

__all__ = ["TraceError", "Run", "Trace", "load", "load_run", "load_trace"]
__version__ = "0.1.0"
