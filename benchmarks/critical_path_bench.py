"""What the critical path and the roofline cost against `breakdown` on the same trace, measured
in one run and printed as ratios.

    python benchmarks/critical_path_bench.py [--mb 40] [--repeat 3]

On the committed real H200 traces (tests/data/h200x2-blocks4/*/rank0) and on one trace of at
least `--mb` MB built by replicating the embedded H200 FSDP1 trace over many steps
(`load_bench.build`):
1. the analysis alone, the trace loaded once (each analysis on a fresh copy of the loaded
   trace, so that neither finds the other's kept timeline): `breakdown`, `critical_path`
   (`critical_path.py`), `roofline` (`flops.py`) and `kernels` (now with TFLOP/s);
2. the whole command, cache warm: `tracekit breakdown FILE` against `tracekit critical-path FILE`,
   in `--repeat` alternated pairs: medians, and the median ratio with its min–max.
The analyses: the best of `--repeat` runs each. Ratios, not thresholds: nothing here is asserted in the tests.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from load_bench import build, cli_seconds  # noqa: E402

REAL = sorted((HERE.parent / "tests" / "data" / "h200x2-blocks4").glob("*/rank0.pt.trace.json.gz"))


def best(function, trace, repeat: int) -> float:
    """The least seconds of `repeat` calls of function(a fresh copy of trace)."""
    times = []
    for _ in range(repeat):
        fresh = copy.copy(trace)
        fresh.derived = {}
        t = time.perf_counter()
        function(fresh)
        times.append(time.perf_counter() - t)
    return min(times)


def analyses(path: Path, repeat: int) -> None:
    import tracekit.core.loading as loading
    from tracekit.analyses.breakdown import breakdown
    from tracekit.analyses.critical_path import critical_path
    from tracekit.analyses.flops import roofline
    from tracekit.analyses.kernels import kernels

    trace = loading.load(path)
    base = best(breakdown, trace, repeat)
    cells = [f"{base:.3f}"]
    for function in (critical_path, roofline, kernels):
        seconds = best(function, trace, repeat)
        cells.append(f"{seconds:.3f} ({seconds / base:.2f}×)")
    size = f"{trace.gpu.height}/{trace.calls.height}/{trace.ops.height}"
    print(f"| {path.parent.name}/{path.name} | {size} | " + " | ".join(cells) + " |")


def commands(path: Path, repeat: int) -> None:
    """`repeat` pairs, breakdown and critical-path in turn, so that the machine's drift hits
    both alike: the median of the per-pair ratios, and their spread."""
    cli_seconds("breakdown", path)  # fills the cache
    cli_seconds("critical-path", path)
    pairs = [(cli_seconds("breakdown", path), cli_seconds("critical-path", path)) for _ in range(repeat)]
    ratios = sorted(cp / base for base, cp in pairs)
    base, cp = statistics.median(b for b, _ in pairs), statistics.median(c for _, c in pairs)
    print(f"| {path.parent.name}/{path.name} | {base:.3f} | {cp:.3f} | {statistics.median(ratios):.2f} "
          f"({ratios[0]:.2f}–{ratios[-1]:.2f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=40.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracekit-cp-bench-") as work:
        big = build(args.mb, Path(work) / "big.trace.json")
        paths = [*REAL, big]
        print("analysis alone, seconds (÷ breakdown); size = gpu/calls/ops rows\n")
        print("| trace | size | breakdown | critical_path | roofline | kernels |\n|---|---|---|---|---|---|")
        for path in paths:
            analyses(path, args.repeat)
        print("\nwhole command, cache warm, alternated pairs: median seconds, median ratio (min–max)\n")
        print("| trace | breakdown | critical-path | ratio |\n|---|---|---|---|")
        for path in paths:
            commands(path, args.repeat)


if __name__ == "__main__":
    main()
