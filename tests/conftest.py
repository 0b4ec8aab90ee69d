import os
import sys
import tempfile
from pathlib import Path

# Hypothesis' own files (its caches) go to a temporary folder, never into the source tree, and
# it keeps no example database.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", tempfile.mkdtemp(prefix="tracekit-test-hypothesis-"))
from hypothesis import settings  # noqa: E402

settings.register_profile("tracekit", database=None)
settings.load_profile("tracekit")

sys.path.insert(0, str(Path(__file__).parent))

DATA = Path(__file__).parent / "data"
# Tables and messages wrap at the terminal's width: the tests' is 100 columns whatever runs them
# (a terminal, a pipe, a test worker process).
os.environ.setdefault("COLUMNS", "100")
# The trace cache of the test session: its own folder, never the user's.
os.environ.setdefault("TRACEKIT_CACHE_DIR", tempfile.mkdtemp(prefix="tracekit-test-cache-"))


def pytest_collection_modifyitems(items):
    """With tests in several processes (`--dist loadgroup`), the tests that share a module- or
    session-scoped fixture (a profile run, an export) stay in one process, so that it is made once."""
    import pytest

    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = sorted(name for name, defs in (info.name2fixturedefs.items() if info else ())
                        if defs and defs[-1].scope in ("module", "session") and defs[-1].baseid)
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{','.join(shared)}"))


def messages(stderr: str) -> list[str]:
    """stderr's messages, each whole: tracekit wraps its notes and errors at the terminal's
    width, a line that starts with two spaces continuing the one before it."""
    out: list[str] = []
    for line in stderr.strip().splitlines():
        if line.startswith("  ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out
