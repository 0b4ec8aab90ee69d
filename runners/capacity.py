"""`tracekit capacity`: the largest preset and batch each variant can train.

For each preset (in the order given) and batch (ascending), one `tracekit profile` run of the
variants still in the race (`OUT/<preset>-b<batch>/manifest.json`: 1 warm-up step, 2 timed,
none profiled). A variant that runs out of memory at a batch is not tried at larger batches of
that preset: an out-of-memory is capacity evidence, recorded like any other outcome.
`--memory-fraction` makes a smaller GPU of a large one. Under torchrun/srun every rank runs
every probe (each under a store prefix of its own) and knows every outcome; rank 0 writes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .launch import make_config, prepare_out, profile
from .manifest import MANIFEST, write_json_atomically

PROBE = {"warmup": 1, "steps": 2, "profile_steps": 0, "checkpoint": None}


def capacity(options: dict, presets: list[str], batches: list[int]) -> dict:
    """Run every probe; returns (and writes to OUT/capacity.json) {"probes": [{preset, batch,
    variant, status, message, peak_allocated_bytes, manifest}]}."""
    out = Path(options["out"])
    probes, stopped = [], set()
    for preset in presets:
        for batch in sorted(batches):
            variants = [v for v in options["variants"] if (v, preset) not in stopped]
            if not variants:
                break
            name = f"{preset}-b{batch}"
            if os.environ.get("RANK", "0") == "0":
                print(f"tracekit capacity: probe {name}: preset {preset}, batch {batch} per rank: {', '.join(variants)}",
                      file=sys.stderr, flush=True)
            cfg = make_config({**options, **PROBE, "out": str(out / name), "preset": preset, "variants": variants,
                               "global_batch": None, "overrides": {**options["overrides"], "batch": batch}})
            prepare_out(out / name, overwrite=True)
            manifest = profile(cfg)
            for variant, entry in manifest["variants"].items():
                peaks = [r["peak_allocated_bytes"] for r in entry.get("ranks", []) if r["peak_allocated_bytes"]]
                probes.append({"preset": preset, "batch": batch, "variant": variant, "status": entry["status"],
                               "message": entry.get("message", ""), "peak_allocated_bytes": max(peaks, default=None),
                               "manifest": f"{name}/{MANIFEST}"})
                if entry["status"] != "ok":
                    stopped.add((variant, preset))
    result = {"presets": presets, "batches": sorted(batches), "probes": probes}
    if os.environ.get("RANK", "0") == "0":
        write_json_atomically(out / "capacity.json", result)
    return result
