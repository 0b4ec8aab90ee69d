"""The native decoder (`_columns.c`): a chunk of Kineto events read straight into columns.

`complete_events(text)` gives one row per complete ('X') event of a JSON array's text, with
the fields `kineto.Event` and `kineto.Args` hold: what msgspec's typed decode gives, without
a Python object per event. None where the extension is not built (an install without a C
compiler) or where the text needs the typed or lenient decode (`_columns.c` says when): the
loader then decodes it with msgspec. `TRACEKIT_NATIVE=0` turns it off.
"""

from __future__ import annotations

import os

import polars as pl

try:
    from . import _columns
except ImportError:  # not built: the loader decodes every chunk with msgspec
    _columns = None


def available() -> bool:
    return _columns is not None and os.environ.get("TRACEKIT_NATIVE", "1") != "0"


def give_back_memory() -> None:
    """The memory that the freed columns of decoded chunks held, given back to the system (on
    glibc, which keeps it otherwise)."""
    if _columns is not None:
        _columns.trim()


def complete_events(text) -> tuple[pl.DataFrame, int, int, int, int] | None:
    """(the complete events' columns, how many events the text holds, how many of them are
    lenient: a field written in another type than the typed structs hold, read as the loader's
    lenient decode reads it, how many rows have a kept `ts_exact` it could not read, how many a
    `pid` or `tid` given as text), or None. One polars call per text: the threads that decode
    pieces take the interpreter once each to hand theirs over. Columns: `cat`,
    `name` (text, "" when absent), `pid`/`tid` (int; `pid_text`/`tid_text` where given as
    text), `ts`/`dur` (float µs), `ts_exact` (int ns read from the text of `ts`, as
    `loading.exact_ns` reads it, kept only where msgspec's path reads every `ts` of the text
    that way: a lenient event, or a `ts` of at least `loading.EXACT_LIMIT_US`), the `Args` fields under their struct names (int or text;
    `grid`/`block` as "24017x1x1"; `input_dims`, `input_types`, `concrete_inputs` as raw JSON
    text); null where absent."""
    if not available():
        return None
    got = _columns.columns(text)
    if got is None:
        return None
    rows, events, lenient, inexact, text_ids, pair = got
    return pl.DataFrame(_Exported(*pair)), events, lenient, inexact, text_ids


class _Exported:
    """One of the native decoder's columns as an object of the Arrow PyCapsule interface, which
    polars reads without copying."""

    def __init__(self, schema, array):
        self.capsules = (schema, array)

    def __arrow_c_array__(self, requested_schema=None):
        return self.capsules
