"""The --workers default: processes only for traces that are not in the cache; a verb's workers
begun before it imports polars; what a worker and the command set for the threads of the
libraries they load."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import DATA

from tracekit.core import cache, executor, files, jobs

FILES = [str(DATA / "h200x2-blocks4" / "fsdp2" / f"rank{r}.pt.trace.json.gz") for r in (0, 1)]


def test_one_worker_per_share_of_uncached_bytes_none_when_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "folder", lambda: tmp_path)
    monkeypatch.setattr(jobs, "cores", lambda: 8)
    size = files.identity(FILES[0])["size"]
    monkeypatch.setattr(jobs, "PARALLEL_BYTES", size)
    assert jobs.default_workers(FILES, (), None) == 2  # two files, two shares: one each
    monkeypatch.setattr(jobs, "PARALLEL_BYTES", 10 * size)
    assert jobs.default_workers(FILES, (), None) == 1  # too little to pay for a process
    monkeypatch.setattr(jobs, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(jobs, "cores", lambda: 1)
    assert jobs.default_workers(FILES, (), None) == 1  # at most one per core
    monkeypatch.setattr(jobs, "cores", lambda: 8)
    entry = tmp_path / cache.key(files.identity(FILES[0]), ())
    entry.mkdir()
    (entry / "trace.json").write_text("{}")
    assert jobs.default_workers(FILES, (), None) == 1  # one file left to decode
    assert jobs.default_workers(FILES, (), False) == 2  # --no-cache: both


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


def test_a_bad_TRACEKIT_WORKERS_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """Not a whole number of 1 or more (`²` is a digit to Python but no number): one line on
    stderr, exit 2; a number is at most one process per file, and --workers wins."""
    for bad in ("many", "0", "-1", "²"):
        out = subprocess.run([sys.executable, "-m", "tracekit", "summary", FILES[0]], capture_output=True, text=True,
                             env={**os.environ, "TRACEKIT_WORKERS": bad, "TRACEKIT_NO_CACHE": "1"}, cwd=tmp_path)
        assert (out.returncode, out.stdout) == (2, ""), bad
        assert out.stderr == f"tracekit: TRACEKIT_WORKERS={bad}: a number of processes, 1 or more\n"
    monkeypatch.setenv("TRACEKIT_WORKERS", "3")
    assert jobs.processes(FILES, None, (), None) == 2
    assert jobs.processes(FILES, 1, (), None) == 1


WATCHED = """
import json, sys
from tracekit.core import executor
seen = {"begun": [], "pools": 0}
begin, new_pool = executor.begin, executor.new_pool
def watched_begin(n, modules):
    seen["begun"].append([n, "polars" in sys.modules])
    begin(n, modules)
def counted_pool(n):
    seen["pools"] += 1
    return new_pool(n)
if __name__ == "__main__":  # the workers are spawned: they import this script again
    executor.begin, executor.new_pool = watched_begin, counted_pool
    from tracekit.front.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit:
        print(json.dumps(seen), file=sys.stderr)
        raise
"""


def test_a_verb_begins_its_workers_before_it_imports_polars_and_gives_them_the_work(tmp_path):
    """`summary --workers 2` over two ranks: the two worker processes are started (one pool)
    while polars is not yet imported in the command, and the pool started then is the one
    that reads the traces (no second pool); the answer is the one the command gives in one
    process."""
    run = DATA / "h200x2-blocks4" / "fsdp2"
    env = {**os.environ, "TRACEKIT_NO_CACHE": "1"}
    script = tmp_path / "watched.py"
    script.write_text(WATCHED)
    two = subprocess.run([sys.executable, str(script), "summary", "--format", "json", "--workers", "2", str(run)],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    seen = json.loads(two.stderr.strip().splitlines()[-1])
    assert seen == {"begun": [[2, False]], "pools": 1}
    one = subprocess.run([sys.executable, str(script), "summary", "--format", "json", "--workers", "1", str(run)],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert json.loads(one.stderr.strip().splitlines()[-1]) == {"begun": [], "pools": 0}
    assert json.loads(two.stdout) == json.loads(one.stdout)


def test_workers_begun_for_no_work_are_stopped():
    executor.begin(2)
    pool = executor._begun[2]
    workers = list(pool._processes.values())
    assert len(workers) == 2
    executor.end_unused()
    assert executor._begun == {} and not any(w.is_alive() for w in workers)


DYING = """
import os, signal, sys
if __name__ == "__mp_main__":  # a spawned worker imports this script again: it dies before any work
    os.kill(os.getpid(), signal.SIGKILL)
if __name__ == "__main__":
    from tracekit.front.cli import main
    main(sys.argv[1:])
"""


def test_a_worker_that_dies_is_one_line_and_exit_1(tmp_path):
    """A worker killed (SIGKILL, as the out-of-memory killer sends it) before it was given any
    work: one line saying so and how to go on, exit 1, no traceback (before: BrokenProcessPool's
    traceback); nothing on stdout."""
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    out = subprocess.run([sys.executable, str(script), "summary", "--workers", "2", str(DATA / "h200x2-blocks4" / "fsdp2")],
                         capture_output=True, text=True, env={**os.environ, "TRACEKIT_NO_CACHE": "1"}, timeout=120,
                         cwd=tmp_path)
    assert (out.returncode, out.stdout) == (1, ""), out.stderr
    assert out.stderr == ("tracekit: a worker process ended abruptly (killed by a signal, or crashed; the "
                          "out-of-memory killer sends SIGKILL) with 2 of 2 items not done: --workers 1 does the work "
                          "in this process, with less memory at once\n")


def test_the_cache_entries_workers_write_are_whole_when_they_end(tmp_path):
    """A worker ends by `executor.ended` (no interpreter teardown) only after the exit
    handlers registered while it worked, the trace cache's writer among them: `summary
    --workers 2` into an empty cache leaves both ranks' entries whole (read back without a
    worker, they give the figures a fresh decode gives)."""
    run = tmp_path / "run"
    run.mkdir()
    for f in FILES:
        (run / os.path.basename(f)).write_bytes(Path(f).read_bytes())
    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TRACEKIT_NO_CACHE", None)
    args = [sys.executable, "-m", "tracekit", "summary", "--format", "json", str(run)]
    first = subprocess.run([*args, "--workers", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir() if (p / "trace.json").is_file())
    assert entries == sorted(cache.key(files.identity(str(run / os.path.basename(f))), ()) for f in FILES)
    again = subprocess.run([*args, "--workers", "1", "--rank", "0"], capture_output=True, text=True, env=env,
                           timeout=120)
    fresh = subprocess.run([*args, "--workers", "1", "--rank", "0", "--no-cache"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert again.returncode == fresh.returncode == 0, again.stderr + fresh.stderr
    assert json.loads(again.stdout) == json.loads(fresh.stdout)


def test_a_worker_runs_the_exit_handlers_its_work_registered_and_exits_0(tmp_path):
    """`ended` is the first handler a worker registers, so it runs last: a handler the work
    registered (as the cache writer does) runs before it; the worker's status is 0."""
    marker = tmp_path / "handler-ran"
    pool = executor.new_pool(1)
    pool.submit(exec, f"import atexit; atexit.register(open, {str(marker)!r}, 'w')").result()
    workers = list(pool._processes.values())
    pool.shutdown()
    assert marker.exists() and [w.exitcode for w in workers] == [0]
