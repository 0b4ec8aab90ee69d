"""Decoding one large trace file in several processes: its events cut into pieces at line
boundaries, each piece decoded by whichever process takes it next.

Kineto writes one event per line (`stream.py`: the separator `,\\n  {` occurs only between
elements of `traceEvents`), so any offset of the file can be moved forward to the next
separator without reading what comes before it. `pieces` finds the first element and the
array's end (`stream.last_events`, which also gives the top level without the events) and
cuts between them, in pieces that shrink toward the end. `decoded` gives each piece's text to
`fn` — in this process and in `workers` others, which read their pieces from the file
themselves, write what is large (the tables) as files in a temporary folder of the call and
send back only `fn`'s small results — and returns the results in file order. A gzip file is
first gunzipped (ISA-L) into that folder. The workers are forked from a server process that
has imported `fn`'s module (`forkserver`), so that each costs a fork, not a fresh
interpreter; they take pieces from a shared counter, so that a slow start or a busy core
costs only the pieces a worker did not take. The server (and the resource tracker its start
starts) is stopped when the call ends (by a thread, not waited for), unless it was running
before.

`threaded` decodes the pieces in threads of this process instead, for an `fn` that releases
the interpreter while it works (the native decoder, `native.py`): no process to start, no
memory held twice, no files.

A file that is not one event per line raises `stream.Unsplittable`; a piece that fails (a
wrong cut gives text that does not parse), or a worker that dies, raises `Failed`: the
caller then decodes the file in one process.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.context
import os
import queue
import shutil
import tempfile
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import forkserver

from . import files
from .stream import EventStream, Unsplittable, last_events

MIN_PIECE = 2 << 20  # bytes: no piece is cut smaller (each costs ~5-10 ms more of table building)
MAX_PIECE = 8 << 20  # bytes: nor larger (its event structs are in memory at once; 16 MiB: as fast, more memory)
WINDOW = 1 << 20  # bytes searched for a separator after each cut's target offset
TAIL = 1 << 20  # bytes at the end first searched for the last separator
HERE = True  # whether the calling process takes pieces too (tests: False, so workers take all)
KEEP_SERVER = False  # whether the fork server this started outlives the decode (tests: True, so that
# their many small decodes share one); by default it is stopped, with the resource tracker it
# started: an interpreter with polars imported is ~0.2x a 187 MB file's memory, held through the
# analysis that follows otherwise


stopping: threading.Thread | None = None  # the last call's stopping of the helpers it started


class Failed(Exception):
    """A piece or a worker failed: decode the file in one process."""


def plain_text(location: str, folder: str) -> str:
    """The file's text as a file: `location` itself, or gunzipped into `folder`."""
    with open(location, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return location
    target = os.path.join(folder, "trace.json")
    with files.open_stream(location) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, 8 << 20)
    return target


def pieces(text: str, processes: int) -> tuple[list[tuple[int, int]], bytes, bytes]:
    """(byte ranges of the events before the last ones, the last events as a JSON array's
    text, the top level without the events) of a trace's text, cut for `processes`. Each range
    holds whole events, separated as in the file; `[` + it + `]` is an array. Each piece is
    1/(2 × processes) of the text after it (within MIN_PIECE and MAX_PIECE), so pieces shrink
    toward the end and no process waits long for the last one taken."""
    events = EventStream(text)
    try:
        head, body, separator, kept = events.start()
        first = events.consumed - len(body)
    finally:
        events.file.close()
    if b"\n" not in separator:
        raise Unsplittable  # not one event per line: only the stream can cut it
    size = os.path.getsize(text)
    with open(text, "rb") as f:
        span = TAIL
        while True:  # the last separator: what follows it holds the last events and the end
            start = max(first, size - span)
            f.seek(start)
            tail = f.read()
            cut = tail.rfind(separator)
            if cut != -1 or start == first:
                break
            span *= 8
        if cut == -1:
            raise Unsplittable  # one event: nothing to share out
        last_cut = start + cut
        last, metadata = last_events(head, tail[cut + len(separator) - 1:])
        ranges, begin = [], first
        while begin < last_cut:
            target = begin + min(MAX_PIECE, max(MIN_PIECE, (last_cut - begin) // (2 * processes)))
            f.seek(target)
            found = f.read(WINDOW).find(separator) if target < last_cut else -1
            cut = target + found if found != -1 and target + found < last_cut else last_cut
            ranges.append((begin, cut))
            begin = cut + len(separator) - 1  # the next element's "{"
    return ranges, last, metadata


def piece_text(text: str, where: tuple[int, int]) -> bytearray:
    """`[` + the text in `where` + `]`, read into one buffer."""
    start, end = where
    buf = bytearray(end - start + 2)
    with open(text, "rb") as f:
        f.seek(start)
        f.readinto(memoryview(buf)[1:-1])
    buf[0], buf[-1] = ord("["), ord("]")
    return buf


def _take(counter, total: int) -> int | None:
    """The next piece's index, or None when every piece is taken."""
    with counter.get_lock():
        i = counter.value
        counter.value = i + 1
    return i if i < total else None


def _work(text: str, ranges: list, fn, counter, results, folder: str) -> None:
    """A worker: `fn` of each piece it takes, sent back with the piece's index; `fn` may write
    what is large into files named from the prefix it is given, in the decode's folder."""
    os.environ["POLARS_MAX_THREADS"] = "1"  # the processes share the cores, not their threads
    while (i := _take(counter, len(ranges))) is not None:
        try:
            results.put((i, fn(piece_text(text, ranges[i]), os.path.join(folder, f"piece{i}")), None))
        except Exception as e:  # reported; the caller decodes the file in one process
            results.put((i, None, f"{type(e).__name__}: {e}"))
            return


def _context():
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("forkserver")


def _process(ctx, **kwargs):
    """A worker process: where forked by the server, one that does not run the caller's main
    module first. multiprocessing prepares every child by re-running the script it was started
    from (as `__mp_main__`), so a user's script without an `if __name__ == "__main__":` guard
    would run its top-level code again in each worker; `_work` needs none of it."""
    if ctx.get_start_method() != "forkserver":
        return ctx.Process(**kwargs)
    return _Worker(**kwargs)


_LAUNCH = threading.Lock()


class _Worker(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        from multiprocessing import popen_forkserver, spawn

        prepared = spawn.get_preparation_data

        def without_main(name):
            data = prepared(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        # multiprocessing's function swapped while this worker launches (milliseconds): a process
        # another thread starts in that moment would not re-run the main module either
        with _LAUNCH:
            spawn.get_preparation_data = without_main
            try:
                return popen_forkserver.Popen(process_obj)
            finally:
                spawn.get_preparation_data = prepared


def _start_server() -> None:
    """The fork server, started unless running; it imports `fn`'s module while the text is
    gunzipped and cut. It is a `python -c` interpreter, whose path starts with the current
    folder: a module there of a name that tracekit or polars imports (a second checkout's
    `tracekit/`) would be run there, and would shadow the installed one. `PYTHONSAFEPATH`
    (Python 3.11+) keeps the folder off its path."""
    before = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = before


def decoded(location: str, fn, workers: int, unpack=None) -> tuple[list, bytes]:
    """([fn(piece text, prefix) for each piece, in file order], the top level without the
    events) of a local trace file, decoded here and in `workers` other processes (see the
    module). `prefix` is None in this process; in a worker, a path in a temporary folder of this
    call that `fn` may write files under (removed when this returns), so that what is large
    reaches this process as a file, not as bytes piped and unpickled. With `unpack`, each result
    is `unpack(fn(…))`, unpacked here by a pool of threads as the results arrive (a worker's
    files read back)."""
    with _DECODING:  # one at a time: each takes every core, and the helpers are the module's
        return _decoded_alone(location, fn, workers, unpack)


_DECODING = threading.Lock()


def _decoded_alone(location: str, fn, workers: int, unpack) -> tuple[list, bytes]:
    if multiprocessing.current_process().daemon:
        workers = 0  # a daemon process may not start others
    ctx = _context()
    started = []  # the helper processes this call started, stopped at its end (`_stop_helpers`)
    global stopping  # a thread: the server's exit takes ~40 ms, which the caller need not wait for
    if stopping:
        stopping.join()  # the helpers the last call started are gone before this looks for them
    if workers and ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([fn.__module__])
        started = _not_running()
        with _LAUNCH:
            _start_server()
    try:
        return _decoded(location, fn, workers, unpack, ctx)
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)  # its frames' semaphores freed before the tracker stops
        raise
    finally:
        if not KEEP_SERVER and started:
            stopping = threading.Thread(target=_stop_helpers, args=(started,), daemon=True)
            stopping.start()


def _not_running() -> list:
    """The fork server and the resource tracker (which the server's start starts) that are not
    running now: those that `forkserver.ensure_running()` will start."""
    from multiprocessing import resource_tracker

    server, tracker = getattr(forkserver, "_forkserver", None), getattr(resource_tracker, "_resource_tracker", None)
    return [helper for helper, running in ((server, "_forkserver_pid"), (tracker, "_fd"))
            if helper is not None and hasattr(helper, "_stop") and getattr(helper, running, 0) is None]


def _stop_helpers(helpers: list) -> None:
    """Stop these helper processes (the fork server first: it uses the tracker). Private
    methods of multiprocessing (Python 3.10-3.13); where they fail, the helpers keep running."""
    gc.collect()  # the semaphores of the counter and the queue, which the tracker must see freed
    for helper in helpers:
        try:
            helper._stop()
        except Exception:
            return


def _decoded(location: str, fn, workers: int, unpack, ctx) -> tuple[list, bytes]:
    with tempfile.TemporaryDirectory(prefix="tracekit-", ignore_cleanup_errors=True) as folder:
        text = plain_text(location, folder)
        ranges, last, metadata = pieces(text, workers + 1)
        total = len(ranges)
        counter, results = ctx.Value("q", 0), ctx.Queue()
        processes = [_process(ctx, target=_work, args=(text, ranges, fn, counter, results, folder), daemon=True)
                     for _ in range(min(workers, total - 1))]
        # started in the background: the first start waits for the fork server to import `fn`'s
        # module, and this process decodes pieces meanwhile (when it has taken every piece
        # itself, it still waits for that start to end: see the `finally`)
        starter = threading.Thread(target=_start, args=(processes, counter, total), daemon=True)
        starter.start()
        out: dict[int, object] = {}
        pool = ThreadPoolExecutor(workers + 1) if unpack else None
        try:
            while HERE and (i := _take(counter, total)) is not None:
                out[i] = fn(piece_text(text, ranges[i]), None)
                _gather(results, out, processes, starter, wait=False, pool=pool, unpack=unpack)
            out[total] = fn(last, None)
            if pool:
                out = {i: v if isinstance(v, Future) else pool.submit(unpack, v) for i, v in out.items()}
            while len(out) < total + 1:
                _gather(results, out, processes, starter, wait=True, pool=pool, unpack=unpack)
            if pool:
                out = {i: v.result() if isinstance(v, Future) else unpack(v) for i, v in out.items()}
        finally:
            if pool:
                pool.shutdown(cancel_futures=True)
            with counter.get_lock():
                counter.value = total  # a worker still running, or starting, takes nothing more
            starter.join()  # a start under way ends (the worker, given no piece, ends too) before
            # the semaphores it is sent are freed, which it would fail to open
            for process in processes:
                if process.pid is None:
                    continue
                if process.is_alive() and len(out) < total + 1:
                    process.terminate()
                process.join()
    return [out[i] for i in range(total + 1)], metadata


def threaded(location: str, fn, threads: int, then=lambda result: result) -> tuple[list, bytes]:
    """([then(fn(piece text, None)) for each piece, in file order], the top level without the
    events) of a local trace file, the pieces decoded by `threads` threads of this process and
    `then` done by this thread as each piece is done: for an `fn` that releases the interpreter
    while it works (the native decoder), threads share the cores without a process's start,
    memory or files."""
    with tempfile.TemporaryDirectory(prefix="tracekit-", ignore_cleanup_errors=True) as folder:
        text = plain_text(location, folder)
        ranges, last, metadata = pieces(text, threads)
        try:
            with ThreadPoolExecutor(threads) as pool:
                out = [then(result) for result in pool.map(lambda where: fn(piece_text(text, where), None), ranges)]
                out.append(then(fn(last, None)))
        except Exception as e:  # as a worker's failed piece: the caller decodes the file in one process
            raise Failed(f"{type(e).__name__}: {e}") from None
    return out, metadata


def _start(processes: list, counter, total: int) -> None:
    """Start the workers while pieces are left, until one cannot be started (the others take
    its pieces)."""
    for process in processes:
        if counter.value >= total:
            return
        try:
            process.start()
        except Exception:
            return


def _gather(results, out: dict, processes: list, starter, wait: bool, pool=None, unpack=None) -> None:
    """Move the workers' results that have arrived into `out` (with `wait`, at least one, or
    raise Failed when a worker has died, or all have ended); with a `pool`, `unpack` of each,
    as a future."""
    while True:
        try:
            i, value, error = results.get(timeout=0.5) if wait else results.get_nowait()
        except queue.Empty:
            if not wait:
                return
            codes = [p.exitcode for p in processes if p.pid is not None]
            if any(c not in (None, 0) for c in codes) or (None not in codes and not starter.is_alive()):
                try:
                    i, value, error = results.get(timeout=0.5)  # sent just before it ended
                except queue.Empty:
                    raise Failed("a worker ended without sending its pieces") from None
            else:
                continue
        if error:
            raise Failed(error)
        out[i] = pool.submit(unpack, value) if pool else value
        wait = False
