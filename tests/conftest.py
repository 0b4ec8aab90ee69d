import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

DATA = Path(__file__).parent / "data"
# The trace cache of the test session: its own folder, never the user's.
os.environ.setdefault("TRACEKIT_CACHE_DIR", tempfile.mkdtemp(prefix="tracekit-test-cache-"))
