"""Load benchmark: tracekit summary vs a typed msgspec decode vs orjson vs HTA, in one run.

Builds (or takes) a trace of at least 150 MB by replicating a real H200 trace over many steps
with shifted timestamps, correlation and External ids, then runs each reader in a fresh
process and prints wall time and peak RSS as ratios:

    python benchmarks/load_bench.py [--mb 150] [--trace FILE] [--hta]

Ratios, not thresholds: nothing here is asserted in the tests.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "tracekit" / "data" / "fsdp1_rank0.trace.json.gz"

# name: (imports, timed statements); PATH is the trace file.
READERS = {
    "tracekit summary": ("import tracekit.loading as tracekit\nfrom tracekit.analyses.summary import summary",
                         "summary(tracekit.load(PATH))"),
    "tracekit load": ("import tracekit.loading as tracekit", "tracekit.load(PATH)"),
    # The other verbs on the same trace, to catch an analysis that grows faster than the trace.
    "tracekit syncs": ("import tracekit.loading as tracekit\nfrom tracekit.analyses.syncs import sync_ledger",
                       "sync_ledger(tracekit.load(PATH))"),
    "tracekit breakdown": ("import tracekit.loading as tracekit\nfrom tracekit.analyses.breakdown import breakdown",
                           "breakdown(tracekit.load(PATH))"),
    "tracekit diff (self)": (
        "import tracekit.loading as tracekit\nfrom tracekit.analyses.diff import diff_runs",
        "trace = tracekit.load(PATH)\ndiff_runs([trace], [trace], None, 20, 'kernel')"),
    "tracekit export": ("import os, tempfile\nfrom tracekit.export import export_traces",
                        "export_traces([PATH], os.path.join(tempfile.mkdtemp(), 'x.pftrace'))"),
    # The JSON floor: every event decoded into tracekit's own typed structs, in one call.
    "msgspec typed decode": (
        "import msgspec\nfrom tracekit.kineto import Event\n"
        "class Document(msgspec.Struct):\n    traceEvents: list[Event]",
        "msgspec.json.decode(open(PATH, 'rb').read(), type=Document)"),
    "orjson.loads": ("import orjson", "orjson.loads(open(PATH, 'rb').read())"),
    "json.loads": ("import json", "json.loads(open(PATH, 'rb').read())"),
    "HTA TraceAnalysis": (
        "import os, shutil, tempfile\nfrom hta.trace_analysis import TraceAnalysis",
        "d = tempfile.mkdtemp()\nshutil.copy(PATH, os.path.join(d, 'rank0.json'))\nTraceAnalysis(trace_dir=d)"),
}


def build(target_mb: int, out: Path) -> Path:
    """Replicate SOURCE's step until the JSON is at least target_mb megabytes."""
    doc = json.loads(gzip.open(SOURCE).read())
    events = doc["traceEvents"]
    timed = [e for e in events if "ts" in e and e.get("ph") != "M" and isinstance(e.get("pid"), int)]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - min(float(e["ts"]) for e in timed)
    one_copy = len(json.dumps(timed))
    copies = max(1, -(-target_mb * 1_000_000 // one_copy))
    meta = [e for e in events if e not in timed]
    with open(out, "w") as f:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        f.write(",".join(json.dumps(e) for e in meta))
        for i in range(copies):
            shift, id_shift = i * (span + 1000.0), i * 10_000_000
            for e in timed:
                e2 = dict(e, ts=round(float(e["ts"]) + shift, 3))
                if "name" in e2 and e2["name"].startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{i + 1}"
                if "args" in e2:
                    args = dict(e2["args"])
                    for key in ("correlation", "External id"):
                        if isinstance(args.get(key), int):
                            args[key] += id_shift
                    e2["args"] = args
                if isinstance(e2.get("id"), int):
                    e2["id"] += id_shift
                f.write("," + json.dumps(e2))
        f.write("]}")
    return out


def measure(reader: tuple[str, str], path: Path) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of a reader run in a fresh interpreter, imports not timed."""
    imports, statements = reader
    script = (f"import resource, sys, time\nPATH = sys.argv[1]\n{imports}\nt = time.perf_counter()\n"
              f"{statements}\nprint(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    seconds, rss = out.stdout.split()
    return float(seconds), int(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=150)
    parser.add_argument("--trace", type=Path, help="an existing trace instead of building one")
    parser.add_argument("--hta", action="store_true", help="also time HTA (slow on large traces)")
    args = parser.parse_args()
    path = args.trace or build(args.mb, Path(tempfile.gettempdir()) / f"tracekit_bench_{args.mb}mb.json")
    size = os.path.getsize(path)
    print(f"trace: {path} ({size / 1e6:.0f} MB)")
    results = {}
    for name, reader in READERS.items():
        if name.startswith("HTA") and not args.hta:
            continue
        try:
            results[name] = measure(reader, path)
        except RuntimeError as e:
            print(f"{name}: failed ({e})")
    floor_s = results["msgspec typed decode"][0]
    print(f"{'reader':<22} {'seconds':>8} {'÷ typed decode':>15} {'peak RSS ÷ file':>16}")
    for name, (seconds, rss) in results.items():
        print(f"{name:<22} {seconds:8.2f} {seconds / floor_s:15.2f} {rss / size:16.2f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"(benchmark took {time.perf_counter() - t0:.0f} s)")
