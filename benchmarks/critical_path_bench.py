"""What the critical path and the roofline cost against `breakdown` on the same trace, measured
in one run and printed as ratios.

    python benchmarks/critical_path_bench.py [--mb 40] [--repeat 5] [--base PYTHON]

On the committed real H200 traces (tests/data/h200x2-blocks4/*/rank0) and on one trace of at
least `--mb` MB built by replicating the embedded H200 FSDP1 trace over many steps
(`load_bench.build`), each in `--repeat` rounds, the contenders alternated within a round so
that the machine's drift hits them alike:
1. **analysis alone**: per round and analysis — `critical_path` (`critical_path.py`),
   `roofline` (`flops.py`), `kernels` (with TFLOP/s) — a process loads the trace (from the
   trace cache) and runs it and `breakdown` in turn, once untimed, then three times, each on a
   fresh copy of the trace so that each computes what it needs (`breakdown` its timeline,
   `critical_path` its path; nothing kept is found);
2. **first look**: the whole command, `tracekit breakdown FILE` against `tracekit
   critical-path FILE`, the trace's tables in the cache but every analysis' kept table and
   every kept answer removed before each command (each computes its own timeline or path);
3. **warm**: the whole command with everything kept (each reads what it keeps, or prints its
   kept answer).
Times are CPU time (the process's, all its threads; a command's with its children) and wall
time: the machine may be shared. Per trace: the median of the per-round ratios with their
min–max, and breakdown's median. `--base PYTHON`: the same, in the same rounds, with another
interpreter's tracekit (a virtual environment with the main branch installed, say), each with
its own trace cache. Ratios, not thresholds: nothing here is asserted in the tests.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

REAL = sorted((HERE.parent / "tests" / "data" / "h200x2-blocks4").glob("*/rank0.pt.trace.json.gz"))
ANALYSES = ("breakdown", "critical_path", "roofline", "kernels")


def child(path: Path, name: str) -> None:
    """Analysis alone, in this process: breakdown and `name` in turn on fresh copies of the
    loaded trace, once untimed, then three times; prints {name: [(cpu s, wall s), ...], size}."""
    import tracekit.core.loading as loading
    from tracekit.analyses.breakdown import breakdown
    from tracekit.analyses.critical_path import critical_path
    from tracekit.analyses.flops import roofline
    from tracekit.analyses.kernels import kernels

    functions = dict(zip(ANALYSES, (breakdown, critical_path, roofline, kernels)))
    trace = loading.load(path)
    # a cached trace decodes each table when first used, and a copy that decodes one takes it from
    # the others (they share its bytes): every table decoded here, once, for all the copies below
    for table in list(getattr(trace, "stored", {})):
        getattr(trace, table)
    times = {"breakdown": [], name: []}
    for turn in range(4):  # the first turn, untimed, pays the imports and first allocations
        for each in ("breakdown", name) if turn % 2 else (name, "breakdown"):
            fresh = copy.copy(trace)
            fresh.derived = {}
            cpu, wall = time.process_time(), time.perf_counter()
            functions[each](fresh)
            if turn:
                times[each].append((time.process_time() - cpu, time.perf_counter() - wall))
    print(json.dumps({"times": times, "size": f"{trace.gpu.height}/{trace.calls.height}/{trace.ops.height}"}))


def run(python: str, args: list, cache: Path) -> tuple[float, float]:
    """(CPU s, wall s) of `python args` with the trace cache `cache`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    out = subprocess.run([python, *map(str, args)], capture_output=True, text=True,
                         env={**os.environ, "TRACEKIT_CACHE_DIR": str(cache)})
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def forget_kept(cache: Path) -> None:
    """Remove from the trace cache what would spare a command its analysis: the analyses' kept
    tables (timeline, critical path, ...) and the commands' kept answers (`answers/`)."""
    for kept in [*cache.glob("*/derived-*"), *cache.glob("answers/*")]:
        kept.unlink()


def command(python: str, verb: str, path: Path, cache: Path, first: bool) -> tuple[float, float]:
    if first:
        forget_kept(cache)
    return run(python, ["-m", "tracekit", verb, path], cache)


def ratios(pairs: list) -> str:
    """`median (min–max)` of b ÷ a over (a, b) pairs."""
    r = sorted(b / a for a, b in pairs)
    return f"{statistics.median(r):.2f} ({r[0]:.2f}–{r[-1]:.2f})"


def measure(path: Path, pythons: dict, caches: dict, repeat: int) -> dict:
    """Per interpreter: analysis-alone times, first-look and warm command pairs."""
    found = {label: {"alone": {name: [] for name in ANALYSES[1:]}, "first": [], "warm": []} for label in pythons}
    for label, python in pythons.items():
        run(python, ["-m", "tracekit", "critical-path", path], caches[label])  # fills the cache
    for round_ in range(repeat):
        for label, python in (pythons.items() if round_ % 2 == 0 else list(pythons.items())[::-1]):
            into = found[label]
            for name in ANALYSES[1:]:
                out = subprocess.run([python, __file__, "--child", str(path), name], capture_output=True, text=True,
                                     check=True, env={**os.environ, "TRACEKIT_CACHE_DIR": str(caches[label])})
                result = json.loads(out.stdout.strip().splitlines()[-1])
                into["size"] = result["size"]
                into["alone"][name].append(result["times"])
            for kind, first in (("first", True), ("warm", False)):
                verbs = ("breakdown", "critical-path") if round_ % 2 == 0 else ("critical-path", "breakdown")
                pair = {verb: command(python, verb, path, caches[label], first) for verb in verbs}
                into[kind].append((pair["breakdown"], pair["critical-path"]))
    return found


def report(name: str, found: dict) -> None:
    for label, f in found.items():
        turns = {a: [(b, c) for times in f["alone"][a] for b, c in zip(times["breakdown"], times[a])]
                 for a in ANALYSES[1:]}  # (breakdown's (cpu, wall), the analysis') in each turn
        cells = [f"{1000 * statistics.median(b[0] for b, _ in turns['critical_path']):.1f}"]
        cells += [ratios([(b[0], c[0]) for b, c in turns[a]]) for a in ANALYSES[1:]]
        cells.append(ratios([(b[1], c[1]) for b, c in turns["critical_path"]]))
        for kind in ("first", "warm"):
            cells.append(f"{statistics.median(b[0] for b, _ in f[kind]):.2f}")
            cells += [ratios([(b[i], c[i]) for b, c in f[kind]]) for i in (0, 1)]
        print(f"| {name} ({f['size']}) | {label} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=40.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", help="another interpreter whose tracekit to measure alongside")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child[0]), args.child[1])
    from load_bench import build

    pythons = {"this": sys.executable, **({"base": args.base} if args.base else {})}
    with tempfile.TemporaryDirectory(prefix="tracekit-cp-bench-") as work:
        caches = {label: Path(work) / f"cache-{label}" for label in pythons}
        big = build(args.mb, Path(work) / "big.trace.json")
        print(f"{args.repeat} rounds; size = gpu/calls/ops rows. Analysis alone: breakdown's CPU ms, then each ÷ "
              "breakdown's (CPU; critical_path also wall). Commands: breakdown's CPU s, critical-path ÷ breakdown "
              "(CPU, wall), median (min–max)\n")
        print("| trace | tracekit | breakdown ms | critical_path | roofline | kernels | critical_path, wall "
              "| first: breakdown s | first: CPU | first: wall | warm: breakdown s | warm: CPU | warm: wall |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for path in [*REAL, big]:
            name = f"{path.parent.name}/{path.name}" if path in REAL else f"{args.mb:g} MB replicated"
            report(name, measure(path, pythons, caches, args.repeat))


if __name__ == "__main__":
    main()
