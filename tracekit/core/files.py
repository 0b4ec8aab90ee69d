"""Where traces are read from: local paths, or fsspec URLs (`s3://…` with s3fs installed,
`gs://…`, `http(s)://…`, `memory://…`) for every verb. Locations stay strings, so that a URL
is never mangled by `pathlib`. `.gz` files are gunzipped with ISA-L (`isal`), about 1.6×
faster than zlib. Which files of a folder are read: its traces, of a worker's several
profiling cycles the one `--cycle` names by the time stamp in its file name (`cycles_by_name`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import TraceError

TRACE_SUFFIXES = (".json", ".json.gz")


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors and tools put first


def is_url(location) -> bool:
    return "://" in str(location)


def _fs(location: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as e:
        raise TraceError(location, f"cannot open this URL: {e}") from None


def exists(location) -> bool:
    if not is_url(location):
        return Path(location).exists()
    fs, path = _fs(str(location))
    return fs.exists(path)


def is_dir(location) -> bool:
    if not is_url(location):
        return Path(location).is_dir()
    fs, path = _fs(str(location))
    return fs.isdir(path)


def name(location) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def trace_files(location) -> list[str]:
    """`location` itself, or the `.json`/`.json.gz` files directly in the directory `location`."""
    if not is_dir(location):
        return [str(location)]
    if not is_url(location):
        return sorted(str(p) for p in Path(location).iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    fs, path = _fs(str(location))
    protocol = str(location).split("://", 1)[0]
    found = [e["name"] for e in fs.ls(path, detail=True) if e["type"] == "file" and e["name"].endswith(TRACE_SUFFIXES)]
    return sorted(f"{protocol}://{f.split('://', 1)[-1]}" for f in found)


DEPTH = 4  # folders below a PATH searched for traces


def runs_in(location, depth: int = DEPTH) -> list[str]:
    """The runs under `location`: itself where it is a file or a directory with trace files of
    its own, and every directory below it (up to `depth` levels, not a recording's `names/` or `memory/`)
    that holds trace files — a profile output's variants (its `manifest.json` is not a trace),
    a folder of traces at mixed depths —, sorted; `location` itself where none does."""
    if not is_dir(location):
        return [str(location)]
    own = [f for f in trace_files(location) if name(f) != "manifest.json"]
    below = [run for d in subdirectories(location) if name(d) not in ("names", "memory")
             for run in (runs_in(d, depth - 1) if depth > 0 else []) if run != d or trace_files(d)]
    return ([str(location)] if own or not below else []) + below


def subdirectories(location) -> list[str]:
    """The directories directly in the directory `location`, sorted."""
    if is_url(location):
        fs, path = _fs(str(location))
        protocol = str(location).split("://", 1)[0]
        return sorted(f"{protocol}://{e['name'].split('://', 1)[-1]}" for e in fs.ls(path, detail=True)
                      if e["type"] == "directory")
    return sorted(str(p) for p in Path(location).iterdir() if p.is_dir())


# tensorboard_trace_handler names each profiling cycle `<worker>.<epoch ms>.pt.trace.json[.gz]`.
CYCLE_NAME = re.compile(r"^(?P<worker>.+)\.(?P<stamp>\d{10,})\.pt\.trace\.json(\.gz)?$")


def cycle_index(paths: list[str], cycle: str, where) -> int:
    """The index into `paths` (a rank's cycles' files, in time order) that `cycle` names; a
    number out of range is an error listing the cycles there are."""
    if cycle == "last":
        return len(paths) - 1
    if cycle == "first":
        return 0
    n = int(cycle)
    if not 1 <= n <= len(paths):
        there = "is 1 profiling cycle" if len(paths) == 1 else f"are {len(paths)} profiling cycles"
        listed = ", ".join(f"{i} {name(p)}" for i, p in enumerate(paths, 1))
        raise TraceError(where, f"--cycle {n}: there {there} ({listed})")
    return n - 1


def cycles_by_name(found: list[str], cycle: str) -> tuple[list[str], dict[str, list[str]]]:
    """The files to load, one cycle per worker where names carry the cycle's time stamp, and
    each chosen file of a worker with several → all of them, in time order."""
    by_worker: dict[str, list[tuple[int, str]]] = {}
    plain = []
    for f in found:
        m = CYCLE_NAME.match(name(f))
        if m:
            by_worker.setdefault(m["worker"], []).append((int(m["stamp"]), f))
        else:
            plain.append(f)
    chosen, others = list(plain), {}
    for worker, cycles in by_worker.items():
        cycles.sort()
        i = cycle_index([f for _, f in cycles], cycle, cycles[0][1].rsplit("/", 1)[0])
        chosen.append(cycles[i][1])
        if len(cycles) > 1:
            others[cycles[i][1]] = [f for _, f in cycles]
    return sorted(chosen), others


VERSION_FIELDS = ("ETag", "Last-Modified", "LastModified", "Content-MD5", "Digest", "mtime", "created",
                  "generation", "md5Hash")  # what fsspec's file systems report of an object's version


def identity(location) -> dict:
    """What names this version of the file: its absolute path or URL and size; for a local
    file its inode, modification and change times (a rewrite that keeps size and mtime, as
    `cp -p` or `rsync -t` do, still changes the ctime); for a URL every version field the
    server gives (ETag, Last-Modified, …)."""
    try:
        if not is_url(location):
            stat = os.stat(location)
            return {"path": str(Path(location).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                    "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino}
        fs, path = _fs(str(location))
        info = fs.info(path)
        return {"path": str(location), "size": info.get("size"),
                "version": {k: str(info[k]) for k in VERSION_FIELDS if info.get(k) is not None}}
    except OSError as e:
        raise TraceError(location, f"cannot read: {e.strerror or e}") from None


def text_size(location: str) -> int:
    """Bytes of the file's text: its size, or a gzip file's uncompressed size as its trailer
    gives it (modulo 4 GiB), at least the compressed size."""
    size = os.path.getsize(location)
    with open(location, "rb") as f:
        if f.read(2) != b"\x1f\x8b" or size < 4:
            return size
        f.seek(-4, os.SEEK_END)
        return max(size, int.from_bytes(f.read(4), "little"))


def open_stream(location):
    """A binary file object of the file's text: gunzipped (ISA-L) when it is gzip."""
    from isal import igzip

    if is_url(location):
        fs, path = _fs(str(location))
        raw = fs.open(path, "rb")
    else:
        raw = open(location, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        unzipped = igzip.IGzipFile(fileobj=raw, mode="rb")
        unzipped.myfileobj = raw  # closed with it (gzip.GzipFile's own attribute for that)
        return unzipped
    raw.seek(0)
    return raw


def read_bytes(location) -> bytes:
    """The file's bytes, gunzipped when it is gzip; bad input raises TraceError."""
    try:
        if is_url(location):
            fs, path = _fs(str(location))
            with fs.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = Path(location).read_bytes()
    except (OSError, FileNotFoundError) as e:
        raise TraceError(location, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    if raw[:2] == b"\x1f\x8b":
        from isal import igzip
        from isal.igzip_lib import IsalError

        try:
            raw = igzip.decompress(raw)
        except (OSError, EOFError, ValueError, IsalError) as e:
            raise TraceError(location, f"corrupt or truncated gzip ({e})") from None
    raw = raw.removeprefix(BOM)
    if not raw.strip():
        raise TraceError(location, "empty file")
    return raw
