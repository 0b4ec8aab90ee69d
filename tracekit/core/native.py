"""The native decoder (`_columns.c`): a chunk of Kineto events read straight into columns.

`frame(raw_columns(text))` gives one row per complete ('X') event of a JSON array's text, with
the fields `kineto.Event` and `kineto.Args` hold: what msgspec's typed decode gives, without
a Python object per event. With `groups`, `frames(raw_columns(text, groups))` gives the rows
split by their `cat`, each group with only its columns: the loader's tables straight from the
text, without a wide table of every field, mostly null, for every row (a 195 MB trace's was
~180 MB). `raw_columns` is None where the extension is not built (an install without a C
compiler) or where the text needs the typed or lenient decode (`_columns.c` says when): the
loader then decodes it with msgspec. `TRACEKIT_NATIVE=0` turns it off.
"""

from __future__ import annotations

import os
from typing import NamedTuple

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


class Raw(NamedTuple):
    """The C decoder's result for a text: how many complete events (rows) and events it holds,
    how many of them are lenient (a field written in another type than the typed structs hold,
    read as the loader's lenient decode reads it), how many rows have a kept `ts_exact` it
    could not read, how many rows of a group holding `pid` or `tid` have one given as text;
    per group, its rows and its columns' capsules (`frames`)."""

    rows: int
    events: int
    lenient: int
    inexact: int
    text_ids: int
    groups: tuple


# Every column the decoder reads (`frame` says what each holds), in its order.
NAMES = (*_columns.STR_NAMES, *_columns.INT_NAMES, *_columns.FLT_NAMES) if _columns else ()
WIDE = ((None, NAMES),)  # one group: every complete event, every column


def raw_columns(text, groups: tuple = WIDE) -> Raw | None:
    """The C decoder's result for the text, or None (see the module's docstring). `groups`:
    ((cats, names), ...): a row whose `cat` is one of a group's cats goes to that group (cats
    None: every row no other group takes; a row no group takes is left out), which holds the
    columns `names`, in that order. No polars call, so that the threads that decode pieces hold
    the interpreter little (a thread that imported its 34 columns took it 35 times, and 16
    threads queued for it)."""
    if not available():
        return None
    got = _columns.columns(text, groups)
    return None if got is None else Raw(*got)


def frames(raw: Raw) -> list[pl.DataFrame]:
    """Each group's rows of `raw_columns`' result, in file order, with its columns. Columns:
    `cat`, `name` (text, "" when absent), `pid`/`tid` (int; `pid_text`/`tid_text` where given
    as text), `ts`/`dur` (float µs), `ts_exact` (int ns read from the text of `ts`, as
    `loading.exact_ns` reads it, kept only where `ts` is at least `loading.EXACT_LIMIT_US`),
    the `Args` fields under their struct names (int or text; `grid`/`block` as "24017x1x1";
    `input_dims`, `input_types`, `concrete_inputs` as raw JSON text); null where absent."""
    return [pl.concat([pl.DataFrame(_Exported(*pair)) for pair in columns], how="horizontal")
            for _, columns in raw.groups]


def frame(raw: Raw) -> pl.DataFrame:
    """The one group's rows of `raw_columns`' result (`WIDE`: every complete event)."""
    (only,) = frames(raw)
    return only


class _Exported:
    """One of the native decoder's columns as an object of the Arrow PyCapsule interface, which
    polars reads without copying."""

    def __init__(self, schema, array):
        self.capsules = (schema, array)

    def __arrow_c_array__(self, requested_schema=None):
        return self.capsules
