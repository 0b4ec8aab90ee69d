"""Where per-trace work runs: here, in worker processes, or on a Dask cluster — one interface.

`executor(workers, scheduler)` gives an object whose `map(fn, items)` returns `[fn(item)]` in
order (once: a cluster's connection is closed after it); when one item fails, the work not
yet done is cancelled (worker processes ended, cluster futures cancelled) and the error
raised. A scheduler address (`--scheduler tcp://HOST:PORT`, or `TRACEKIT_SCHEDULER`) sends
the work to that Dask cluster (`distributed.Client`, its futures; the optional extra `dask`);
else `workers` processes on this machine (as `jobs.processes` chooses them from `--workers`,
`TRACEKIT_WORKERS` or the traces' sizes; a verb begins them early, `begin`), or, where one
would do, this process (`Here`: a thread per core). Only
`fn`'s results travel back from processes, so `fn` should return small results, not traces. A
progress bar is shown on a terminal.
"""

from __future__ import annotations

import atexit
import os
import sys

from .errors import UsageError, WorkerDied


def cores() -> int:
    """The cores this process may use: `TRACEKIT_CORES` (a worker's share, or the user's
    bound), else those it may run on."""
    if os.environ.get("TRACEKIT_CORES", "").isdigit() and int(os.environ["TRACEKIT_CORES"]) > 0:
        return int(os.environ["TRACEKIT_CORES"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def progress(total: int):
    """A tqdm bar on stderr when it is a terminal and there is more than one item; else None."""
    if total < 2 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="trace", file=sys.stderr, leave=False)


class Here:
    """This process: the items in a pool of threads (`in_threads`)."""

    def map(self, fn, items: list) -> list:
        bar = progress(len(items))
        try:
            return in_threads(fn, items, bar.update if bar else None)
        finally:
            if bar:
                bar.close()


def in_threads(fn, items: list, done=None) -> list:
    """[fn(item) for item in items], worked on by a pool of threads, as many as the cores
    (polars releases the interpreter in its queries, so one item's analysis runs while another
    is decoded; one item or one core: in turn, here). The first item's error, in the items'
    order, is raised; the work not yet begun is not done (what has begun ends first).
    `done()`: called as each item ends."""
    threads = min(cores(), len(items))
    if threads < 2:
        out = []
        for item in items:
            out.append(fn(item))
            if done:
                done()
        return out
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(fn, item) for item in items]
        if done:
            for future in futures:
                future.add_done_callback(lambda _: done())
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def share_cores(threads: int) -> None:
    """A worker's initializer, run before it imports polars: its thread pool, and the processes
    that decode one large trace (`split.py`), get `threads` cores, and numpy's OpenBLAS as many
    (its threads, one per core otherwise, spin at numpy's import: `start.quiet_blas`)."""
    os.environ.setdefault("POLARS_MAX_THREADS", str(threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
    os.environ["TRACEKIT_CORES"] = str(threads)


def worker_started(threads: int) -> None:
    """A worker's initializer: its share of the cores (`share_cores`), and its end without the
    interpreter's teardown (`ended`) unless coverage measures it (its data is written at exit)."""
    share_cores(threads)
    if "coverage" not in sys.modules:
        atexit.register(ended)


def ended() -> None:
    """A worker's exit handler: the process ends without the interpreter's teardown, which
    frees polars', numpy's and the traces' objects while the command waits (`shutdown` joins
    the workers: 0.05-0.09 s of a command over eight ranks, benchmarks/README.md). The exit
    handlers registered after the worker started run first (the trace cache's writer ends
    its writes); a worker ends only when the pool is shut down, with status 0."""
    without_teardown(0)


def without_teardown(status: int, unflushable: tuple = (OSError, ValueError)) -> None:
    """Standard output and error flushed (an `unflushable` error passed over: a closed pipe,
    what the teardown would meet), then the process ended with `status` at once: no more
    exit handlers, no freeing of every module's objects."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except unflushable:
            pass
    os._exit(status)


class Processes:
    """A pool of `n` fresh interpreters (spawned: polars' threads do not survive a fork), the
    cores shared out among them."""

    def __init__(self, n: int):
        self.n = n

    def map(self, fn, items: list) -> list:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        n = min(self.n, len(items))
        pool = _begun.pop(n, None) or new_pool(n)
        out, bar = [None] * len(items), progress(len(items))
        done = 0
        try:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for future in as_completed(futures):
                out[futures[future]] = future.result()
                done += 1
                if bar:
                    bar.update()
        except BrokenProcessPool:  # a worker ended abruptly: every item not done fails with it
            stop(pool)
            raise WorkerDied(f"a worker process ended abruptly (killed by a signal, or crashed; the out-of-memory "
                             f"killer sends SIGKILL) with {len(items) - done} of {len(items)} items not done: "
                             "--workers 1 does the work in this process, with less memory at once") from None
        except BaseException:  # one item failed (or Ctrl-C): the others are not waited for
            stop(pool)
            raise
        finally:
            if bar:
                bar.close()
        pool.shutdown()
        return out


def new_pool(n: int):
    """A pool of `n` spawned workers, each given its share of the cores (`worker_started`)."""
    import multiprocessing  # here, not at the top: a command run in one process never needs it
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=worker_started,
                               initargs=(max(1, cores() // n),))


_begun: dict = {}  # processes → the pool `begin` started that no `Processes.map` has taken yet


def begin(n: int, modules: tuple[str, ...] = ()) -> None:
    """Start `n` worker processes now, each importing `modules`, for the work the next
    `Processes(n).map` gives: a verb begins them before it imports polars and its analyses, so
    that they are ready when the work comes (eight ranks on the 16-core host waited for their
    workers' imports ~0.3 s after the command's own). `end_unused` stops them if none came."""
    pool = new_pool(n)
    for _ in range(n):  # a spawned pool starts one worker per task waiting
        pool.submit(imported, modules)
    _begun[n] = pool


def imported(modules: tuple[str, ...]) -> None:
    """A begun worker's first task: `modules` imported."""
    import importlib

    for module in modules:
        importlib.import_module(module)


def end_unused() -> None:
    """Stop the workers `begin` started that were given no work (the command ended first)."""
    while _begun:
        stop(_begun.popitem()[1])


def stop(pool) -> None:
    """Cancel the pool's queued work and end the workers running the rest."""
    processes = list((pool._processes or {}).values())  # the executor has no public way to end them
    manager = pool._executor_manager_thread  # it joins the workers too: ended, each is reaped
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join()
    if manager is not None:
        manager.join(timeout=10)


class Cluster:
    """A Dask cluster: the same work as futures on its workers, which must see the traces'
    paths (a shared filesystem, or fsspec URLs)."""

    def __init__(self, address: str):
        try:
            from distributed import Client
        except ImportError:
            raise UsageError("--scheduler needs Dask: pip install 'torch-tracekit[dask]'") from None
        try:
            self.client = Client(address, timeout="10s")
        except OSError as e:
            raise UsageError(f"--scheduler {address}: cannot reach the Dask scheduler ({e})") from None

    def map(self, fn, items: list) -> list:
        """The results, then the connection closed (one map per command)."""
        with self.client:
            futures = self.client.map(fn, items, pure=False)
            bar = progress(len(items))
            try:
                if bar:
                    from distributed import as_completed as completed

                    for _ in completed(futures):
                        bar.update()
                return self.client.gather(futures)
            except BaseException:
                self.client.cancel(futures)
                raise
            finally:
                if bar:
                    bar.close()


def executor(workers: int | None = None, scheduler: str | None = None, items: int = 2):
    """Where to run `items` pieces of work (see the module docstring)."""
    scheduler = scheduler or os.environ.get("TRACEKIT_SCHEDULER")
    if scheduler:
        return Cluster(scheduler)
    return Processes(workers) if workers and workers > 1 and items > 1 else Here()
