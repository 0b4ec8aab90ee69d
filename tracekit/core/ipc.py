"""Tables as Arrow IPC, the form the trace cache keeps them in (`cache.py`, which checks their
bytes before they are read): zstd-compressed, a small table as an IPC stream and a larger one
as an IPC file. Importing this module is cheap (polars comes with the first table read or
written)."""

from __future__ import annotations

from pathlib import Path

# polars (`pl` in the annotations) is imported where it is used
STREAM_BELOW = 1 << 20  # bytes (`estimated_size`): a smaller table is kept as an IPC stream
FILE_MAGIC = b"ARROW1"  # how an IPC file begins


def write_table(frame: pl.DataFrame, path: Path) -> None:
    """`frame` kept at `path` as Arrow IPC, zstd: a table under `STREAM_BELOW` as an IPC stream,
    a larger one as an IPC file. polars 2 writes and reads an IPC file through its streaming
    engine, ~0.5 ms each for a small table against ~0.05 ms for a stream (polars 1.31: the
    same for both); from a few MB up the file is the faster, read in parallel."""
    if frame.estimated_size() < STREAM_BELOW:
        frame.write_ipc_stream(path, compression="zstd")
    else:
        frame.write_ipc(path, compression="zstd")


def table_from(stored: bytes) -> pl.DataFrame:
    """The table `write_table` wrote, from its bytes: polars would try to memory-map a path,
    which it cannot for a compressed file (polars 1.x then warns on stderr at every read)."""
    import polars as pl

    return pl.read_ipc(stored) if stored[:6] == FILE_MAGIC else pl.read_ipc_stream(stored)
