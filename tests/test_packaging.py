"""The distribution: a built wheel holds every package (core, front, runners, analyses) and the sample; analysing
needs no torch."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_wheel_holds_tracekit_runners_analyses_and_the_sample(tmp_path):
    """Built from a copy of the sources, so that setuptools' build/ and egg-info land in the
    temporary folder, not in the source tree."""
    source = tmp_path / "src"
    for part in ("tracekit", "runners", "analyses"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("torch_tracekit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("tracekit/front/cli/__init__.py", "tracekit/core/loading.py", "tracekit/runners/worker.py", "tracekit/analyses/diff.py",
                   "tracekit/data/fsdp1_rank0.trace.json.gz"):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tracekit = tracekit.front.start:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_analysing_works_without_torch():
    """`import torch` made to fail: the analysis verbs still run."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tracekit.front.cli import main\n"
            "main(['summary', '--format', 'csv'], standalone_mode=False)\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split(",")[1] == "0"  # rank 0 of the embedded trace
