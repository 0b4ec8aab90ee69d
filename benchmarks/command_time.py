"""Whole commands on small inputs, measured in one run and printed beside the interpreter's floor.

    python benchmarks/command_time.py [--repeat 5]

Each command runs `--repeat` times in a fresh interpreter (warm trace cache after the first);
the median wall time is printed in seconds and as a ratio to `python -c "import polars, numpy"`
(the floor every command pays). Also the import of `scipy.stats` against `scipy.special`, the
t quantile's two homes (`analyses/noise.py` uses `scipy.special.stdtrit`). The goal: each
command ≤ 0.5 s on an idle machine. Ratios, not thresholds: nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(command: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(command, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    py, tk = [sys.executable], [sys.executable, "-m", "tracekit"]
    out = Path(tempfile.mkdtemp()) / "x"
    floor = wall([*py, "-c", "import polars, numpy"], repeat)
    rows = [("python: import polars, numpy (the floor)", floor),
            ("python: import scipy.special", wall([*py, "-c", "import scipy.special"], repeat)),
            ("python: import scipy.stats", wall([*py, "-c", "import scipy.stats"], repeat)),
            ("tracekit report tests/data/h200x2-blocks4 (1.8 MB)",
             wall([*tk, "report", "tests/data/h200x2-blocks4"], repeat)),
            ("tracekit report tests/data/h200x1-device", wall([*tk, "report", "tests/data/h200x1-device"], repeat)),
            ("tracekit profile --nproc 0 (a mistake)",
             wall([*tk, "profile", "--device", "cpu", "--nproc", "0", "--out", str(out)], repeat))]
    width = max(len(name) for name, _ in rows)
    print(f"{'command':<{width}}  seconds  ÷ floor")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds:7.3f}  {seconds / floor:7.2f}")


if __name__ == "__main__":
    main()
