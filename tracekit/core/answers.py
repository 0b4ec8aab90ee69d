"""Answers kept per command: what a whole command printed (stdout, stderr, in order) and its exit
status, kept in the cache folder (`answers/<key>.json`) so that the same command on the same
inputs prints it again without importing polars, numpy or the analyses. Which commands may be
kept, and the printing, are the front's (`tracekit/front/start.py`).

The key is a hash of all that the output can depend on:
- the command line (`--option=value` read as `--option value`, as click does), the program's
  name and the current folder;
- each input's identity (`files.identity`, the trace cache's rule: path, size, modification and
  change times, inode): every argument that names a file or folder; a folder's files and folders
  down to the depth a verb reads (`files.DEPTH` folders of runs, then names/<trace>); what a verb reads beside a
  trace file or folder, there or not (the naming step `names/<its name>`, a profile manifest
  one or two folders up); and with no such argument the current folder itself, whose JSON files
  the bundled sample's note counts;
- the environment that shapes the output: the terminal's width, whether stdout and stderr are
  terminals and their encodings, COLUMNS, NO_COLOR, the locale, every TRACEKIT_* and POLARS_*
  variable;
- the code: the size and times of each of tracekit's files, the Python
  version and the name and version of every installed distribution, tracekit's own among them
  (an upgrade, or an edit of tracekit's source, gives fresh answers).

A command whose inputs cannot be told without the network (a URL), or cannot be read, has no key.
A kept answer ends with its CRC-32 (`cache.sealed`): one whose bytes do not match is not an answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from . import cache, files

DEPTH = 6  # levels below an argument that a verb reads: files.DEPTH folders of runs, names/, a trace
SHAPING = ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ",
           "PYTHONIOENCODING", "PYTHONUTF8")
STREAMS = ("stdout", "stderr")


def key(argv: list[str]) -> str | None:
    """The key of the command `argv` (the program, then its arguments) here and now; None when
    an argument is a URL, or what names the inputs cannot be read (a folder removed or not
    readable: the command then runs as if nothing were kept)."""
    if any(files.is_url(word) for word in argv[1:]):
        return None
    words = normalised(argv[1:])
    try:
        text = json.dumps({"program": argv[0], "words": words, "folder": os.getcwd(), "inputs": inputs(words),
                           "environment": environment(), "code": code()}, sort_keys=True)
    except OSError:
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def normalised(words: list[str]) -> list[str]:
    """The arguments with `--option=value` split in two (not after `--`)."""
    out = []
    for i, word in enumerate(words):
        if word == "--":
            return out + words[i:]
        out.extend(word.split("=", 1) if word.startswith("--") and "=" in word else [word])
    return out


def inputs(words: list[str]) -> list:
    """The identities of the files and folders the arguments name, with what lies below and
    beside them (None for a file looked for beside that is not there)."""
    named = [Path(word) for word in words if os.path.exists(word)]
    found = []
    for path in named:
        found += below(path, DEPTH)
        found += [stat_of(p) for p in beside(path)]
    return found or [stat_of(Path.cwd())]


def below(path: Path, depth: int) -> list[dict]:
    """`path`'s identity and, for a folder, its entries' down to `depth` levels."""
    found = [stat_of(path)]
    if depth and path.is_dir():
        for entry in sorted(path.iterdir()):
            if entry.name != "__pycache__":
                found += below(entry, depth - 1)
    return found


def beside(path: Path) -> set[Path]:
    """What a verb reads beside a trace file (its naming step, the manifests of a profile output
    it may be in: `loading.manifest_near`, `cli.common.named_beside`; its rank's memory record,
    `memory_files.memory_beside`) or beside a run folder
    (the manifest above it), for the path as given and as resolved."""
    found = set()
    for where in {path, path.resolve()}:
        if where.is_dir():
            found.add(where.parent / "manifest.json")
        else:
            found.update((where.parent / "names" / where.name, where.parent / "manifest.json",
                          where.parent.parent / "manifest.json",
                          where.parent / "memory" / f"{where.name.split('.', 1)[0]}.json.gz"))  # memory_beside
    return found


def stat_of(path: Path) -> dict | None:
    """`files.identity` of a file or folder; None when it is not there."""
    try:
        return files.identity(path)
    except files.TraceError:
        return None


def environment() -> dict:
    """What outside the command line and the files shapes the output."""
    terminal = None
    try:  # where COLUMNS is not set, the width of the terminal on stdout (shutil.get_terminal_size)
        terminal = os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        pass
    variables = {k: v for k, v in os.environ.items() if k in SHAPING or k.startswith(("TRACEKIT_", "POLARS_"))}
    return {"variables": variables, "terminal": terminal,
            "streams": [(s.isatty(), s.encoding, s.errors) for s in (sys.stdout, sys.stderr)]}


def code() -> dict:
    """What names this version of tracekit and of what it runs on (`*.dist-info` names carry
    the versions)."""
    import importlib.util

    folders = [Path(importlib.util.find_spec(name).submodule_search_locations[0])
               for name in ("tracekit", "tracekit.analyses", "tracekit.runners")]
    return {"python": sys.version,
            "files": [(str(p), (s := p.stat()).st_size, s.st_mtime_ns, s.st_ctime_ns) for folder in folders
                      for p in cache.source_files(folder)],
            "distributions": sorted(name for folder in sys.path if os.path.isdir(folder)
                                    for name in os.listdir(folder) if name.endswith((".dist-info", ".egg-info")))}


def read(answer_key: str) -> dict | None:
    """The kept answer {"output": [[stream, text], …], "status": code}, or None (none, or
    unreadable: corrupt, `cache.opened`)."""
    path = cache.folder() / cache.ANSWERS / f"{answer_key}.json"
    try:
        text = cache.opened(path.read_bytes(), cache.named(path))
        if text is None:
            return None
        answer = json.loads(text.decode("utf-8"))
        if not (answer["status"] == 0 and all(s in STREAMS and isinstance(t, str) for s, t in answer["output"])):
            return None
        os.utime(path)  # recently used
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return answer


def write(answer_key: str, output: list[tuple[str, str]]) -> None:
    """Keep the answer of a command that exited 0 (quietly not, where the folder cannot be
    written), and keep the cache under its bound."""
    folder = cache.folder() / cache.ANSWERS
    tmp = folder / f".{answer_key}.{os.urandom(16).hex()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{answer_key}.json"
        tmp.write_bytes(cache.sealed(json.dumps({"output": merged(output), "status": 0}).encode("utf-8"),
                                     cache.named(path)))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return
    cache.evict()


def merged(output: list[tuple[str, str]]) -> list[list[str]]:
    """The pieces of output with each run of writes to one stream joined."""
    out = []
    for stream, text in output:
        if out and out[-1][0] == stream:
            out[-1][1] += text
        elif text:
            out.append([stream, text])
    return out
