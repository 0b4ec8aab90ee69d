"""The `tracekit` command: parse arguments, load, call an analysis, render. Computes nothing.

One click group (`common.main`); its verbs live by family: reading traces, comparing
variants, running the model, writing and showing for other tools."""

from . import comparing, memory, reading, running, serving  # noqa: F401 (each registers its verbs on main)
from .common import main

__all__ = ["main"]
