"""The trace cache: a loaded trace's tables, kept on disk so that later commands skip decoding.

An entry is a folder named by a hash of the trace's identity — its path (or URL), size,
inode, modification and change times (a URL: its ETag, Last-Modified and the like,
`files.identity`), the classification options (`--comm-kernel`) and `SCHEMA`, the version of
the cached tables and analyses — holding each table as Arrow IPC (zstd, `ipc.write_table`; read
from its bytes, `ipc.table_from`) and `trace.json` (what else a `Trace` holds). The analyses' own intermediate tables (the timeline) go there
too: `Trace.derived` is a `Derived`, which writes each table an analysis keeps in it to the
entry and reads it back in a later command, so an analysis itself does no I/O; a table made
after the trace was named from another one (`naming.named`) is kept under that one's identity
too (`Derived.rebased`), so a table made before naming is never read back after it; a table made
from all of a run's traces (the critical path with the run's collective arrivals) is kept in each
trace's entry under a key naming the run's traces and their entries (`critical_path.run_identity`).
It is written to a temporary folder (`.tmp-…`) and renamed into place, so a reader never
sees half an entry; a temporary folder that a killed process left behind counts as an entry
for `cache info`, `cache clear` and the size bound. An entry that cannot be read (corrupt, from another version) is ignored
and written again, never trusted. The cache is `TRACEKIT_CACHE_DIR`, else the user's cache
folder (`~/.cache/tracekit` on Linux), and is kept under `TRACEKIT_CACHE_MAX_GB` (default 20)
by removing the entries used least recently. `TRACEKIT_NO_CACHE=1` (or `--no-cache`) skips it.

The same folder keeps whole commands' answers (`answers/`, `answers.py`): they count towards the
bound, and `cache info`/`cache clear` show and remove them with the traces. Importing this module
is cheap (no polars, no thread pool: they come with the first table read or written), so that a
kept answer is printed without them.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

from .ipc import table_from, whole, write_table

# polars and the trace model (`pl`, `Trace` in the annotations) are imported where they are used
SCHEMA = 16  # bump when the loaded tables, the analyses' kept tables or their meaning change
TABLES = ("gpu", "calls", "ops", "marks", "steps")
ANSWERS = "answers"  # the folder of the kept answers (`answers.py`), one file each
_writer = None
_starting = threading.Lock()


def writer():
    """The one thread that writes entries, so that writes overlap the analysis; its writes are
    finished before the process exits."""
    global _writer
    with _starting:  # traces loaded by several threads at once (`loading.load_profile`): one writer
        if _writer is None:
            from concurrent.futures import ThreadPoolExecutor

            _writer = ThreadPoolExecutor(max_workers=1)
            atexit.register(_writer.shutdown, wait=True)
    return _writer


class Derived(dict):
    """An analysis' cache on a trace (`Trace.derived`) backed by the trace's cache entry: a
    table (polars DataFrame) kept under a text key is also written to the entry, and a later
    process finds it there; other keys stay in memory."""

    def __init__(self, entry: Path):
        super().__init__()
        self.entry = entry
        self.basis = ""  # what else the tables were built from (`rebased`): part of each file's name

    def _file(self, key: str) -> Path:
        return self.entry / f"derived-{key}{'@' + self.basis if self.basis else ''}.arrow"

    def rebased(self, basis: str) -> None:
        """Forget the tables kept so far: those made from now on are made from the trace and
        `basis` (the naming trace's identity, `naming.named`), and are kept under it."""
        dict.clear(self)
        self.basis = hashlib.sha256(basis.encode()).hexdigest()[:16]

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key):
            return True
        if isinstance(key, str) and self._file(key).exists():
            try:
                dict.__setitem__(self, key, table_from(self._file(key).read_bytes()))
            except Exception:  # unreadable: computed again
                return False
            return True
        return False

    def __getitem__(self, key):
        if key not in self:  # loads it from the entry when it is there
            raise KeyError(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key, value) -> None:
        import polars as pl

        dict.__setitem__(self, key, value)
        if isinstance(key, str) and isinstance(value, pl.DataFrame):
            writer().submit(_write_frame, value, self._file(key))


def _write_frame(frame: pl.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.urandom(16).hex()}")
    try:
        write_table(frame, tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def folder() -> Path:
    if os.environ.get("TRACEKIT_CACHE_DIR"):
        return Path(os.environ["TRACEKIT_CACHE_DIR"])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("tracekit"))


def enabled() -> bool:
    return os.environ.get("TRACEKIT_NO_CACHE", "") in ("", "0")


def key(identity: dict, comm_kernels: tuple[str, ...]) -> str:
    text = json.dumps({**identity, "comm_kernels": list(comm_kernels), "schema": SCHEMA}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read(entry_key: str) -> Trace | None:
    """The cached trace, or None (absent, unreadable, or of another schema). Its tables' bytes
    are read now and each is decoded when first used (`model.StoredTrace`)."""
    from .model import StoredTrace

    entry = folder() / entry_key
    try:
        info = json.loads((entry / "trace.json").read_text())
        if info.pop("schema") != SCHEMA:
            return None
        stored = {name: (entry / f"{name}.arrow").read_bytes() for name in TABLES}
        if not all(whole(b) for b in stored.values()):
            return None
        os.utime(entry / "trace.json")  # recently used
    except Exception:  # a corrupt entry is a miss: it is written again
        return None
    return StoredTrace(stored=stored, **info, derived=Derived(entry))


def write(entry_key: str, trace: Trace) -> None:
    """Store `trace` in the background, and back its `derived` with the entry (the cache
    folder is read now, not when the write runs)."""
    root = folder()
    trace.derived = Derived(root / entry_key)
    writer().submit(_write, root, entry_key, trace)


def _write(root: Path, entry_key: str, trace: Trace) -> None:
    """Store `trace` under `root` (quietly skipped when it cannot be written)."""
    tmp = root / f".tmp-{os.urandom(16).hex()}"
    try:
        tmp.mkdir(parents=True)
        for name in TABLES:
            write_table(getattr(trace, name), tmp / f"{name}.arrow")
        info = {"path": trace.path, "rank": trace.rank, "world_size": trace.world_size, "meta": trace.meta,
                "origin_us": trace.origin_us, "facts": trace.facts, "schema": SCHEMA}
        (tmp / "trace.json").write_text(json.dumps(info))
        target = root / entry_key
        if target.exists():  # unreadable or of another schema: replaced whole
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except OSError:
        return
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    evict(root)


def entries(root: Path | None = None) -> list[tuple[Path, int, float]]:
    """(path, bytes, last use) of every trace entry (a folder), of every unfinished write
    (`.tmp-…`, last use: its folder's time) and of every kept answer (a file in `answers/`)."""
    root = root or folder()
    out = []
    for entry in root.glob("*"):
        if entry.name == ANSWERS or not (entry.name[:1] in "0123456789abcdef" or entry.name.startswith(".tmp-")) \
                or not entry.is_dir():
            continue
        try:
            size = sum(f.stat().st_size for f in entry.iterdir())
            used = entry / "trace.json" if (entry / "trace.json").exists() else entry
            out.append((entry, size, used.stat().st_mtime))
        except OSError:
            continue
    for answer in (root / ANSWERS).glob("*"):
        try:
            stat = answer.stat()
        except OSError:
            continue
        out.append((answer, stat.st_size, stat.st_mtime))
    return out


def remove(entry: Path) -> None:
    """Remove an entry: a trace's folder, or an answer's file."""
    if entry.is_dir():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def is_answer(entry: Path) -> bool:
    return entry.parent.name == ANSWERS


def evict(root: Path | None = None) -> None:
    """Remove the least recently used entries until the cache is under its bound."""
    limit = float(os.environ.get("TRACEKIT_CACHE_MAX_GB", "20")) * 1e9
    current = entries(root)
    total = sum(size for _, size, _ in current)
    for entry, size, _ in sorted(current, key=lambda e: e[2]):
        if total <= limit:
            break
        remove(entry)
        total -= size


def info() -> dict:
    current = entries()
    traces = [e for e, _, _ in current if not is_answer(e)]
    return {"folder": str(folder()), "entries": len(traces),
            "unfinished": sum(e.name.startswith(".tmp-") for e in traces),
            "answers": len(current) - len(traces),
            "bytes": sum(s for _, s, _ in current),
            "max_bytes": int(float(os.environ.get("TRACEKIT_CACHE_MAX_GB", "20")) * 1e9)}


def clear() -> tuple[int, int]:
    """Remove every entry: (how many traces, how many answers) there were."""
    current = [e for e, _, _ in entries()]
    for entry in current:
        remove(entry)
    answers = sum(map(is_answer, current))
    return len(current) - answers, answers
