"""How the `tracekit` command starts (`tracekit`, `python -m tracekit`): a read-only verb whose
answer is kept (`tracekit/core/answers.py`) prints it before click, polars or any analysis is
imported; any other command runs the click group (`cli/`), and a read-only verb's answer is kept
when it exited 0.

Never kept: the verbs that write files (export, plot, profile, capacity, and diff or report with
`--plot`), serve (open) or show the cache; a command with `--no-cache` or `TRACEKIT_NO_CACHE=1`;
one that started worker processes or a Dask client (their stderr is not recorded here); one whose
inputs changed while it ran."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys

from tracekit.core import answers, cache

READ_ONLY = frozenset({"summary", "syncs", "comms", "overlap", "breakdown", "kernels", "launches", "critical-path",
                       "lint", "diff", "report", "check"})
RUNS_MODELS = frozenset({"profile", "capacity"})  # torch's own threads are the user's to set


def quiet_blas() -> None:
    """numpy's OpenBLAS kept to one thread where the command runs no model: tracekit does no
    linear algebra, and at numpy's import each of OpenBLAS's threads (one per core) spins
    before it sleeps, 2 CPU-s of 16 cores' time per process on the 16-core host (eight ranks
    read by eight workers: 2.13-2.27 -> 1.78-1.89 s). The user's own setting stands."""
    if not (sys.argv[1:2] and sys.argv[1] in RUNS_MODELS):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> None:
    """The command: `sys.argv`'s answer, kept or computed. A read-only verb ends without the
    interpreter's teardown (`ended`)."""
    quiet_blas()
    if sys.argv[1:2] and sys.argv[1] in READ_ONLY and getattr(atexit, "_ncallbacks", lambda: 1)() == 0:
        atexit.register(ended)  # the first, so the last to run: after the cache's writes and every other
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (Passed(s, name) if s is not None else s for s, name in zip(streams, ("stdout", "stderr")))
    try:
        answered()
    except Unwritable as e:  # a full disk: one line, exit 2 (a closed pipe is click's, or `replay`'s)
        with contextlib.suppress(Unwritable):
            print(f"tracekit: {e}", file=sys.stderr, flush=True)
        finished(2)
        sys.exit(2)
    except SystemExit as e:
        finished(e.code)
        raise
    finally:
        sys.stdout, sys.stderr = streams
    finished(0)


def answered() -> None:
    entry = answers.key(sys.argv) if keepable(sys.argv[1:]) else None
    kept = answers.read(entry) if entry else None
    if kept:
        replay(kept["output"])
        sys.exit(kept["status"])
    if entry is None:
        from .cli import main as command

        return command()
    sys.exit(kept_after(entry))


_status: list = []  # the exit status of a command that ended (not by an error), for `ended`


def finished(code) -> None:
    """Note the status the command exits with, as Python gives it (None: 0; a message: 1)."""
    _status.append(code if isinstance(code, int) else 0 if code is None else 1)


def ended() -> None:
    """The last exit handler of a read-only verb: the output flushed, the process ends with its
    status without the interpreter's teardown — freeing every module's objects (polars, numpy,
    the loaded traces), ~50 ms of a command that answers in a few hundred. Its files are
    written by then (the trace cache's writer thread ends in an earlier exit handler, a kept
    answer and a picture before the command returns). Only where no exit handler was there
    before `main` (the command as a process of its own: not under coverage, nor called by a
    program that registered its own), so that every handler runs; where the command ended in
    an error (a traceback), the interpreter ends as usual."""
    if not _status:
        return
    from tracekit.core.executor import without_teardown  # here: a kept answer's replay need not import it

    without_teardown(_status[-1], (OSError, ValueError, Unwritable))


def kept_after(entry: str) -> int:
    """Run the command, its output recorded as it goes out, and keep its answer when it exited 0
    and may be kept; its exit status."""
    output: list[tuple[str, str]] = []
    status = 0
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Recorded(sys.stdout, "stdout", output), Recorded(sys.stderr, "stderr", output)
    try:
        from .cli import main as command

        command()
    except SystemExit as e:
        status = e.code
    finally:
        sys.stdout, sys.stderr = streams
    # worker processes write to the terminal themselves, past the recording
    if status in (0, None) and "multiprocessing" not in sys.modules and answers.key(sys.argv) == entry:
        answers.write(entry, output)
    return status


def keepable(words: list[str]) -> bool:
    """Whether the answer of `tracekit WORDS` may be kept (the module's docstring says which)."""
    return bool(words) and words[0] in READ_ONLY and cache.enabled() \
        and not any(w in ("--no-cache", "--plot") or w.startswith("--plot=") for w in words)


def replay(output: list[list[str]]) -> None:
    """Write a kept answer's output again; a closed pipe ends it quietly, status 1, as click ends
    a command (a full disk: `Unwritable`)."""
    for stream, text in output:
        try:
            getattr(sys, stream).write(text)
            getattr(sys, stream).flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), getattr(sys, stream).fileno())  # nothing more to flush
            sys.exit(1)


class Unwritable(Exception):
    """Standard output or error that cannot be written, but by a closed pipe (`> /dev/full`:
    "No space left on device"). Not an OSError, so that it passes every handler of those."""


class Passed(io.TextIOBase):
    """A text stream that writes through to `stream` (`sys.NAME`), a failed write or flush
    raised as `Unwritable` (a closed pipe as itself)."""

    def __init__(self, stream, name: str):
        self.stream, self.name = stream, name

    def write(self, text: str) -> int:
        return self._through(self.stream.write, text)

    def flush(self) -> None:
        self._through(self.stream.flush)

    def _through(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            which = "output" if self.name == "stdout" else "error"
            raise Unwritable(f"cannot write to standard {which}: {e.strerror or e}") from None

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self):
        return self.stream.encoding

    @property
    def errors(self):
        return self.stream.errors


class Recorded(Passed):
    """A text stream that writes through to `stream` and records each write as (name, text)
    in `output`."""

    def __init__(self, stream, name: str, output: list):
        super().__init__(stream, name)
        self.output = output

    def write(self, text: str) -> int:
        written = super().write(text)
        self.output.append((self.name, text))
        return written
