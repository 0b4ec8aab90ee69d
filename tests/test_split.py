"""Decoding one trace in pieces by several processes (tracekit/core/split.py) gives exactly what
one process gives: every table, the metadata and the facts, on every trace in tests/data and
in the shared traces beside the checkout (../shared, where there is one) — the parallel path
forced on these small files by a zero threshold, and every piece but the last decoded by a
worker process."""

import gzip
import json
import threading
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import polars as pl
import pytest
from conftest import DATA
from synth import doc, launched, op, step

from tracekit.core import loading, split
from tracekit.core.errors import TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared"  # ../shared of the checkout
ROOTS = [DATA] + [SHARED] * SHARED.is_dir()
TRACES = sorted(p for root in ROOTS for p in root.rglob("*.json*")
                if p.name not in ("manifest.json",) and "truth" not in p.name)


def where(path) -> str:
    """The trace's path below its root, named by the root."""
    root = next(r for r in ROOTS if path.is_relative_to(r))
    return f"{root.name}/{path.relative_to(root)}"


def tables(trace):
    return [trace.gpu, trace.calls, trace.ops, trace.marks, trace.steps]


def loaded(path, parallel: str | None, monkeypatch):
    """The traces of `path` (or the error's text), decoded with the parallel path forced, in
    `threads` of this process (where the native decoder reads the pieces) or in `processes`,
    or in one process (None); and whether that parallel path ran."""
    with monkeypatch.context() as patch:
        patch.setattr(loading, "PARALLEL_BYTES", 0 if parallel else 1 << 62)
        patch.setattr(loading, "THREADED_BYTES", 0 if parallel else 1 << 62)
        patch.setattr(loading, "cores", lambda: 3)  # two workers, also on a one-core machine
        patch.setattr(split, "HERE", False)  # every piece but the last one by a worker
        patch.setattr(split, "MIN_PIECE", 4096)  # several pieces of these small files
        patch.setattr(split, "KEEP_SERVER", True)  # one fork server for these many decodes
        patch.setattr(loading.native, "available", lambda: parallel == "threads")
        taken = []
        for way in ("decoded", "threaded"):
            real = getattr(split, way)
            patch.setattr(split, way, lambda *a, real=real, **k: taken.append(1) or real(*a, **k))
        try:
            out = loading.decode(path, ())
        except TraceError as e:
            out = str(e)
    return out, bool(taken)


def test_the_traces_here_are_many_and_one_event_per_line():
    assert len(TRACES) > 40
    assert sum(b"\n" in gzip.open(p).read(4096) if p.suffix == ".gz" else b"\n" in p.read_bytes()[:4096]
               for p in TRACES) > 40


@pytest.mark.parametrize("path", TRACES, ids=where)
def test_parallel_equals_one_process(path, monkeypatch):
    cut_three_ways(path, monkeypatch)


def cut_three_ways(path, monkeypatch):
    """`path` decoded in one process (its traces, or the error's text), after checking that
    threads and processes give the same."""
    serial, _ = loaded(path, None, monkeypatch)
    for way in ("threads", "processes"):
        assert_same(*loaded(path, way, monkeypatch), serial)
    return serial


def assert_same(parallel, forced: bool, serial) -> None:
    assert forced
    if isinstance(serial, str):
        assert parallel == serial
        return
    assert len(parallel) == len(serial)
    for a, b in zip(parallel, serial):
        for x, y in zip(tables(a), tables(b)):
            assert x.equals(y), (x, y)
        assert (a.meta, a.facts, a.rank, a.origin_us) == (b.meta, b.facts, b.rank, b.origin_us)


@pytest.mark.parametrize("path", TRACES, ids=where)
def test_the_engine_of_the_loaders_queries_changes_no_table(path, monkeypatch):
    """A large trace's tables are made on polars' default engine, a small one's in memory
    (`loading.IN_MEMORY_ROWS`): on every trace here both give the same tables."""
    def decoded():
        try:
            return loading.decode(path, ())
        except TraceError as e:
            return str(e)

    in_memory = decoded()
    monkeypatch.setattr(loading, "IN_MEMORY_ROWS", 0)
    assert_same(decoded(), True, in_memory)


def kineto(events) -> bytes:
    """One event per line as Kineto writes it."""
    return json.dumps(doc(events), indent=2).encode()


def test_pieces_are_whole_events_in_order(tmp_path, monkeypatch):
    """Every range is a JSON array of whole events once bracketed, and together with the last
    events they are the file's events in order; the pieces shrink toward the end."""
    monkeypatch.setattr(split, "MIN_PIECE", 256)
    events = [step(1, 0, 10_000)] + [e for i in range(200) for e in launched(f"k{i}", 10 + 40 * i, 20 + 40 * i, 5, i + 1)]
    path = tmp_path / "t.json"
    path.write_bytes(kineto(events))
    ranges, last, metadata = split.pieces(str(path), 2)
    assert len(ranges) > 10
    sizes = [end - start for start, end in ranges]
    assert sizes[0] > 4 * sizes[-2]
    got = [e for where in ranges for e in json.loads(split.piece_text(str(path), where))] + json.loads(last)
    assert got == json.loads(path.read_bytes())["traceEvents"]
    assert json.loads(metadata) == {**json.loads(path.read_bytes()), "traceEvents": []}


def test_text_that_is_not_utf8_is_replaced_and_counted_however_the_file_is_cut(tmp_path, monkeypatch):
    """Every fifth kernel's name holds a byte that is no UTF-8 (0xff), the others a U+FFFD of
    their own: each bad byte becomes U+FFFD and is counted once, in pieces by threads or by
    processes as in one process."""
    events = [step(1, 0, 20_000)] + [e for i in range(300) for e in launched(f"k{i}\ufffd", 10 + 40 * i, 20 + 40 * i, 5, i + 1)]
    text = kineto(events).replace(b"\\ufffd", "\ufffd".encode())
    for i in range(0, 300, 5):
        text = text.replace(f'"k{i}\ufffd"'.encode(), f'"k{i}\xff"'.encode("latin-1"))
    path = tmp_path / "t.json"
    path.write_bytes(text)
    serial = cut_three_ways(path, monkeypatch)
    (trace,) = serial
    assert trace.facts["replaced_text"] == 60
    assert trace.gpu["name"].str.ends_with("\ufffd").all()


def test_the_old_spelling_of_external_id_is_read_however_the_file_is_cut(tmp_path, monkeypatch):
    """`external id` (PyTorch 1.8–1.10) is the External id wherever it is written: also in pieces
    and chunks that hold none of the old category names, which only the file's last event has."""
    monkeypatch.setattr(loading, "CHUNK", 20)
    events = [step(1, 0, 20_000)] + [e for i in range(300) for e in launched(f"k{i}", 10 + 40 * i, 20 + 40 * i, 5, i + 1)]
    for i, e in enumerate(events[1:]):
        del e["args"]["External id"]
        e["args"]["external id"] = 1000 + i // 2
    events.append({"ph": "X", "cat": "Runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1, "ts": 19_000,
                   "dur": 1, "args": {"correlation": 9999, "external id": 5}})
    path = tmp_path / "t.json"
    path.write_bytes(kineto(events))
    serial = cut_three_ways(path, monkeypatch)
    (trace,) = serial
    assert trace.calls.sort("start")["ext_id"].to_list() == [*range(1000, 1300), 5]
    assert trace.facts["schema"] == "kineto 2021 (PyTorch 1.8-1.10)"


def test_a_timestamps_ns_do_not_depend_on_how_the_file_was_cut(tmp_path, monkeypatch):
    """Found by a review: a lenient event (roctracer's `"bytes": "1"`) made its chunk's every
    ts read from the text, and one large negative ts moved the rounding base of the rows
    decoded with it, so that threads, processes and one process, cutting the file apart
    differently, gave ns 1 apart. Each ts is now read alone: from its double below 2^43 µs
    (the double's value × 1000, rounded: Python's Decimal is the oracle), from its text above."""
    texts = ["100.0005", "-4398046511104", "2.0005", "7.1235", "1712195495519689.047", "3"] * 60
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": f"T{i}", "dur": 1,
               "args": {"bytes": "1"} if i % 97 == 0 else {}} for i in range(len(texts))]
    text = kineto(events).decode()
    for i, ts in sorted(enumerate(texts), reverse=True):  # op10 before op1
        text = text.replace(f'"T{i}"', ts)
    path = tmp_path / "t.json"
    path.write_text(text)
    serial = cut_three_ways(path, monkeypatch)
    (trace,) = serial
    ns = dict(trace.ops.select("name", pl.col("start") + trace.origin_us * 1000).iter_rows())
    for i, ts in enumerate(texts):
        value = Decimal(ts) if abs(float(ts)) >= 2 ** 43 else Decimal(float(ts))
        assert ns[f"op{i}"] == int((value * 1000).to_integral_value(ROUND_HALF_UP)), ts


def test_a_compact_file_is_not_split(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc([step(1, 0, 100), op("aten::mm", 1, 5)])))
    with pytest.raises(split.Unsplittable):
        split.pieces(str(path), 4)


@pytest.mark.parametrize("cores, threads", [(2, 2), (8, 8), (16, 8), (64, 8)])
def test_the_native_decode_takes_a_thread_per_core_up_to_its_bound(tmp_path, monkeypatch, cores, threads):
    """The threads that decode one file's pieces: one per core, at most `DECODE_THREADS` (more
    only contend for memory: 8 on the 16-core host), and the file's events all read."""
    path = tmp_path / "t.json"
    path.write_bytes(kineto([step(1, 0, 10_000)] + [op(f"op{i}", 10 + i, 1) for i in range(300)]))
    given = []
    real = split.threaded
    monkeypatch.setattr(loading, "THREADED_BYTES", 0)
    monkeypatch.setattr(loading, "cores", lambda: cores)
    monkeypatch.setattr(loading.native, "available", lambda: True)  # the threads' path, whatever TRACEKIT_NATIVE says
    monkeypatch.setattr(split, "MIN_PIECE", 4096)  # several pieces of this small file
    monkeypatch.setattr(split, "threaded", lambda text, fn, n, **k: given.append(n) or real(text, fn, n, **k))
    (trace,) = loading.decode(path, ())
    assert given == [threads]
    assert trace.ops.height == 301


def test_a_piece_that_fails_in_a_worker_gives_the_one_process_answer(tmp_path, monkeypatch):
    """A broken event in the middle: the worker's piece fails, and the file is read as one
    process reads it, which names what is wrong."""
    events = [step(1, 0, 10_000)] + [op(f"op{i}", 10 + i, 1) for i in range(300)]
    text = kineto(events).replace(b'"name": "op150"', b'"name": op150')
    path = tmp_path / "t.json"
    path.write_bytes(text)
    for way in ("threads", "processes"):
        assert loaded(path, way, monkeypatch)[0] == loaded(path, None, monkeypatch)[0]
        assert "not valid JSON" in loaded(path, way, monkeypatch)[0]


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_the_helpers_a_decode_starts_are_stopped_after_it(tmp_path, monkeypatch):
    """The fork server and the resource tracker that a parallel decode starts do not outlive
    it (an interpreter holding polars), also when a piece fails; their semaphores are freed
    before the tracker stops (no warning of a semaphore unlinked twice)."""
    from multiprocessing import forkserver, resource_tracker

    forkserver._forkserver._stop()
    resource_tracker._resource_tracker._stop()
    events = [step(1, 0, 10_000)] + [op(f"op{i}", 10 + i, 1) for i in range(300)]
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_bytes(kineto(events))
    bad.write_bytes(kineto(events).replace(b'"name": "op150"', b'"name": op150'))
    monkeypatch.setattr(split, "HERE", False)
    monkeypatch.setattr(split, "MIN_PIECE", 4096)
    for path, fails in ((good, False), (bad, True)):
        try:
            results, _ = split.decoded(str(path), loading.piece_tables, 2, unpack=loading.piece_frames)
            assert not fails and len(results) > 2
        except split.Failed:
            assert fails
        split.stopping.join()
        assert forkserver._forkserver._forkserver_pid is None
        assert resource_tracker._resource_tracker._fd is None
        import gc
        gc.collect()


def test_a_worker_still_starting_when_the_caller_has_every_piece_is_waited_for(tmp_path, monkeypatch, capfd):
    """The caller decodes a small file before the fork server is up: the worker whose start
    was under way then is waited for before the decode's semaphores go, so that it starts,
    finds no piece and ends, rather than failing to read them (a traceback on stderr)."""
    from multiprocessing import forkserver, resource_tracker

    forkserver._forkserver._stop()
    resource_tracker._resource_tracker._stop()
    events = [step(1, 0, 10_000)] + [op(f"op{i}", 10 + i, 1) for i in range(300)]
    path = tmp_path / "t.json"
    path.write_bytes(kineto(events))
    monkeypatch.setattr(split, "MIN_PIECE", 4096)
    monkeypatch.setattr(split, "KEEP_SERVER", True)  # the tracker outlives `seen`'s semaphores
    seen = []
    start = split._start
    monkeypatch.setattr(split, "_start", lambda *a: seen.append((threading.current_thread(), a[0])) or start(*a))
    results, _ = split.decoded(str(path), loading.piece_tables, 2, unpack=loading.piece_frames)
    (starter, processes), = seen
    assert len(results) > 2 and not starter.is_alive()
    assert all(p.exitcode == 0 for p in processes if p.pid is not None)  # each one started ended well
    assert "Traceback" not in capfd.readouterr().err


def decoding_script(folder: Path, script: Path, before: str = "") -> Path:
    """A small trace in `folder` and `script` (its code after `before`) that loads it in worker
    processes alone (no piece here, the fallback to one process disabled) and prints its ops."""
    events = [step(1, 0, 10_000)] + [op(f"op{i}", 10 + i, 1) for i in range(300)]
    trace = folder / "t.json"
    trace.write_bytes(kineto(events))
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        before + "import os\nos.environ['TRACEKIT_NATIVE'] = '0'  # the pieces in processes\n"
        "from tracekit.core import loading, split\n"
        "loading.PARALLEL_BYTES, loading.cores, split.HERE, split.MIN_PIECE = 0, lambda: 3, False, 4096\n"
        "loading.streamed = None  # the fallback to one process would fail\n"
        f"print(loading.load({str(trace)!r}, cache=False).ops.height)\n")
    return script


def test_a_script_without_a_main_guard_is_not_run_again_by_the_workers(tmp_path):
    """`python script.py` that loads a large trace at its top level, with no `if __name__ ==
    "__main__":` guard: multiprocessing would re-run the script in each worker (its top-level
    code twice or more, a traceback on stderr, the decode falling back to one process). The
    workers run only their pieces: the script's line is printed once, and the pieces were
    decoded by a worker, not by the fallback."""
    import subprocess
    import sys

    script = decoding_script(tmp_path, tmp_path / "script.py", before="print('top-level code ran')\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["top-level code ran", "301", ""]
    assert "Traceback" not in out.stderr


def test_the_workers_do_not_import_modules_of_the_current_folder(tmp_path):
    """A command run from a folder that holds a module of the name tracekit or polars imports
    (a second checkout's `tracekit/`, a user's `polars.py`): the fork server is a `-c`
    interpreter, whose path starts with the current folder, so it would import that module
    (running its code) where the command itself never does. Nothing of the folder is run."""
    import subprocess
    import sys

    here = tmp_path / "work"
    (here / "tracekit").mkdir(parents=True)
    marker = tmp_path / "imported"
    (here / "tracekit" / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\n")
    # like a console script: its own folder first on its path, not the current one
    script = decoding_script(tmp_path, tmp_path / "bin" / "script.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=here)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "301\n"
    assert not marker.exists()
