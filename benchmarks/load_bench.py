"""Load and scale benchmark: tracekit against a typed msgspec decode, orjson, json and HTA, and
ranks in parallel, all measured in one run and printed as ratios.

    python benchmarks/load_bench.py [--mb 150] [--trace FILE] [--hta] [--ranks 8] [--rank-mb 50]
                                    [--dask-ranks 64] [--workers N] [--skip-scale] [--repeat N]
                                    [--skip-others] [--skip-readers] [--startup]

1. One trace of at least `--mb` MB, built by replicating the embedded real H200 trace over many
   steps (shifted timestamps, correlation and External ids), written as Kineto writes it. Each
   reader runs in a fresh interpreter (imports not timed); time and peak RSS are given as
   ratios to the typed msgspec decode of the same file (every event into tracekit's own
   structs in one call: the JSON floor) and to the file's size. `cold` rows decode the file
   (the trace cache is empty and written meanwhile), `warm` rows read the cache the cold run
   wrote.
2. `--ranks` rank traces of `--rank-mb` MB (copies of `--trace` when given): `tracekit summary` over their directory, one process
   (`--workers 1`) against `--workers N` (default: the cores here) and the default, and against
   one rank alone, the cache off; then `--repeat` rounds of one rank alone, all ranks by default,
   and one command per rank started at once (each given its share of the cores): the same work
   with no pool, for what the pool itself costs.
3. `--dask-ranks` small rank traces on a local Dask cluster of 2 workers (`--scheduler`)
   against one process.
4. Start-up (`--startup`, alone): a whole `tracekit summary` command over 2 ranks of 8 MB and
   4 of 31 MB, cold (empty trace cache) and warm, with `--workers 1`, one per core and the
   default; and the imports' share of the warm command (`python -X importtime`).

Ratios, not thresholds: nothing here is asserted in the tests.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "tracekit" / "data" / "fsdp1_rank0.trace.json.gz"
SUMMARY = ("import tracekit.core.loading as tracekit\nfrom tracekit.analyses.summary import summary",
           "summary(tracekit.load(PATH))")

# name: (imports, timed statements, environment); PATH is the trace file.
READERS = {
    "tracekit summary, cold": (*SUMMARY, {}),
    "tracekit summary, warm": (*SUMMARY, {}),
    "tracekit summary, cold, one process": (*SUMMARY, {"TRACEKIT_CORES": "1"}),
    "tracekit summary, no cache": (*SUMMARY, {"TRACEKIT_NO_CACHE": "1"}),
    "tracekit load, no cache": ("import tracekit.core.loading as tracekit", "tracekit.load(PATH)", {"TRACEKIT_NO_CACHE": "1"}),
    # The other verbs, cold, to catch an analysis that grows faster than the trace.
    "tracekit syncs": ("import tracekit.core.loading as tracekit\nfrom tracekit.analyses.syncs import sync_ledger",
                       "sync_ledger(tracekit.load(PATH))", {"TRACEKIT_NO_CACHE": "1"}),
    "tracekit breakdown": ("import tracekit.core.loading as tracekit\nfrom tracekit.analyses.breakdown import breakdown",
                           "breakdown(tracekit.load(PATH))", {"TRACEKIT_NO_CACHE": "1"}),
    "tracekit diff (self)": ("import tracekit.core.loading as tracekit\nfrom tracekit.analyses.diff import diff_runs",
                             "trace = tracekit.load(PATH)\ndiff_runs([trace], [trace])", {"TRACEKIT_NO_CACHE": "1"}),
    "tracekit export": ("import os, tempfile\nfrom tracekit.front.export import export_traces",
                        "export_traces([PATH], os.path.join(tempfile.mkdtemp(), 'x.pftrace'), "
                        "{'comm_kernels': (), 'cache': False})", {}),
    "msgspec typed decode": (
        "import msgspec\nfrom tracekit.core.kineto import Event\n"
        "class Document(msgspec.Struct):\n    traceEvents: list[Event]",
        "msgspec.json.decode(open(PATH, 'rb').read(), type=Document)", {}),
    "orjson.loads": ("import orjson", "orjson.loads(open(PATH, 'rb').read())", {}),
    "json.loads": ("import json", "json.loads(open(PATH, 'rb').read())", {}),
    "HTA TraceAnalysis": (
        "import os, shutil, tempfile\nfrom hta.trace_analysis import TraceAnalysis",
        "d = tempfile.mkdtemp()\nshutil.copy(PATH, os.path.join(d, 'rank0.json'))\nTraceAnalysis(trace_dir=d)", {}),
}


def kineto_text(event: dict) -> str:
    """An event as Kineto writes it: on lines of its own, indented under `traceEvents`."""
    return "\n  " + json.dumps(event, indent=2).replace("\n", "\n  ")


def build(target_mb: float, out: Path, rank: int = 0, world: int = 1) -> Path:
    """Replicate SOURCE's step until the JSON is at least target_mb megabytes, as `rank` of
    `world`, written as Kineto writes it (the copies made on every core)."""
    doc = json.loads(gzip.open(SOURCE).read())
    events = doc["traceEvents"]
    timed = [e for e in events if "ts" in e and e.get("ph") != "M" and isinstance(e.get("pid"), int)]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - min(float(e["ts"]) for e in timed)
    one_copy = sum(len(kineto_text(e)) + 1 for e in timed)
    copies = max(1, -(-int(target_mb * 1_000_000) // one_copy))
    meta = [e for e in events if e not in timed]
    with open(out, "w") as f:
        f.write(head_text(doc, rank, world))
        f.write(",".join(kineto_text(e) for e in meta))
        batches = [range(i, min(i + 8, copies)) for i in range(0, copies, 8)]
        with ProcessPoolExecutor() as pool:
            for text in pool.map(copies_text, [(timed, span, b) for b in batches]):
                f.write(text)
        f.write("\n]}")
    return out


def head_text(doc: dict, rank: int, world: int) -> str:
    """The top level before the events, as `rank` of `world`."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    head["distributedInfo"] = {**head.get("distributedInfo", {}), "rank": rank, "world_size": world}
    return json.dumps(head)[:-1] + ', "traceEvents": ['


def copies_text(job: tuple) -> str:
    """The events of the copies numbered in `job`'s range, each comma-led."""
    timed, span, numbers = job
    out = []
    for i in numbers:
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
            out.append("," + kineto_text(e2))
    return "".join(out)


def as_ranks(path: Path, folder: Path, world: int) -> None:
    """`world` copies of the trace at `path`, each as its own rank."""
    doc = json.loads(gzip.open(SOURCE).read())
    with open(path, "rb") as f:
        text = f.read()
    head = head_text(doc, 0, 1).encode()
    if not text.startswith(head):
        raise SystemExit(f"{path}: not a trace this benchmark built (--ranks copies only those)")
    events = text[len(head):]
    for r in range(world):
        (folder / f"rank{r}.pt.trace.json").write_bytes(head_text(doc, r, world).encode() + events)


def measure(reader: tuple, path: Path, cache: Path) -> tuple[float, int]:
    """(seconds, peak memory bytes) of a reader run in a fresh interpreter, imports not timed.
    Memory: the peak of the proportional set size (PSS: shared pages split among the processes
    sharing them) summed over the reader and every process under it (the decoding workers),
    sampled every 20 ms; without /proc, the reader's own peak RSS."""
    imports, statements, env = reader
    script = (f"import resource, sys, time\nPATH = sys.argv[1]\n{imports}\nt = time.perf_counter()\n"
              f"{statements}\nprint(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    process = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TRACEKIT_CACHE_DIR": str(cache), **env})
    peak = tree_memory(process)
    out, err = process.communicate()
    if process.returncode:
        raise RuntimeError(err.strip().splitlines()[-1])
    seconds, rss = out.split()
    return float(seconds), peak or int(rss)


def tree_memory(process) -> int:
    """The peak PSS of `process` and its descendants until it ends, from /proc (0 elsewhere)."""
    peak = 0
    while process.poll() is None:
        peak = max(peak, sum(map(pss, descendants(process.pid) | {process.pid})))
        time.sleep(0.02)
    return peak


def descendants(pid: int) -> set[int]:
    """The processes under `pid` (the decoding workers are the fork server's children)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def pss(pid: int) -> int:
    """A process's proportional set size in bytes (0 if it has ended)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def cli_seconds(*args, env=None) -> float:
    """Seconds of the command `tracekit ARGS` (`at_once` of it alone)."""
    return at_once([args], env)


def readers(args, work: Path) -> None:
    path = args.trace or build(args.mb, work / f"bench_{args.mb}mb.json")
    size = os.path.getsize(path)
    print(f"trace: {path} ({size / 1e6:.0f} MB)")
    cache = work / "cache"
    results = {}
    for name, reader in READERS.items():
        if name.startswith("HTA") and not args.hta or args.skip_others and not (
                name.startswith("tracekit summary") or name.startswith("msgspec")):
            continue
        if "cold" in name:
            shutil.rmtree(cache, ignore_errors=True)
        try:
            results[name] = measure(reader, path, cache)
        except RuntimeError as e:
            print(f"{name}: failed ({e})")
    floor_s = results["msgspec typed decode"][0]
    print(f"{'reader':<36} {'seconds':>8} {'÷ typed decode':>15} {'peak memory ÷ file':>19}")
    for name, (seconds, rss) in results.items():
        print(f"{name:<36} {seconds:8.2f} {seconds / floor_s:15.2f} {rss / size:19.2f}")
    warm, cold = results["tracekit summary, warm"][0], results["tracekit summary, cold"][0]
    print(f"warm ÷ cold summary: {warm / cold:.3f}")
    env = {"TRACEKIT_CACHE_DIR": str(cache)}
    whole = sorted(cli_seconds("summary", "--format", "json", path, env=env) for _ in range(5))
    imports = import_seconds("summary", "--format", "json", path, env=env)
    print(f"warm whole `tracekit summary` command: median {whole[2]:.3f} s (min {whole[0]:.3f}, max {whole[-1]:.3f}; "
          f"imports {imports:.3f} s)")
    paired(args, path, cache)


def paired(args, path: Path, cache: Path) -> None:
    """`--repeat` rounds of (typed decode, cold summary, cold summary in one process) back to
    back: each round's ratios, and their medians (noise on a shared machine is large and slow)."""
    if args.repeat < 2:
        return
    names = ("msgspec typed decode", "tracekit summary, cold", "tracekit summary, cold, one process")
    rounds = []
    for _ in range(args.repeat):
        times = {}
        for name in names:
            shutil.rmtree(cache, ignore_errors=True)
            times[name] = measure(READERS[name], path, cache)[0]
        rounds.append((times[names[1]] / times[names[0]], times[names[2]] / times[names[0]]))
        print(f"  round: typed decode {times[names[0]]:.2f} s, cold {times[names[1]]:.2f} s ({rounds[-1][0]:.2f}), "
              f"one process {times[names[2]]:.2f} s ({rounds[-1][1]:.2f})")
    middle = sorted(rounds)[len(rounds) // 2][0], sorted(r[1] for r in rounds)[len(rounds) // 2]
    print(f"{args.repeat} rounds, median ÷ typed decode: cold summary {middle[0]:.2f}, in one process {middle[1]:.2f}")


def ranks(args, work: Path) -> None:
    """`--ranks` rank traces: one process against `--workers N`, and against one rank alone;
    then `--repeat` rounds of (one rank alone, all ranks by default, and the same work with no
    pool: one command per rank, all started at once, each given its share of the cores)."""
    folder = work / f"ranks{args.ranks}"
    folder.mkdir(exist_ok=True)
    source = args.trace or build(args.rank_mb, work / "one-rank.json")
    as_ranks(source, folder, args.ranks)
    mb = os.path.getsize(source) / 1e6
    cores = len(os.sched_getaffinity(0))
    workers = args.workers or cores
    off = {"TRACEKIT_NO_CACHE": "1"}
    alone = cli_seconds("summary", "--format", "json", folder / "rank0.pt.trace.json", env=off)
    one = cli_seconds("summary", "--format", "json", "--workers", 1, folder, env=off)
    many = cli_seconds("summary", "--format", "json", "--workers", workers, folder, env=off)
    default = cli_seconds("summary", "--format", "json", folder, env=off)
    print(f"{args.ranks} ranks of {mb:.0f} MB, summary ({cores} cores): one rank alone "
          f"{alone:.2f} s; all ranks --workers 1 {one:.2f} s, --workers {workers} {many:.2f} s (÷ --workers 1: "
          f"{many / one:.2f}), default {default:.2f} s (÷ one rank alone: {default / alone:.2f})")
    threads = str(max(1, cores // args.ranks))  # as a pool's worker is given them (`executor.share_cores`)
    share = {**off, "TRACEKIT_CORES": threads, "POLARS_MAX_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    rounds = []
    for _ in range(max(args.repeat, 1)):
        alone = cli_seconds("summary", "--format", "json", folder / "rank0.pt.trace.json", env=off)
        default = cli_seconds("summary", "--format", "json", folder, env=off)
        apart = at_once([("summary", "--format", "json", folder / f"rank{r}.pt.trace.json")
                         for r in range(args.ranks)], env=share)
        rounds.append((default / alone, apart / alone))
        print(f"  round: one rank alone {alone:.2f} s, all ranks {default:.2f} s ({rounds[-1][0]:.2f}), "
              f"one command per rank at once {apart:.2f} s ({rounds[-1][1]:.2f})")
    middle = [sorted(r[i] for r in rounds)[len(rounds) // 2] for i in (0, 1)]
    print(f"{len(rounds)} rounds, median ÷ one rank alone: all ranks {middle[0]:.2f}, "
          f"one command per rank at once (no pool) {middle[1]:.2f}")


def at_once(commands: list[tuple], env=None) -> float:
    """Seconds until every one of the `tracekit` commands, all started at once, has ended."""
    t = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-m", "tracekit", *map(str, c)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, env={**os.environ, **(env or {})}) for c in commands]
    for child in children:
        _, err = child.communicate()
        if child.returncode:
            raise RuntimeError(err.decode(errors="replace").strip().splitlines()[-1])
    return time.perf_counter() - t


def dask(args, work: Path) -> None:
    from distributed import LocalCluster

    folder = work / f"ranks{args.dask_ranks}"
    folder.mkdir(exist_ok=True)
    for r in range(args.dask_ranks):
        build(1, folder / f"rank{r}.pt.trace.json", r, args.dask_ranks)
    off = {"TRACEKIT_NO_CACHE": "1"}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        on_dask = cli_seconds("summary", "--format", "json", "--scheduler", cluster.scheduler_address, folder, env=off)
    one = cli_seconds("summary", "--format", "json", "--workers", 1, folder, env=off)
    print(f"{args.dask_ranks} ranks of 1 MB, summary: one process {one:.2f} s, local Dask cluster of 2 workers "
          f"{on_dask:.2f} s, ratio {on_dask / one:.2f}")


def import_seconds(*args, env=None) -> float:
    """The imports of a whole command (`python -X importtime`: the top-level modules' totals)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "tracekit", *map(str, args)], capture_output=True,
                         text=True, env={**os.environ, **(env or {})})
    top = [line.split("|") for line in out.stderr.splitlines() if line.startswith("import time:") and "self" not in line]
    return sum(int(us) for _, us, name in top if not name.startswith("  ")) / 1e6


def startup(args, work: Path) -> None:
    n = len(os.sched_getaffinity(0))
    for count, mb in ((2, 8), (4, 31)):
        folder = work / f"startup{count}x{mb}"
        folder.mkdir(exist_ok=True)
        for r in range(count):
            build(mb, folder / f"rank{r}.pt.trace.json", r, count)
        env = {"TRACEKIT_CACHE_DIR": str(work / "startup-cache")}
        row = []
        for label, workers in (("--workers 1", ["--workers", 1]), (f"--workers {n}", ["--workers", n]),
                               ("default", [])):
            shutil.rmtree(work / "startup-cache", ignore_errors=True)
            cold = cli_seconds("summary", "--format", "json", *workers, folder, env=env)
            warm = cli_seconds("summary", "--format", "json", *workers, folder, env=env)
            row.append((label, cold, warm))
        one_cold, one_warm = row[0][1], row[0][2]
        print(f"{count} ranks of {mb} MB, whole summary command ({n} cores): " + "; ".join(
            f"{label} cold {cold:.2f} s ({cold / one_cold:.2f}), warm {warm:.2f} s ({warm / one_warm:.2f})"
            for label, cold, warm in row))
        imports = import_seconds("summary", "--format", "json", folder, env=env)
        print(f"  imports of the warm default command: {imports:.2f} s of {row[2][2]:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=150)
    parser.add_argument("--trace", type=Path, help="an existing trace instead of building one")
    parser.add_argument("--hta", action="store_true", help="also time HTA (slow on large traces)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rank-mb", type=float, default=50)
    parser.add_argument("--dask-ranks", type=int, default=64, help="0: skip the Dask run")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the paired cold measurement")
    parser.add_argument("--skip-others", action="store_true", help="readers: only tracekit summary and the floor")
    parser.add_argument("--skip-readers", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--startup", action="store_true", help="only the start-up measurements")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tracekit-bench-"))
    try:
        if args.startup:
            startup(args, work)
        elif not args.skip_readers:
            readers(args, work)
        if not args.skip_scale and not args.startup:
            ranks(args, work)
            if args.dask_ranks:
                dask(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"(benchmark took {time.perf_counter() - t0:.0f} s)")
