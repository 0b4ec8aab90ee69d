"""The --workers default: processes only for traces that are not in the cache; what a worker
and the command set for the threads of the libraries they load."""

import os

from conftest import DATA

from tracekit.core import cache, files, runs

FILES = [str(DATA / "h200x2-blocks4" / "fsdp2" / f"rank{r}.pt.trace.json.gz") for r in (0, 1)]


def test_one_worker_per_share_of_uncached_bytes_none_when_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "folder", lambda: tmp_path)
    monkeypatch.setattr(runs, "cores", lambda: 8)
    size = files.identity(FILES[0])["size"]
    monkeypatch.setattr(runs, "PARALLEL_BYTES", size)
    assert runs.default_workers(FILES, (), None) == 2  # two files, two shares: one each
    monkeypatch.setattr(runs, "PARALLEL_BYTES", 10 * size)
    assert runs.default_workers(FILES, (), None) == 1  # too little to pay for a process
    monkeypatch.setattr(runs, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(runs, "cores", lambda: 1)
    assert runs.default_workers(FILES, (), None) == 1  # at most one per core
    monkeypatch.setattr(runs, "cores", lambda: 8)
    entry = tmp_path / cache.key(files.identity(FILES[0]), ())
    entry.mkdir()
    (entry / "trace.json").write_text("{}")
    assert runs.default_workers(FILES, (), None) == 1  # one file left to decode
    assert runs.default_workers(FILES, (), False) == 2  # --no-cache: both


def test_numpys_blas_threads_are_one_unless_a_model_runs_or_the_user_chose(monkeypatch):
    """At numpy's import each OpenBLAS thread spins before it sleeps (2 CPU-s per process on 16
    cores): an analysis command keeps it to one thread, a worker to its share of the cores;
    `profile` (torch's threads) and a user's own setting are left alone."""
    from tracekit.core.executor import share_cores
    from tracekit.front import start

    for name in ("OPENBLAS_NUM_THREADS", "POLARS_MAX_THREADS", "TRACEKIT_CORES"):
        monkeypatch.setenv(name, "")  # each restored after the test
    for argv, before, after in ((["tracekit", "summary", "t.json"], None, "1"), (["tracekit", "profile"], None, None),
                                (["tracekit", "capacity"], None, None), (["tracekit", "report"], "4", "4")):
        monkeypatch.setattr("sys.argv", argv)
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
        if before:
            monkeypatch.setenv("OPENBLAS_NUM_THREADS", before)
        start.quiet_blas()
        assert os.environ.get("OPENBLAS_NUM_THREADS") == after, argv
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    share_cores(3)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "3"
