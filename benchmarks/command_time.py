"""Whole commands on small inputs: wall time and peak memory, first and repeated, optionally
paired with another checkout in one run.

    python benchmarks/command_time.py [--repeat 5] [--against CHECKOUT]

Each command runs `--repeat` times in a fresh interpreter, in three states of the cache:
`first` (an empty cache folder: the traces decoded), `again` (the traces cached, the command's
answer not kept: the first answer on a cached trace) and `kept` (its answer kept,
`tracekit/core/answers.py`). Printed: the median seconds [min–max] and the median peak RSS (MB)
of each, beside `python -c pass` and `python -c "import polars, numpy"`. `--against` runs a
second checkout (e.g. `git worktree add /tmp/base <commit>`) alternately with this one (A B,
B A, …), each from a copy of its packages laid out as installed. The goals (issues 25, 29):
each command ≤ 0.5 s on small inputs, a kept answer ≤ 0.25 s. Ratios and seconds, not
thresholds: nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [["summary"], ["kernels", "tests/data/h200x2-blocks4/fsdp2"],
            ["diff", "tests/data/h200x2-blocks4", "ddp", "fsdp1"], ["report", "tests/data/h200x2-blocks4"],
            ["report", "tests/data/h200x1-device"]]
STATES = ("first", "again", "kept")


def installed_view(checkout: Path, into: Path) -> Path:
    """A folder holding `checkout`'s packages as a wheel lays them out (tracekit, with
    analyses and runners inside), compiled, to put first on PYTHONPATH."""
    view = into / checkout.name
    shutil.copytree(checkout / "tracekit", view / "tracekit", ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("analyses", "runners"):
        shutil.copytree(checkout / part, view / "tracekit" / part, ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(view, quiet=1)
    return view


def measured(command: list[str], env: dict, cwd: Path = ROOT, expect: int = 0) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one run of `command`."""
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != expect:
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip().splitlines()[-1:] or ["(nothing on stderr)"]
            raise SystemExit(f"{' '.join(command)}: exit {child.returncode}, expected {expect}: {said[0]}")
    return seconds, usage.ru_maxrss / 1024


def tracekit(view: Path, words: list[str]) -> tuple[list[str], dict, Path]:
    """The command `tracekit WORDS` run from `view`, its environment and the folder it runs in:
    an empty one (`-m` would import the package of the current folder first), the bundled data
    named by absolute path. The view goes before any PYTHONPATH already set (an image may find
    torch or polars through it)."""
    here = view.parent / "here"
    here.mkdir(exist_ok=True)
    words = [str(ROOT / w) if (ROOT / w).exists() else w for w in words]
    path = os.pathsep.join(p for p in (str(view), os.environ.get("PYTHONPATH", "")) if p)
    return [sys.executable, "-m", "tracekit", *words], {**os.environ, "PYTHONPATH": path}, here


def states(words: list[str], view: Path, folder: Path) -> dict[str, tuple[float, float]]:
    """One run of `tracekit WORDS` from `view` in each state of the cache (`STATES`)."""
    command, env, here = tracekit(view, words)
    env["TRACEKIT_CACHE_DIR"] = str(folder)
    env.pop("TRACEKIT_NO_CACHE", None)
    shutil.rmtree(folder, ignore_errors=True)
    found = {"first": measured(command, env, here)}
    shutil.rmtree(folder / "answers", ignore_errors=True)
    found["again"] = measured(command, env, here)
    found["kept"] = measured(command, env, here)
    return found


def spread(runs: list[tuple[float, float]]) -> str:
    seconds = [s for s, _ in runs]
    return (f"{statistics.median(seconds):6.3f} [{min(seconds):.3f}–{max(seconds):.3f}] "
            f"{statistics.median(r for _, r in runs):4.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", type=Path, default=None, help="another checkout, run alternately with this one")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tracekit-command-time-"))
    sides = {"this": installed_view(ROOT, scratch / "this")}
    if args.against:
        sides["against"] = installed_view(args.against.resolve(), scratch / "against")
    floors = {"python -c pass": [sys.executable, "-c", "pass"],
              "python -c 'import polars, numpy'": [sys.executable, "-c", "import polars, numpy"]}
    rows: dict[tuple[str, str, str], list] = {}
    for i in range(args.repeat):
        for name, command in floors.items():
            rows.setdefault((name, "", ""), []).append(measured(command, dict(os.environ)))
        for words in COMMANDS:
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for side in order:
                for state, run in states(words, sides[side], scratch / "cache").items():
                    rows.setdefault((" ".join(words), side, state), []).append(run)
        for side in sides:
            mistake, env, here = tracekit(sides[side], ["profile", "--device", "cpu", "--nproc", "0", "--out", "x"])
            rows.setdefault(("profile --nproc 0 (a mistake)", side, "first"), []).append(measured(mistake, env, here, 2))
    shutil.rmtree(scratch, ignore_errors=True)
    width = max(len(name) for name, _, _ in rows)
    print(f"{'command':<{width}}  {'side':<7}  {'state':<5}  median [min–max] s, median peak RSS   (n={args.repeat})")
    for (name, side, state), runs in rows.items():
        print(f"{name:<{width}}  {side:<7}  {state:<5}  {spread(runs)}")


if __name__ == "__main__":
    main()
