"""The trace cache: a loaded trace's tables, kept on disk so that later commands skip decoding.

An entry is a folder named by a hash of the trace's identity — its path (or URL), size, inode,
modification and change times (a URL: its ETag, Last-Modified and the like, `files.identity`),
the classification options (`--comm-kernel`), the decoder that made it (`decoder`: the native
one or msgspec's) and the code that made its tables (`fingerprint`: a hash of every file of the
core, the native extension among them, and of the analyses, whose tables are kept too), so that
no entry made by other code is ever read (no number to bump by hand). It holds each table as
Arrow IPC (zstd, `ipc.write_table`; read from its bytes, `ipc.table_from`) and `trace.json`
(what else a `Trace` holds, and each table's CRC-32). The analyses' own intermediate tables (the
timeline) go there too: `Trace.derived` is a `Derived`, which writes each table an analysis
keeps in it to the entry and reads it back in a later command, so an analysis itself does no
I/O; a table made after the trace was named from another one (`naming.named`) is kept under that
one's identity too (`Derived.rebased`), so a table made before naming is never read back after
it; a table made from all of a run's traces (the critical path with the run's collective
arrivals) is kept in each trace's entry under a key naming the run's traces and their entries
(`critical_path.run_identity`). It is written to a temporary folder (`.tmp-…`) and renamed into
place, so a reader never sees half an entry; a temporary folder that a killed process left
behind counts as an entry for `cache info`, `cache clear` and the size bound. Every file proves
itself: `trace.json` and each derived table end with the CRC-32 of what precedes it (`sealed`),
and `trace.json` holds each table's; a file whose bytes do not match (a flipped bit, a truncated
write) is a miss — the entry is written again, a derived table made again — never an answer. The
cache is `TRACEKIT_CACHE_DIR`, else the user's cache folder (`~/.cache/tracekit` on Linux), and
is kept under `TRACEKIT_CACHE_MAX_GB` (default 20) by removing the entries used least recently.
`TRACEKIT_NO_CACHE=1` (or `--no-cache`) skips it.

The same folder keeps whole commands' answers (`answers/`, `answers.py`): they count towards the
bound, and `cache info`/`cache clear` show and remove them with the traces. Importing this module
is cheap (no polars, no thread pool: they come with the first table read or written), so that a
kept answer is printed without them.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import threading
import zlib
from pathlib import Path

from .ipc import table_from, write_table

# polars and the trace model (`pl`, `Trace` in the annotations) are imported where they are used
CODE = ("tracekit.core", "tracekit.analyses")  # the packages whose code makes an entry's tables
LIBRARIES = ("polars", "msgspec", "numpy")  # and the libraries it makes them with (their versions)
TABLES = ("gpu", "calls", "ops", "marks", "steps")
SEAL = b"\n#crc32 "  # `sealed`: the bytes, this, the CRC-32 of the bytes in 8 hex digits
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

    def _stored(self, key: str):
        """The table kept under `key` in the entry, or None (none, or corrupt: removed)."""
        try:
            stored = opened(self._file(key).read_bytes(), named(self._file(key)))
            if stored is not None:
                return table_from(stored)
        except Exception:  # unreadable: made again
            pass
        self._file(key).unlink(missing_ok=True)
        return None

    def rebased(self, basis: str) -> None:
        """Forget the tables kept so far: those made from now on are made from the trace and
        `basis` (the naming trace's identity, `naming.named`), and are kept under it."""
        dict.clear(self)
        self.basis = hashlib.sha256(basis.encode()).hexdigest()[:16]

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key):
            return True
        if isinstance(key, str) and self._file(key).exists():
            table = self._stored(key)
            if table is not None:
                dict.__setitem__(self, key, table)
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
        seal(tmp, named(path))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def crc(data, name: str = "") -> str:
    """The CRC-32 of `name` then `data` (bytes-like) in 8 hex digits."""
    return f"{zlib.crc32(data, zlib.crc32(name.encode())):08x}"


def named(path: Path) -> str:
    """What a sealed file's check is bound to: its folder's and its own name (an entry's key,
    `answers`), so that a whole file copied to another place of the cache fails it."""
    return f"{path.parent.name}/{path.name}"


def sealed(data: bytes, name: str) -> bytes:
    """`data` followed by the CRC-32 of `name` and it (`SEAL`), which `opened` checks: the
    file's place (`named`) is part of what proves it."""
    return data + SEAL + crc(data, name).encode()


def seal(path: Path, name: str) -> None:
    """The file at `path` `sealed` in place under `name`."""
    check = crc(path.read_bytes(), name)
    with open(path, "ab") as f:
        f.write(SEAL + check.encode())


def opened(stored: bytes, name: str) -> bytes | None:
    """The bytes `sealed` sealed under `name`, or None where `stored` does not end with their
    CRC-32 (another file's, a file's of another place, or none)."""
    data, seal, check = stored[:-8 - len(SEAL)], stored[-8 - len(SEAL):-8], stored[-8:]
    return data if seal == SEAL and check == crc(data, name).encode() else None


def folder() -> Path:
    if os.environ.get("TRACEKIT_CACHE_DIR"):
        return Path(os.environ["TRACEKIT_CACHE_DIR"])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("tracekit"))


def enabled() -> bool:
    return os.environ.get("TRACEKIT_NO_CACHE", "") in ("", "0")


def key(identity: dict, comm_kernels: tuple[str, ...]) -> str:
    """The entry of the trace of this identity, read with these extra communication kernels
    by this decoder and this code."""
    text = json.dumps({**identity, "comm_kernels": list(comm_kernels), "decoder": decoder(),
                       "code": fingerprint()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def decoder() -> str:
    """The decoder that makes a trace's tables here: "native" where the extension is built and
    not turned off (`native.available`, told without importing polars), else "msgspec"."""
    built = importlib.util.find_spec("tracekit.core._columns") is not None
    return "native" if built and os.environ.get("TRACEKIT_NATIVE", "1") != "0" else "msgspec"


@functools.cache
def fingerprint() -> str:
    """A hash of the code that makes an entry's tables: the name and bytes of every file of
    the `CODE` packages (compiled bytecode aside), found by path, not imported, and the
    versions of the `LIBRARIES` it makes them with."""
    digest = hashlib.sha256()
    for package, root in code_folders().items():
        for path in source_files(root):
            digest.update(f"{package}/{path.relative_to(root)}\0".encode())
            try:
                digest.update(path.read_bytes())
            except OSError:  # a dangling link (an editor's lock file), a file gone meanwhile: its name alone
                digest.update(b"\0unreadable")
    for name in LIBRARIES:  # what decodes and shapes the tables: their versions, not imported
        digest.update(f"{name} {library_version(name)}\0".encode())
    return digest.hexdigest()[:32]


def library_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def code_folders() -> dict[str, Path]:
    """Each `CODE` package's folder."""
    return {package: Path(importlib.util.find_spec(package).submodule_search_locations[0]) for package in CODE}


def source_files(folder: Path) -> list[Path]:
    """Every file under `folder`, in order, `__pycache__` aside."""
    found = []
    for entry in os.scandir(folder):
        if entry.is_dir():
            if entry.name != "__pycache__":
                found += source_files(Path(entry.path))
        else:
            found.append(Path(entry.path))
    return sorted(found)


def read(entry_key: str) -> Trace | None:
    """The cached trace, or None (absent, or a file of it corrupt: `opened`, the tables' CRC-32
    in `trace.json`). Its tables' bytes are read and checked now and each is decoded when first
    used (`model.StoredTrace`)."""
    from .model import StoredTrace

    entry = folder() / entry_key
    try:
        text = opened((entry / "trace.json").read_bytes(), named(entry / "trace.json"))
        if text is None:
            return None
        info = json.loads(text)
        sums = info.pop("crc32")
        stored = {name: (entry / f"{name}.arrow").read_bytes() for name in TABLES}
        if any(crc(stored[name]) != sums[name] for name in TABLES):
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
        sums = {}
        for name in TABLES:
            write_table(getattr(trace, name), tmp / f"{name}.arrow")
            sums[name] = crc((tmp / f"{name}.arrow").read_bytes())
        info = {"path": trace.path, "rank": trace.rank, "world_size": trace.world_size, "meta": trace.meta,
                "origin_us": trace.origin_us, "facts": trace.facts, "crc32": sums}
        target = root / entry_key
        (tmp / "trace.json").write_bytes(sealed(json.dumps(info).encode(), named(target / "trace.json")))
        if target.exists():  # corrupt: replaced whole
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
